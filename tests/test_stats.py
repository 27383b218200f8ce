"""Estimators of hpc_jabas.core.adaptive.stats checked against closed-form truths on linear regression.

Model: x ~ N(0, I_D), y = x.w* + eps, eps ~ N(0, s^2), loss 0.5*(x.w - y)^2.
At a point w, with d = w - w*, the per-sample gradient is g = x (x.d - eps), so
    G = E[g] = E[x x^T] d = d                               -> |G|^2 = |d|^2
    E[g g^T] = E[x x^T (x.d)^2] + s^2 I = |d|^2 I + 2 d d^T + s^2 I   (Isserlis)
    tr(Sigma) = E|g|^2 - |G|^2 = (D + 2)|d|^2 + D s^2 - |d|^2 = (D + 1)|d|^2 + D s^2
"""
import math

import numpy as np
import pytest

from hpc_jabas.core.adaptive.stats import EMA, NoiseScale, noise_scale_terms
from hpc_jabas.errors import ConfigError

D = 10
SIGMA = 1.0


def truth(d, s=SIGMA):
    dd = float(d @ d)
    return dd, (len(d) + 1) * dd + len(d) * s * s


def micro_grads(rng, d, b, m, s=SIGMA):
    """Mean gradients of m micro-batches of b samples each, shape (m, D)."""
    x = rng.standard_normal((m, b, len(d)))
    eps = s * rng.standard_normal((m, b))
    r = x @ d - eps                      # (m, b) residuals
    return np.einsum("mb,mbd->md", r, x) / b


def one_estimate(rng, d, b, m):
    gm = micro_grads(rng, d, b, m)
    sq_small = float(np.mean(np.sum(gm * gm, axis=1)))
    g = gm.mean(axis=0)
    return noise_scale_terms(b, sq_small, b * m, float(g @ g))


def direction(seed=123):
    d = np.random.default_rng(seed).standard_normal(D)
    return d / np.linalg.norm(d)        # |G|^2 = 1, tr(Sigma) = 21


def test_closed_form_truth_matches_monte_carlo():
    # sanity of the derivation itself: E|g|^2 - |G|^2 from many single-sample gradients
    d = direction()
    g2, s = truth(d)
    rng = np.random.default_rng(0)
    g = micro_grads(rng, d, 1, 400_000)
    assert np.allclose(g.mean(axis=0), d, atol=0.03)
    assert abs(float(np.mean(np.sum(g * g, axis=1))) - g2 - s) / s < 0.02


@pytest.mark.parametrize("b,m", [(8, 16), (4, 4), (32, 8)])
def test_noise_scale_terms_unbiased(b, m):
    d = direction()
    g2_true, s_true = truth(d)
    est = np.array([one_estimate(np.random.default_rng(seed), d, b, m) for seed in range(2000)])
    g2, s = est.mean(axis=0)
    assert abs(g2 - g2_true) / g2_true < 0.10, (g2, g2_true)
    assert abs(s - s_true) / s_true < 0.10, (s, s_true)


def test_noise_scale_terms_other_point():
    d = 3.0 * direction(7)              # |G|^2 = 9, tr(Sigma) = 99 + 10 = 109
    g2_true, s_true = truth(d)
    est = np.array([one_estimate(np.random.default_rng(1000 + k), d, 16, 8) for k in range(400)])
    g2, s = est.mean(axis=0)
    assert abs(g2 - g2_true) / g2_true < 0.10
    assert abs(s - s_true) / s_true < 0.10


def test_noise_scale_terms_exact_algebra():
    # E|g_b|^2 = G2 + S/b holds exactly for these inputs, so the estimators return (G2, S)
    G2, S = 2.0, 50.0
    g2, s = noise_scale_terms(5, G2 + S / 5, 40, G2 + S / 40)
    assert g2 == pytest.approx(G2) and s == pytest.approx(S)


@pytest.mark.parametrize("args", [(8, 1.0, 8, 1.0), (16, 1.0, 8, 1.0), (0, 1.0, 8, 1.0), (-1, 1, 8, 1)])
def test_noise_scale_terms_rejects_bad_sizes(args):
    with pytest.raises(ConfigError) as e:
        noise_scale_terms(*args)
    assert "\n" not in str(e.value)


def test_noise_scale_tracker_converges():
    d = direction()
    g2_true, s_true = truth(d)
    ns = NoiseScale(beta=0.995)
    rng = np.random.default_rng(5)
    for _ in range(3000):
        gm = micro_grads(rng, d, 8, 16)
        g = gm.mean(axis=0)
        ns.update(8, float(np.mean(np.sum(gm * gm, axis=1))), 128, float(g @ g))
    assert abs(ns.G2 - g2_true) / g2_true < 0.10
    assert abs(ns.S - s_true) / s_true < 0.10
    assert abs(ns.b_noise - s_true / g2_true) / (s_true / g2_true) < 0.15


def test_noise_scale_guards_and_state():
    ns = NoiseScale()
    assert ns.b_noise is None
    ns.update(4, 1.0, 8, 1.0)           # G2 = 1, S = 0
    assert ns.b_noise == 0.0
    ns2 = NoiseScale()
    ns2.update(4, 10.0, 8, 1.0)         # G2 = (8 - 40)/4 < 0
    assert ns2.b_noise == math.inf
    ns3 = NoiseScale()
    ns3.load_state_dict(ns2.state_dict())
    assert ns3.G2 == ns2.G2 and ns3.S == ns2.S and ns3.b_noise == math.inf


def test_ema_bias_correction_and_round_trip():
    e = EMA(0.9)
    assert e.value is None
    assert e.update(5.0) == pytest.approx(5.0)     # bias-corrected: first value is exact
    for _ in range(50):
        e.update(5.0)
    assert e.value == pytest.approx(5.0)
    e.update(15.0)
    f = EMA(0.5)
    f.load_state_dict(e.state_dict())
    assert f.value == e.value and f.count == e.count and f.beta == 0.9
    with pytest.raises(ConfigError):
        EMA(1.0)
    with pytest.raises(ConfigError):
        e.update(float("nan"))
