"""Adaptive batching that delivers, on 3 Horovod ranks (emulated v100 + p100 + rtx2060 on CPU).

One mpirun runs three scenarios (tests/workers/adaptive_worker.py):
- similarity policy with JABAS's defaults (gamma = 0.1, alpha = 0.1, optimal planner) except p = 5:
  pure-noise labels drive B up to B_max within the number of decisions the rule needs, noiseless
  labels drive it down to B_min, and every decision moves B the way its similarity asked;
- the similarity and noise-scale inputs the optimizer measures, checked against a one-process
  reference computed on the same micro-batches with the same parameters.
"""
import json

import numpy as np
import pytest
import torch
from mpi_util import run_ranks
from reference import make_data, make_model
from torch import nn

from hpc_jabas.core.adaptive.policy import PolicyState, SimilarityPolicy
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.perf.perfmodel import job_perf_model
from hpc_jabas.core.planning import Plan, job_batch_space
from hpc_jabas.core.planning.sampler import HeterogeneousSampler

GPUS = ["v100", "p100", "rtx2060"]
SIM = {"gpu_types": GPUS, "emulate": True, "policy": "similarity", "p": 5, "batch": 64,
       "batch_min": 16, "batch_max": 256}
REF = {"gpu_types": GPUS, "emulate": True, "policy": "similarity", "p": 1, "gamma": 0.5, "batch": 28,
       "micro_batch": 4, "batch_min": 16, "batch_max": 64}
REF_STEPS, REF_LR = 6, 0.1


def _space():
    cfg = JobConfig(**SIM).validate()
    # the worker's model has no BatchNorm and micro_batch is unset: the trainer plans per-rank sizes
    return job_batch_space(cfg, GPUS, job_perf_model(cfg, GPUS), per_rank=True)


def _path(direction):
    """B after each decision of the policy (JABAS defaults, its unrounded target), from 64, until it
    cannot move."""
    space, B = _space(), 64
    pol = SimilarityPolicy(B_min=16, B_max=256)
    path = [B]
    while True:
        d = pol.decide(PolicyState(B=B, similarity=0.0 if direction == "grow" else 0.9), space)
        if not d.moved:
            return path
        B = d.B
        path.append(B)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adaptive")
    scen = [
        {"name": "noise", "data": "noise", "n": 30000, "lr": 0.05, "steps": 5 * (len(_path("grow")) + 5),
         "config": SIM},
        {"name": "clean", "data": "clean", "n": 8000, "lr": 0.01, "steps": 5 * (len(_path("shrink")) + 4),
         "config": SIM},
        {"name": "reference", "data": "reference", "n": 600, "lr": REF_LR, "steps": REF_STEPS, "config": REF},
        {"name": "noise-only", "data": "reference", "n": 600, "lr": REF_LR, "steps": 4,
         "config": {**REF, "policy": "noise-scale", "p": 2, "measure_every": 1}},
    ]
    for s in scen:
        s["run_dir"] = str(root / s["name"])
    res = run_ranks("adaptive_worker.py", {"scenarios": scen}, np_=3, timeout=600)
    out = {}
    for s in scen:
        recs = [json.loads(ln) for ln in (root / s["name"] / "metrics.jsonl").read_text().splitlines()]
        out[s["name"]] = {"recs": recs, "hist": [r["scenarios"][s["name"]]["history"] for r in res]}
    return out


def _decisions(run):
    ds = sorted((r for r in run["recs"] if r["type"] == "decision"), key=lambda r: r["at_iteration"])
    assert ds, "no decision was recorded"
    return ds


def _check_directions(run, top, bottom):
    """Every decision moved B the way its similarity asked (or B was at the edge already)."""
    hist = run["hist"][0]
    for h in run["hist"][1:]:
        assert h == hist                                   # same B, plan and lr on every rank
    B_at = {h["it"]: h["B"] for h in hist}
    asked = {"grow": 0, "shrink": 0}
    for d in _decisions(run):
        sim = d["stats"]["similarity"]
        before = B_at[d["at_iteration"] - 1]
        assert d["stats"]["B_before"] == before
        if d["at_iteration"] in B_at:
            assert B_at[d["at_iteration"]] == d["B"]       # applied at the announced iteration
        if sim < 0.1:
            asked["grow"] += 1
            assert d["B"] > before or before == top, d
        elif sim > 0.1:
            asked["shrink"] += 1
            assert d["B"] < before or before == bottom, d
        else:
            assert d["B"] == before
        if d["B"] == before:
            assert "could not" in d["reason"] or sim == 0.1
    return asked


def test_pure_noise_drives_B_to_B_max(runs):
    path = _path("grow")
    top = path[-1]
    assert top == 256
    run = runs["noise"]
    asked = _check_directions(run, top, 16)
    ds = _decisions(run)
    Bs = [d["B"] for d in ds]
    assert top in Bs, f"B never reached B_max: {Bs}"
    first = Bs.index(top) + 1
    shrinks = sum(1 for d in ds[:first] if d["stats"]["similarity"] > 0.1)
    assert first <= (len(path) - 1) + 2 * shrinks, (first, Bs)
    assert asked["grow"] >= 0.9 * len(ds)
    sims = [d["stats"]["similarity"] for d in ds]
    assert float(np.mean(sims)) < 0.05


def test_noiseless_labels_drive_B_to_B_min(runs):
    path = _path("shrink")
    bottom = path[-1]
    assert bottom == 16
    run = runs["clean"]
    asked = _check_directions(run, 256, bottom)
    ds = _decisions(run)
    Bs = [d["B"] for d in ds]
    assert bottom in Bs, f"B never reached B_min: {Bs}"
    first = Bs.index(bottom) + 1
    grows = sum(1 for d in ds[:first] if d["stats"]["similarity"] < 0.1)
    assert first <= (len(path) - 1) + 2 * grows, (first, Bs)
    assert asked["shrink"] >= 0.9 * len(ds)


def test_measured_statistics_match_a_one_process_reference(runs):
    run = runs["reference"]
    hist = run["hist"][0]
    stats = {r["it"]: r["stats"] for r in run["recs"] if r["type"] == "iteration" and "stats" in r}
    assert sorted(stats) == list(range(REF_STEPS))
    ds = make_data(600)
    X, y = ds.tensors
    model = make_model()
    loss_fn = nn.CrossEntropyLoss()
    sampler = HeterogeneousSampler(len(ds), seed=0)
    params = [p for p in model.parameters()]
    odd_M = 0
    for h in hist:
        plan = Plan.parse(h["plan"])
        ib = sampler.next(plan)
        grads = []                                          # per micro-batch mean gradient, global order
        for rank_mbs in ib.micro:
            for idx in rank_mbs:
                i = torch.as_tensor(idx, dtype=torch.long)
                g = torch.autograd.grad(loss_fn(model(X[i]), y[i]), params)
                grads.append((len(idx), torch.cat([t.reshape(-1) for t in g])))
        M = len(grads)
        odd_M += M % 2
        even = sum(c * g for j, (c, g) in enumerate(grads) if j % 2 == 0)
        odd = sum(c * g for j, (c, g) in enumerate(grads) if j % 2 == 1)
        total = sum(c for c, _ in grads)
        g_all = (even + odd) / total
        want = {"similarity": float(even @ odd / (even.norm() * odd.norm())),
                "sq_micro": float(np.mean([float(g @ g) for _, g in grads])),
                "sq_global": float(g_all @ g_all), "b": plan.b, "S": total, "M": M}
        got = stats[h["it"]]
        for k in ("b", "S", "M"):
            assert got[k] == want[k], (h["it"], k)
        for k in ("similarity", "sq_micro", "sq_global"):
            assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), (h["it"], k)
        # one SGD step on the big-batch mean gradient, the lr scale of this iteration
        with torch.no_grad():
            off = 0
            for p in params:
                p -= REF_LR * h["lr_scale"] * g_all[off:off + p.numel()].view_as(p)
                off += p.numel()
    assert odd_M >= 1                                       # an odd M (unequal halves) was checked
    # the noise-scale inputs the controller fed its estimator: its decisions report the EMA of them
    from hpc_jabas.core.adaptive.stats import NoiseScale
    ns = NoiseScale()
    for it in sorted(stats):
        s = stats[it]
        ns.update(s["b"], s["sq_micro"], s["S"], s["sq_global"])
    last = _decisions(run)[-1]
    assert last["stats"]["G2"] == pytest.approx(ns.G2, rel=1e-12)
    assert last["stats"]["S_trace"] == pytest.approx(ns.S, rel=1e-12)


def test_noise_only_measurements_on_three_ranks(runs):
    """Goodput with measure_every = 1 (p = 2): every iteration measures without the half-batch sum; at
    iteration 0 (the reference scenario's weights, samples and plan) its micro-batch and global norms equal the
    full measurement's; each decision has every measurement so far (two per decision)."""
    ref = {r["it"]: r["stats"] for r in runs["reference"]["recs"] if r["type"] == "iteration" and "stats" in r}
    run = runs["noise-only"]
    stats = {r["it"]: r["stats"] for r in run["recs"] if r["type"] == "iteration" and "stats" in r}
    assert sorted(stats) == [0, 1, 2, 3] and all(s["similarity"] is None for s in stats.values())
    for k in ("b", "S", "M", "half_samples"):
        assert stats[0][k] == ref[0][k], k
    for k in ("sq_micro", "sq_global"):
        assert stats[0][k] == pytest.approx(ref[0][k], rel=1e-12), k
    assert [d["stats"]["measurements"] for d in _decisions(run)] == [2, 4]
