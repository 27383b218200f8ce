"""Goodput's measurements between decisions are read one iteration late (runtime/optim.py ``begin(defer=True)``,
``read_held``): the scalars' reduction is not waited for in its own iteration. The promise: nothing the run decides
changes. On 3 ranks, on the Horovod backend (the warm rank pool) and on the torch backend (Horovod unimportable),
a run with deferral and one without give the same decisions and bit-identical parameters; a run stopped right
after a deferred measurement, checkpointed and resumed, gives the same too (the checkpoint holds the policy with
that measurement taken)."""
import json
from pathlib import Path

import pytest
from mpi_util import run_ranks_cases

#: goodput measures every 2nd iteration (the odd ones) and decides every 6: the measurements of iterations 5, 11, 17,
#: ... are the decisions' own (read at once), the others lie between decisions (deferred)
GOODPUT = {"planner": "optimal", "micro_batch": 8, "policy": "noise-scale", "p": 6, "measure_every": 2,
           "batch_min": 24, "batch_max": 256}
STEPS, STOP = 30, 10          # the stop: after iteration 9, a deferred measurement


def spec(run_dir: Path, **kw) -> dict:
    return {"optimizer": "momentum", "lr": 0.05, "plan": "b=8 n=3,3,2", "steps": STEPS, "n": 2048,
            "checkpoint": False, "run_dir": str(run_dir), "gpu_types": ["v100", "p100", "rtx2060"],
            "metrics_period": 4, "config": GOODPUT, **kw}


def cases(base: Path, backend: str) -> list[dict]:
    cfg = dict(GOODPUT, backend=backend)
    return [spec(base / "defer", config=cfg), spec(base / "now", config=cfg, defer=False),
            spec(base / "split", config=cfg, checkpoint=True, stop_at=STOP),
            spec(base / "split", config=cfg, checkpoint=True, resume=True)]


def decisions(run_dir: Path) -> list[dict]:
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: r[k] for k in ("at_iteration", "B", "lr_scale", "reason")} | {"b_noise": r["stats"].get("b_noise")}
            for r in recs if r.get("type") == "decision" and r.get("kind") == "batch"]


def stats_by_iteration(run_dir: Path) -> dict[int, dict]:
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["it"]: r["stats"] for r in recs if r.get("type") == "iteration" and "stats" in r}


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_deferred_measurements_change_nothing_the_run_decides(tmp_path, backend):
    worker = "train_worker.py" if backend == "horovod" else "backend_worker.py"   # the latter: Horovod unimportable
    defer, now, first, second = run_ranks_cases(worker, cases(tmp_path, backend), np_=3, timeout=600)
    assert [r["backend"] for r in defer] == [backend] * 3
    # deferral happened where it should (measurements between decisions), and not where it was switched off
    assert defer[0]["deferred"] == [i for i in range(1, STEPS, 2) if (i + 1) % 6], defer[0]["deferred"]
    assert defer[0]["held"] == len(defer[0]["deferred"]) and now[0]["deferred"] == [] and now[0]["held"] == 0
    assert first[0]["deferred"][-1] == STOP - 1                  # the stop came right after a deferred one
    # the same decisions (B, lr, the reason with its noise scale, to the last digit) and the same parameters
    got, want = decisions(tmp_path / "defer"), decisions(tmp_path / "now")
    assert len(got) >= 4 and any(d["B"] != 24 for d in got), got
    assert got == want
    assert decisions(tmp_path / "split") == want
    for r in range(3):
        assert defer[r]["params"] == now[r]["params"] == second[r]["params"]
        assert defer[r]["history"] == now[r]["history"]
    # every measurement's statistics are in its own iteration's record, equal to the undeferred run's
    s_defer, s_now = stats_by_iteration(tmp_path / "defer"), stats_by_iteration(tmp_path / "now")
    assert sorted(s_defer) == sorted(s_now) and set(defer[0]["deferred"]) <= set(s_defer)
    assert s_defer == s_now
