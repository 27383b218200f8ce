"""The gradient statistics of a measuring iteration on an uneven plan, on 3 real ranks and both backends, against
per-sample gradients taken one sample at a time with autograd (an independent reference).

The plan gives every rank its own micro-batch size and a partial last micro-batch (sizes 5,4 | 3,3,1 | 4: B = 20,
M = 6 micro-batches). With g_j the mean gradient of micro-batch j (b_j samples) and g the mean over all B:

    T = sum_j (b_j / B) |g_j|^2,    E[T] = |G|^2 + M tr(Sigma) / B,    E|g|^2 = |G|^2 + tr(Sigma) / B

so tr(Sigma) = (T - |g|^2) B / (M - 1) and |G|^2 = (M |g|^2 - T) / (M - 1) with no assumption of equal sizes (the
trainer records T as ``sq_micro`` at the effective size b = B / M; stats.noise_scale_terms pairs it with |g|^2).
tests/test_mixed_statistics.py checks the unbiasedness by sampling; here the recorded numbers themselves.
"""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi_util import run_ranks_cases
from reference import make_data, make_model

from hpc_jabas.core.adaptive.stats import noise_scale_terms
from hpc_jabas.core.planning import Plan, half_split
from hpc_jabas.core.planning.sampler import HeterogeneousSampler

PLAN = "b=5,3,4 n=2,3,1 x=9,7,4"
N = 240


def _spec(run_dir: Path, backend: str) -> dict:
    return {"optimizer": "momentum", "lr": 0.05, "plan": PLAN, "steps": 1, "n": N, "checkpoint": False,
            "run_dir": str(run_dir), "metrics_period": 1, "shutdown": True,
            "measure": True, "config": {"backend": backend}}


def _per_sample() -> tuple[list[list[torch.Tensor]], list[list[int]]]:
    """Per micro-batch (rank order, then micro-batch order): the per-sample gradients at the initial weights."""
    idx = HeterogeneousSampler(N, seed=0, tail="shrink").next(Plan.parse(PLAN)).micro
    X, y = make_data(N).tensors
    model = make_model()
    out = []
    for rank in idx:
        for m in rank:
            grads = []
            for i in m:
                loss = torch.nn.functional.cross_entropy(model(X[i:i + 1]), y[i:i + 1])
                grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))]))
            out.append(torch.stack(grads))
    return out, [[len(m) for m in rank] for rank in idx]


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_uneven_plan_statistics_equal_the_per_sample_reference(tmp_path, backend):
    run = tmp_path / "run"
    res = run_ranks_cases("train_worker.py", [_spec(run, backend)], np_=3, timeout=300)[0]
    assert [r["backend"] for r in res] == [backend] * 3
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    st = next(r for r in recs if r["type"] == "iteration" and r["it"] == 0)["stats"]

    micro, sizes = _per_sample()
    assert sizes == [[5, 4], [3, 3, 1], [4]]
    B, M = 20, 6
    allg = torch.cat(micro)
    g = allg.mean(0)
    T = sum(float(m.shape[0]) / B * float(m.mean(0).pow(2).sum()) for m in micro)
    assert (st["S"], st["M"]) == (B, M)
    assert st["b"] == pytest.approx(B / M, rel=1e-12)
    assert st["sq_global"] == pytest.approx(float(g.pow(2).sum()), rel=1e-9)
    assert st["sq_micro"] == pytest.approx(T, rel=1e-9)

    # the closed form and the estimator's agree, and tr(Sigma) is of the size the samples show
    g2, s = noise_scale_terms(st["b"], st["sq_micro"], st["S"], st["sq_global"])
    tr_ref = (T - float(g.pow(2).sum())) * B / (M - 1)
    assert s == pytest.approx(tr_ref, rel=1e-8)
    assert g2 == pytest.approx((M * float(g.pow(2).sum()) - T) / (M - 1), rel=1e-8, abs=1e-12)
    sample_tr = float(allg.var(0, unbiased=True).sum())          # per-sample covariance trace of these 20 samples
    assert 0.05 * sample_tr < s < 20 * sample_tr, (s, sample_tr)

    # the similarity: the cosine of the two halves' gradient sums (halves of nearly equal sample counts)
    labels = [lab for rank in half_split(Plan.parse(PLAN)) for lab in rank]
    h = [sum((m.sum(0) for m, lab in zip(micro, labels) if lab == k), torch.zeros_like(g)) for k in (0, 1)]
    assert sorted(st["half_samples"]) == sorted(int(sum(m.shape[0] for m, lab in zip(micro, labels) if lab == k))
                                                for k in (0, 1))
    cos = float(h[0] @ h[1] / (h[0].norm() * h[1].norm()))
    assert st["similarity"] == pytest.approx(cos, rel=1e-9, abs=1e-12)
    assert np.isfinite(cos)
