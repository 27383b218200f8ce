"""Checks of a finished Slurm chain, on what it left behind: the chain's events in order, every job on the
mix its move chose, and the final parameters against one process replaying the same batches.

Shared by tests/test_slurm_lifecycle.py (a chain moved by sbatch, by hand) and tests/test_demo.py (the
demo's submitit chain, moved where the auto-scaler chose).
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import torch

from hpc_jabas.core.planning import Plan
from hpc_jabas.core.planning.sampler import HeterogeneousSampler
from hpc_jabas.runtime.persist.checkpoint import load_latest
from hpc_jabas.slurm import chain as chainlog

ROOT = Path(__file__).resolve().parents[1]


def events(chain_dir) -> list[dict]:
    return chainlog.read(chain_dir)


def check_moves(chain_dir, first_mix: dict, by_hand: bool, epochs: int) -> list[str]:
    """The chain's jobs, in order: the first on ``first_mix``; each move's successor submitted by the job it
    leaves, started on the move's mix (its ranks' GPU types those of the mix), resumed at the move's epoch,
    with a restart record; every job but the last ended "moved", the last "finished" after ``epochs``
    epochs. One submit event per job (the first one's only when hpc-jabas submitted it). Returns the job ids."""
    ev = events(chain_dir)
    kinds = [e["event"] for e in ev]
    starts = [e for e in ev if e["event"] == "start"]
    moves = [e for e in ev if e["event"] == "move"]
    ends = [e for e in ev if e["event"] == "end"]
    assert moves and len(starts) == len(moves) + 1 and len(ends) == len(starts), kinds
    jobs = [str(s["job_id"]) for s in starts]
    assert len(set(jobs)) == len(jobs), jobs
    assert starts[0]["mix"] == first_mix and starts[0]["world"] == sum(first_mix.values()) and not starts[0]["resumed"]
    assert dict(Counter(starts[0]["gpu_types"])) == first_mix, starts[0]
    pos = {(e["event"], str(e.get("job_id") or e.get("from_job"))): i for i, e in enumerate(ev)}
    for k, (mv, src, dst) in enumerate(zip(moves, jobs, jobs[1:])):
        # the leaving job's end and its successor's start may come in either order
        leave = [("start", src), ("submit", dst), ("move", src), ("end", src)]
        if k == 0 and not by_hand:
            leave.insert(0, ("submit", src))
        for seq in (leave, [("move", src), ("start", dst), ("restart", dst), ("end", dst)]):
            idx = [pos.get(x) for x in seq]
            assert None not in idx and idx == sorted(idx), (seq, kinds)
        nxt = starts[k + 1]
        sub = next(e for e in ev if e["event"] == "submit" and str(e.get("job_id")) == dst)
        assert str(mv["from_job"]) == src and str(mv["to_job"]) == dst and sub["by"] == f"job {src}", (mv, sub)
        assert sub["mix"] == mv["mix"] == nxt["mix"], (sub, mv, nxt)
        assert nxt["resumed"] is True and nxt["epoch"] == mv["epoch"] >= 1, (mv, nxt)
        assert dict(Counter(nxt["gpu_types"])) == nxt["mix"] and nxt["world"] == len(nxt["gpu_types"]), nxt
        assert ends[k]["state"] == "moved" and ends[k]["epochs"] == mv["epoch"], ends[k]
        assert any(e["event"] == "restart" and str(e["job_id"]) == dst and e["overhead_s"] > 0 for e in ev)
    assert kinds.count("submit") == len(starts) - (1 if by_hand else 0), kinds
    assert ends[-1]["state"] == "finished" and ends[-1]["epochs"] == epochs, ends[-1]
    return jobs


def replay_reference(chain_dir, seed: int = 0, lr: float = 0.05) -> dict:
    """One process, plain SGD (momentum 0.9, ``lr`` x the recorded lr scale), over the B-sample batches that
    the sampler gives for each recorded iteration plan (tests/reference.py's replay), on
    examples/train_digits.py's task."""
    sys.path.insert(0, str(ROOT))
    from examples.train_digits import build
    recs = [json.loads(ln) for ln in (Path(chain_dir) / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    its = sorted((r for r in recs if r.get("type") == "iteration"), key=lambda r: r["it"])
    assert [r["it"] for r in its] == list(range(len(its))), "iteration records missing or repeated"
    epochs = 1 + max(r["epoch"] for r in its)
    task = build(lr=lr)
    model, opt, ds, loss_fn = task.model, task.optimizer, task.dataset, task.loss_fn
    base = [g["lr"] for g in opt.param_groups]
    assert base == [lr]
    X, y = ds.tensors
    sampler = HeterogeneousSampler(len(ds), seed=seed, tail="shrink")
    for r in its:
        plan = Plan.parse(r["plan"])
        if sampler.epoch_done(plan.B):
            sampler.new_epoch()
        assert sampler.epoch == r["epoch"], (r["it"], sampler.epoch, r["epoch"])
        ib = sampler.next(plan)
        idx = torch.as_tensor(ib.all_indices(), dtype=torch.long)
        assert len(idx) == r["samples"]
        opt.zero_grad()
        loss_fn(model(X[idx]), y[idx]).backward()
        for g, b in zip(opt.param_groups, base):
            g["lr"] = b * r["lr_scale"]
        opt.step()
    assert sampler.epoch == epochs - 1 and sampler.epoch_done()
    plans = {r["plan"] for r in its}
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "plans": plans,
            "Bs": [r["B"] for r in its]}


def check_parameters(chain_dir, worlds: set[int], b_changed: bool = True) -> None:
    """The final checkpoint's parameters equal the replay's (1e-5 relative); the plans span ``worlds`` rank
    counts (one per job of the chain) and, with ``b_changed``, the adaptive controller really changed B."""
    ref = replay_reference(chain_dir)
    if b_changed:
        assert len(set(ref["Bs"])) > 1, ref["Bs"]
    assert {Plan.parse(p).world_size for p in ref["plans"]} == worlds, ref["plans"]
    found = load_latest(Path(chain_dir) / "run" / "checkpoints")
    assert found is not None
    got = found[0]["model"]
    assert set(got) == set(ref["state"])
    for k, want in ref["state"].items():
        err = float((got[k].float() - want.float()).norm() / want.float().norm().clamp_min(1e-12))
        assert err <= 1e-5, f"{k}: relative difference {err:.3g} to the single-process reference"
