"""Numbers that make no sense stop the run; DataLoader workers do not die of the job's stop signals.

- a non-finite loss is agreed at the safe point's one allreduce (no extra host sync) and stops every rank with
  one line (NonFiniteError) without checkpointing: the last finite checkpoint stays; non-finite weights are
  never checkpointed; an fp16 step the loss scaler skipped is not an error; metrics.jsonl stays strict JSON.
- a Trainer's DataLoader workers ignore TERM/INT/USR1/USR2 (the user's worker_init_fn still runs); a worker
  that dies after a stop signal is handled at the safe point (checkpoint, stop as a preemption); the stop
  checkpoint of a loader-fed run resumes exactly.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi_util import ROOT, WORKERS, run_script

from hpc_jabas.runtime.metrics import MetricsWriter, json_safe
from hpc_jabas.runtime.persist import checkpoint as ckpt
from hpc_jabas.runtime.safepoint import agree

BASE = {"plan": "b=8 n=2", "n": 64, "optimizer": "adam", "lr": 0.01}      # B=16: 4 iterations per epoch


def _run(spec: dict, tmp_path: Path, name: str = "out") -> dict:
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    sp = out / "spec.json"
    sp.write_text(json.dumps(dict(spec, out_dir=str(out))))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = run_script([str(WORKERS / "guard_worker.py"), str(sp)], env=env, cwd=str(ROOT), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "rank0.json").read_text())
    res["stderr"] = r.stderr
    return res


def _strict_records(path: Path) -> list[dict]:
    def no_constant(c):
        raise AssertionError(f"bare {c} in {path}")
    return [json.loads(ln, parse_constant=no_constant) for ln in path.read_text().splitlines()]


def _same_params(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(np.array(a[k]), np.array(b[k])), k


# ---- units ------------------------------------------------------------------------------------------
def test_nonfinite_rides_in_the_safe_point_allreduce():
    sent = []

    def two_ranks(t, name):            # the other rank saw a non-finite loss
        sent.append(t.tolist())
        return t + torch.tensor([0, 0, 0, 0, 0, 1, 0, 1], dtype=t.dtype)
    a = agree(0, False, False, rank=0, allreduce=two_ranks)
    assert a.nonfinite == 1 and not a.stop and len(sent) == 1 and sent[0][5] == 0.0
    assert agree(0, False, False, 0, allreduce=lambda t, n: t, nonfinite=True).nonfinite == 1
    assert agree(0, False, False, 0, allreduce=lambda t, n: t).nonfinite == 0


def test_metrics_jsonl_has_no_bare_nan_or_infinity(tmp_path):
    w = MetricsWriter(tmp_path / "m.jsonl")
    w.write({"loss": float("nan"), "x": [1.0, float("inf"), -float("inf")], "t": torch.tensor(2.5),
             "n": np.float64("nan"), "nested": {"a": (float("nan"), 3)}, "s": "NaN", "ok": 1})
    w.close()
    (rec,) = _strict_records(tmp_path / "m.jsonl")
    assert rec == {"loss": None, "x": [1.0, None, None], "t": 2.5, "n": None, "nested": {"a": [None, 3]},
                   "s": "NaN", "ok": 1}
    assert json_safe(math.pi) == math.pi


# ---- a Trainer in one process -----------------------------------------------------------------------
def test_nan_loss_stops_with_one_line_and_keeps_the_last_finite_checkpoint(tmp_path):
    run = str(tmp_path / "run")
    first = _run(dict(BASE, steps=4, run_dir=run, checkpoint_every=2), tmp_path, "a")
    assert first["error"] is None
    cks = ckpt.list_checkpoints(Path(run) / "checkpoints")
    assert [p.name for p in cks] == [ckpt.name_for(0, 2)]
    # resumed at 2; the epoch ends after iteration 3 (checkpoint 1-4); the weights turn NaN after iteration 4's
    # step, so iteration 5's loss is NaN: stopped there, checkpoint 1-4 is the last one
    bad = _run(dict(BASE, steps=10, run_dir=run, resume=True, poison_at=4), tmp_path, "b")
    cls, msg = bad["error"]
    assert cls == "NonFiniteError" and "\n" not in msg, bad
    after = ckpt.list_checkpoints(Path(run) / "checkpoints")
    assert [p.name for p in after] == [ckpt.name_for(0, 2), ckpt.name_for(1, 4)]
    assert "the loss of iteration 5 is not a finite number" in msg and str(after[-1]) in msg, msg
    assert all(torch.isfinite(v).all() for v in ckpt.load(after[-1])["model"].values())
    recs = _strict_records(Path(run) / "metrics.jsonl")
    its = {r["it"]: r for r in recs if r["type"] == "iteration"}
    assert its[5]["loss"] is None and math.isfinite(its[4]["loss"])
    # weights poisoned at an epoch's last iteration: the epoch-end checkpoint refuses them
    run2 = str(tmp_path / "run2")
    res = _run(dict(BASE, steps=10, run_dir=run2, poison_at=3), tmp_path, "c")
    assert res["error"][0] == "NonFiniteError" and "weights after iteration 3" in res["error"][1], res
    assert ckpt.list_checkpoints(Path(run2) / "checkpoints") == []
    assert [r for r in recs if r["type"] == "nonfinite_stop"][0]["it"] == 5


def test_nan_weights_are_never_checkpointed(tmp_path):
    run = tmp_path / "run"
    res = _run(dict(BASE, optimizer="sgd", lr="nan", steps=6, run_dir=str(run), checkpoint_every=1), tmp_path)
    cls, msg = res["error"]
    assert cls == "NonFiniteError" and "weights after iteration 0 are not finite" in msg, msg
    assert "no checkpoint was written" in msg and ckpt.list_checkpoints(run / "checkpoints") == []
    _strict_records(run / "metrics.jsonl")


@pytest.mark.parametrize("amp", ["off", "fp16"])
def test_an_fp16_step_the_scaler_skips_is_not_an_error(tmp_path, amp):
    res = _run(dict(BASE, steps=4, run_dir=str(tmp_path / "run"), amp=amp, inf_loss_at=1), tmp_path)
    if amp == "fp16":
        assert res["error"] is None and res["iterations"] == 4 and res["skipped"] == [1], res
    else:
        assert res["error"][0] == "NonFiniteError" and "iteration 1" in res["error"][1], res


# ---- DataLoader workers and the job's stop signals ----------------------------------------------------
LOADER = dict(BASE, plan="b=4 n=4", num_workers=2, prefetch_factor=1)      # 4 micro-batches an iteration


@pytest.fixture(scope="module")
def loader_reference(tmp_path_factory) -> dict:
    """The uninterrupted loader-fed run (one process, 8 iterations): what every stopped and resumed run ends at."""
    tmp = tmp_path_factory.mktemp("loader-ref")
    return _run(dict(LOADER, steps=8, run_dir=str(tmp / "ref")), tmp, "ref")


def test_quiet_worker_init_ignores_the_stop_signals_and_chains_the_users(tmp_path):
    import signal

    from hpc_jabas.runtime.data import WORKER_IGNORED, QuietWorkerInit
    seen = []
    old = {s: signal.getsignal(s) for s in WORKER_IGNORED}
    try:
        QuietWorkerInit(seen.append)(3)
        assert seen == [3] and all(signal.getsignal(s) == signal.SIG_IGN for s in WORKER_IGNORED)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    import pickle
    assert pickle.loads(pickle.dumps(QuietWorkerInit(None))).user_fn is None       # spawned workers get it


@pytest.mark.parametrize("case", [
    {"it": 2, "to": "both"},                                           # TERM to the process group, at a boundary
    {"it": 1, "to": "both", "where": "forward", "kill_workers": "all"},   # mid-iteration, then the workers die
])
def test_stop_signal_with_loader_workers_checkpoints_and_resumes_exactly(tmp_path, case, loader_reference):
    run = str(tmp_path / "run")
    first = _run(dict(LOADER, steps=8, run_dir=run, signal_at=case), tmp_path, "a")
    assert first["error"] is None, first
    assert len(first["worker_pids"]) == 2                              # the user's worker_init_fn ran in each
    assert first["alive_after_signal"] == [True, True]                 # TERM did not kill a worker
    # the agreement travels during the next iteration (safepoint.SafePoints): a signal after iteration it-1 (at its
    # step's end) stops every rank after iteration it; one inside iteration it, after it+1 (no epoch end between)
    stop_it = case["it"] + 1 if case.get("where") != "forward" else case["it"] + 2
    assert first["stopped"]["signal"] == "TERM" and first["iterations"] == stop_it, first
    assert Path(first["stopped"]["checkpoint"]).name == ckpt.name_for(0, stop_it)
    if case.get("kill_workers"):
        assert "a DataLoader worker died after the stop signal" in first["stderr"]
    second = _run(dict(LOADER, steps=8, run_dir=run, resume=True), tmp_path, "b")
    assert second["error"] is None and second["resumed_from"] and second["iterations"] == 8
    _same_params(second["params"], loader_reference["params"])


def test_a_dead_worker_without_a_stop_signal_is_still_an_error(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    spec = dict(LOADER, steps=8, run_dir=str(tmp_path / "run"), out_dir=str(out),
                signal_at={"it": 1, "to": "none", "where": "forward", "kill_workers": "all"})
    (out / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = run_script([str(WORKERS / "guard_worker.py"), str(out / "spec.json")], env=env, cwd=str(ROOT), timeout=240)
    # PyTorch's error (raised from its SIGCHLD handler wherever the training thread is: the traceback may be
    # garbled) ends the run: it is not turned into a stop
    assert r.returncode != 0 and not (out / "rank0.json").exists(), r.stderr[-2000:]
    assert "stopping at the safe point" not in r.stderr


@pytest.mark.mpi
def test_a_nan_on_one_rank_stops_every_rank_at_the_same_iteration(tmp_path):
    from mpi_util import run_ranks
    res = run_ranks("guard_worker.py", dict(BASE, plan="b=8 n=1,1", steps=6, run_dir=str(tmp_path / "run"),
                                            inf_loss_at=2, inf_rank=1), np_=2)
    for r in res:
        cls, msg = r["error"]
        assert cls == "NonFiniteError" and "the loss of iteration 2 is not a finite number on 1 of 2 rank(s)" in msg
