"""Gradient statistics with per-rank micro-batch sizes: the halves of the similarity statistic and
the noise-scale measurement at b_small = S/M (runtime/optim.py's docstring)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from test_sampler import per_rank_plans

from hpc_jabas.core.adaptive.stats import noise_scale_terms
from hpc_jabas.core.planning import Plan, half_split


def test_identical_b_halves_are_the_global_parity():
    h = half_split(Plan(4, (1, 3, 4)))
    assert h == ((0,), (1, 0, 1), (0, 1, 0, 1))


@settings(max_examples=200, deadline=None)
@given(per_rank_plans())
def test_per_rank_halves_have_nearly_equal_sample_counts(plan):
    h = half_split(plan)
    assert [len(r) for r in h] == list(plan.n)
    load = [0, 0]
    sizes = []
    for i, labels in enumerate(h):
        for lab, size in zip(labels, plan.micro_sizes(i)):
            load[lab] += size
            sizes.append(size)
    assert sum(load) == plan.B
    assert abs(load[0] - load[1]) <= max(sizes)                  # greedy: within one micro-batch
    if len(sizes) >= 2:
        assert min(load) > 0                                     # both halves measured


def test_noise_scale_is_unbiased_with_mixed_micro_batch_sizes():
    """E[sum_j b_j |g_j|^2 / S] = |G|^2 + tr(Sigma) M / S: paired with |g|^2 at S it recovers both."""
    rng = np.random.default_rng(0)
    d, sizes, trials = 6, [13, 5, 1, 7, 2], 20000
    G = rng.normal(size=d)
    scale = rng.uniform(0.5, 2.0, size=d)                        # Sigma = diag(scale^2)
    S, M = sum(sizes), len(sizes)
    per_sample = G + scale * rng.normal(size=(trials, S, d))
    cuts = np.cumsum([0] + sizes)
    means = np.stack([per_sample[:, a:b].mean(axis=1) for a, b in zip(cuts, cuts[1:])], axis=1)
    sq_w = (np.array(sizes)[None, :] * (means ** 2).sum(axis=2)).sum(axis=1) / S
    sq_g = (per_sample.mean(axis=1) ** 2).sum(axis=1)
    g2, tr = noise_scale_terms(S / M, float(sq_w.mean()), S, float(sq_g.mean()))
    assert abs(g2 - G @ G) < 0.03 * (G @ G) + 0.05
    assert abs(tr - (scale ** 2).sum()) < 0.03 * (scale ** 2).sum()
    # the unweighted mean of |g_j|^2 paired with S/M would be biased here (harmonic vs arithmetic size)
    g2u, tru = noise_scale_terms(S / M, float((means ** 2).sum(axis=2).mean()), S, float(sq_g.mean()))
    assert abs(tru - (scale ** 2).sum()) > 0.2 * (scale ** 2).sum()
