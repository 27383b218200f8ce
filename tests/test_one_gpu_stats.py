"""A job on one GPU still adapts (issue: with one micro-batch per iteration no statistic was measured, so
goodput decided on nothing and similarity kept B, without a word). A measuring iteration whose whole plan is
one micro-batch runs it as two halves; the update stays that of one big batch."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from reference import make_data, make_model, reference_run

from hpc_jabas.core.planning.sampler import split_single_micro


@given(n=st.integers(1, 300), min_half=st.integers(1, 64), others=st.integers(0, 2))
def test_split_single_micro_halves_the_only_micro_batch(n, min_half, others):
    idx = np.arange(n, dtype=np.int64) * 3 + 1
    micro = [(idx,)] + [(np.arange(2, dtype=np.int64),)] * others
    mine, halves = split_single_micro(micro, 0, (idx,), (0,), min_half)
    if others or n // 2 < min_half:                 # another micro-batch exists, or the halves would be too small
        assert len(mine) == 1 and halves == (0,) and np.array_equal(mine[0], idx)
        return
    assert halves == (0, 1) and len(mine) == 2
    assert abs(len(mine[0]) - len(mine[1])) <= 1 and min(len(mine[0]), len(mine[1])) >= min_half
    assert np.array_equal(np.concatenate(mine), idx)    # the same samples, in order


def test_a_rank_without_micro_batches_is_left_alone():
    micro = [(np.arange(8, dtype=np.int64),), ()]
    assert split_single_micro(micro, 1, (), (), 1) == ((), ())


@pytest.mark.parametrize("policy", ["noise-scale", "similarity"])
def test_one_gpu_measures_both_statistics_and_matches_one_big_batch(tmp_path, policy):
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer

    n, B, lr = 240, 16, 0.05
    ds = make_data(n)
    model = make_model()
    cfg = JobConfig(policy=policy, batch=B, batch_min=8, batch_max=64, epochs=3, checkpoint=False, p=4,
                    lr_rule="none", run_dir=str(tmp_path / "run"))
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=lr), ds, torch.nn.CrossEntropyLoss(), config=cfg,
                 world=World(rank=0, size=1, gpu_types=("rtx2060",)))
    tr.fit()
    recs = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    its = [r for r in recs if r["type"] == "iteration"]
    measured = [r for r in its if "stats" in r]
    decisions = [r for r in recs if r["type"] == "decision"]
    assert len(measured) >= 5 and len(decisions) >= 5
    for r in measured:                       # one micro-batch planned (b = B on one GPU), two halves measured
        assert r["plan"].endswith("n=1") and r["n_local"] == [2]
        s = r["stats"]
        assert s["M"] == 2 and sum(s["half_samples"]) == r["B"] and min(s["half_samples"]) >= r["B"] // 2
        assert s["S"] > s["b"]
        # goodput's measurements are noise-only (no half-batch sum): the similarity is the other policy's
        assert math.isfinite(s["similarity"]) if policy == "similarity" else s["similarity"] is None
    if policy == "noise-scale":       # every decision had a fresh noise scale, and decided on it after warm-up
        assert sum(bool(d["stats"]["fresh"]) for d in decisions) == len(decisions)
        assert all("B_noise=" in d["reason"] or "unresolved" in d["reason"] for d in decisions[3:])
    else:
        assert len({r["B"] for r in its}) >= 2, "B never moved"
    # the halves change nothing in the update: the same trajectory in one process, one big batch each step
    ref = reference_run({"optimizer": "sgd", "lr": lr, "plan": its[0]["plan"], "steps": len(its), "n": n,
                         "schedule": {str(r["it"]): r["plan"] for r in its}})
    got = tr.model.state_dict()
    worst = max(float((got[k] - ref[k]).abs().max()) for k in ref)
    assert worst < 1e-9, worst


def test_measured_statistics_equal_a_per_sample_computation_by_hand(tmp_path):
    """The trainer's similarity, |g|^2 and micro-batch |g_m|^2 at a measured iteration, against per-sample
    gradients taken one sample at a time with autograd (an independent reference for runtime/gradstats.py)."""
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.planning import Plan
    from hpc_jabas.core.planning.sampler import HeterogeneousSampler
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer

    n, B = 32, 16
    ds = make_data(n)
    cfg = JobConfig(policy="similarity", batch=B, batch_min=8, batch_max=64, epochs=1, checkpoint=False, p=1,
                    lr_rule="none", run_dir=str(tmp_path / "run"))
    trained = make_model()
    tr = Trainer(trained, torch.optim.SGD(trained.parameters(), lr=0.05), ds, torch.nn.CrossEntropyLoss(),
                 config=cfg, world=World(rank=0, size=1, gpu_types=("v100",)))
    tr.fit()
    recs = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in recs if r["type"] == "iteration" and r["it"] == 0)
    got = first["stats"]
    # the same samples, from a fresh sampler and the initial weights
    idx = HeterogeneousSampler(n, seed=cfg.seed, tail=cfg.tail).next(Plan.parse(first["plan"])).all_indices()
    model = make_model()
    X, y = ds.tensors
    per_sample = []
    for i in idx:
        loss = torch.nn.functional.cross_entropy(model(X[i:i + 1]), y[i:i + 1])
        per_sample.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))]))
    G = torch.stack(per_sample)
    h0, h1 = G[: B // 2].mean(0), G[B // 2:].mean(0)
    cos = float(h0 @ h1 / (h0.norm() * h1.norm()))
    assert got["half_samples"] == [B // 2, B // 2]
    assert got["similarity"] == pytest.approx(cos, rel=1e-9, abs=1e-12)
    assert got["sq_global"] == pytest.approx(float(G.mean(0).pow(2).sum()), rel=1e-9)
    assert got["sq_micro"] == pytest.approx(float((h0.pow(2).sum() + h1.pow(2).sum()) / 2), rel=1e-9)
