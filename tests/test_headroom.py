"""hpc_jabas.core.adaptive.headroom against closed-form quadratics: eps_max and the headroom against the loss of the
step
itself, E_lin against the expected per-sample loss decrease computed by enumerating every mini-batch of a
least-squares problem (whose loss is exactly quadratic), where eps_max and B_n are known."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hpc_jabas.core.adaptive import headroom as hr


def _quadratic(seed: int, dim: int = 4):
    """(H symmetric positive definite, G, loss(delta) = the change of a quadratic's loss after a step -delta)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    H = q @ np.diag(rng.uniform(0.1, 10.0, dim)) @ q.T
    G = rng.standard_normal(dim)

    def change(delta):          # L(theta - delta) - L(theta) for L = G'x + x'Hx/2 around theta (x = 0)
        return float(-G @ delta + 0.5 * delta @ H @ delta)
    return H, G, change


def test_eps_max_and_headroom_on_an_isotropic_quadratic():
    H = 4.0 * np.eye(3)
    g = np.array([1.0, -2.0, 0.5])
    assert math.isclose(hr.eps_max(g, H @ g), 0.25)
    assert math.isclose(hr.headroom(0.25, 0.05, momentum=0.9), 1.0)     # 2 * 0.25 / (0.05 / 0.1)
    assert math.isclose(hr.headroom(0.25, 0.05), 10.0)
    assert hr.eps_max(g, -H @ g) == math.inf                              # negative curvature: no edge
    assert math.isnan(hr.eps_max(g, H @ g, d=-g))                        # not a descent direction


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.floats(1e-3, 2.0))
def test_headroom_above_one_iff_the_step_along_the_gradient_descends(seed, lr):
    H, G, change = _quadratic(seed)
    h = hr.headroom(hr.eps_max(G, H @ G), lr)
    assume(abs(h - 1.0) > 1e-6)
    assert (h > 1.0) == (change(lr * G) < 0.0)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.floats(1e-3, 2.0))
def test_preconditioned_headroom_above_one_iff_the_preconditioned_step_descends(seed, lr):
    H, G, change = _quadratic(seed)
    d = G / np.random.default_rng(seed + 1).uniform(0.2, 3.0, G.shape)   # Adam-like: a positive diagonal scaling
    h = hr.headroom(hr.eps_max(G, H @ d, d=d), lr)
    assume(abs(h - 1.0) > 1e-6)
    assert (h > 1.0) == (change(lr * d) < 0.0)


def _least_squares(seed: int, n: int = 4, dim: int = 2):
    """Per-sample losses (x_i' theta - y_i)^2 / 2 at a fixed theta: (loss(theta), theta, per-sample gradients, H)."""
    rng = np.random.default_rng(seed)
    X, y, theta = rng.standard_normal((n, dim)), rng.standard_normal(n), rng.standard_normal(dim)

    def loss(t):
        return float(0.5 * np.mean((X @ t - y) ** 2))
    grads = X * (X @ theta - y)[:, None]
    H = X.T @ X / n
    return loss, theta, grads, H


def _expected_change(loss, theta, grads, B: int, eps: float) -> float:
    """E[L(theta - eps g_batch)] - L(theta) over every batch of B samples drawn with replacement (exact)."""
    n = len(grads)
    tot = sum(loss(theta - eps * grads[list(b)].mean(axis=0)) for b in itertools.product(range(n), repeat=B))
    return tot / n ** B - loss(theta)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_e_lin_is_the_enumerated_per_sample_efficiency_under_linear_lr_scaling(seed):
    loss, theta, grads, H = _least_squares(seed)
    G = grads.mean(axis=0)
    sigma = np.cov(grads.T, ddof=0)                  # per-sample gradient covariance (population)
    em = hr.eps_max(G, H @ G)
    b_n = hr.b_curvature_noise(float(np.trace(H @ sigma)), float(G @ H @ G))
    B0 = 1
    eps0 = 0.2 * em / (1 + b_n)                      # well inside the edge at B0: the reference descends
    ref0 = -_expected_change(loss, theta, grads, B0, eps0) / B0
    assert ref0 > 0
    for B in (2, 3, 4, 5):
        ref = -_expected_change(loss, theta, grads, B, eps0 * B / B0) / B / ref0
        got = hr.e_lin(B, B0, eps0, em, b_n)
        if ref <= 0:                                 # beyond the cliff: E_lin clips at 0
            assert got == 0.0 and B >= hr.cliff_batch(B0, eps0, em, b_n) - 1e-9
        else:
            assert math.isclose(got, ref, rel_tol=1e-9), (B, got, ref)


def test_e_lin_is_flat_then_falls_off_a_cliff():
    # eps_max = 1, eps0 = 0.01 at B0 = 32, B_n = 8: u = 0.01 / 64; cliff at 2 * 32 / 0.01 - 8 = 6392
    e = [hr.e_lin(B, 32, 0.01, 1.0, 8.0) for B in (32, 64, 256, 1024, 4096, 6392, 8000)]
    assert e[0] == 1.0
    assert e[1] > 0.99 and e[2] > 0.96                       # flat where the noise term dominates
    assert math.isclose(e[4], (1 - 0.01 / 64 * 4104) / (1 - 0.01 / 64 * 40), rel_tol=1e-12)
    assert e[5] == pytest.approx(0.0, abs=1e-12) and e[6] == 0.0
    assert math.isclose(hr.cliff_batch(32, 0.01, 1.0, 8.0), 6392.0)
    assert math.isnan(hr.e_lin(64, 32, 3.0, 1.0, 8.0))       # B0 itself beyond the edge
    assert hr.e_lin(4096, 32, 0.01, math.inf, 8.0) == 1.0    # no edge: linear scaling is free


def test_tolerated_multiplier_and_moves():
    assert hr.tolerated_multiplier(2.0, 3.5) == 7.0
    assert hr.move_allowed(4.0, 2.0, 3.5) and not hr.move_allowed(8.0, 2.0, 3.5)
    assert hr.move_allowed(0.5, 0.01, 1.0)                    # a move down is always allowed
    with pytest.raises(ValueError, match="c=0"):
        hr.tolerated_multiplier(1.0, 0.0)
    with pytest.raises(ValueError, match="momentum=1"):
        hr.headroom(1.0, 0.1, momentum=1.0)
