"""bench/branch_probe.py's inversion B_noise_eff = B (2 rho - 1) / (1 - rho), against a closed-form quadratic where
the noise scale is known exactly: L = |theta|^2 / 2, a batch-B gradient theta + xi / sqrt(B) with cov(xi) = Sigma,
one step at the lr that is optimal for B. Then E[dL(B)] = (|G|^2 / 2) / (1 + B_noise / B) with B_noise =
tr(Sigma) / |G|^2 (McCandlish et al.), and rho = (dL(2B) / 2B) / (dL(B) / B). Checked in closed form (hypothesis)
and by Monte Carlo over sampled gradients (an estimate, not the formula)."""
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.branch_probe import kappa_of


def progress(theta: np.ndarray, tr_sigma: float, B: int) -> float:
    """E[L(theta) - L(theta')] of one step at the lr optimal for B: |G|^4 / (2 (|G|^2 + tr(Sigma) / B))."""
    g2 = float(theta @ theta)
    return g2 * g2 / (2 * (g2 + tr_sigma / B))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 512), st.floats(0.5, 4096.0), st.floats(0.1, 10.0))
def test_the_inversion_recovers_the_noise_scale_in_closed_form(B, b_noise, g2):
    theta = np.array([math.sqrt(g2)])
    tr_sigma = b_noise * g2
    rho = (progress(theta, tr_sigma, 2 * B) / (2 * B)) / (progress(theta, tr_sigma, B) / B)
    assert math.isclose(rho, (B + b_noise) / (2 * B + b_noise), rel_tol=1e-12)
    assert math.isclose(kappa_of(rho, B, b_noise), 1.0, rel_tol=1e-6)          # B_noise_eff = B_noise: kappa 1
    assert math.isclose(kappa_of(rho, B, b_noise / 4), 4.0, rel_tol=1e-6)      # measured 4x too small: kappa 4


def test_monte_carlo_steps_give_the_noise_scale_back():
    rng = np.random.default_rng(0)
    d, B, n = 20, 16, 200_000
    theta = rng.normal(size=d)
    scales = rng.uniform(0.5, 2.0, size=d)             # Sigma diagonal, anisotropic
    tr_sigma = float((scales ** 2).sum()) * 40.0
    b_noise = tr_sigma / float(theta @ theta)

    def mean_progress(b: int) -> float:
        g2 = float(theta @ theta)
        lr = g2 / (g2 + tr_sigma / b)
        xi = rng.normal(size=(n, d)) * scales * math.sqrt(40.0)
        new = theta - lr * (theta + xi / math.sqrt(b))
        return float(np.mean(0.5 * g2 - 0.5 * (new * new).sum(1)))

    rho = (mean_progress(2 * B) / (2 * B)) / (mean_progress(B) / B)
    assert abs(kappa_of(rho, B, b_noise) - 1.0) < 0.05, (rho, b_noise)
    assert math.isnan(kappa_of(float("nan"), B, b_noise)) and kappa_of(1.0, B, b_noise) == math.inf
    assert kappa_of(0.5, B, b_noise) == 0.0            # doubling buys nothing per sample: no noise tolerance
