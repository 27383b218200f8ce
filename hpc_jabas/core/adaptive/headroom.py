"""The curvature headroom of the lr and the per-sample efficiency of a larger batch under linear lr scaling.

Pure: plain numbers and numpy arrays in, numbers out (docs/formulas.md's notation).

On a locally quadratic loss with gradient G, Hessian H and per-sample gradient covariance Sigma, one step of
lr eps along a mean gradient over B samples changes the expected loss by
``-eps |G|^2 + eps^2 / 2 (G'HG + tr(H Sigma) / B)`` (McCandlish et al. 2018). Along G alone the step descends
while ``eps < 2 eps_max``, ``eps_max = |G|^2 / G'HG``; the headroom is ``h = 2 eps_max / eps_eff`` with
``eps_eff = lr / (1 - beta)`` under heavy-ball momentum beta (h > 1: the step is inside the edge). Along a
preconditioned direction d (Adam's ``g / (sqrt(v_hat) + eps)``), ``eps_max = g'd / d'Hd`` and eps_eff = lr.

When the lr scales linearly with B (eps = eps0 B / B0), the noise term per sample does not depend on B and only the
curvature term grows, so the per-sample efficiency of B relative to B0 is

    E_lin(B) = [1 - u (B + B_n)] / [1 - u (B0 + B_n)],   u = eps0 / (2 B0 eps_max),   B_n = tr(H Sigma) / G'HG:

flat while u (B + B_n) << 1, then a cliff at ``B = 1 / u - B_n`` where the scaled lr meets the stability edge.
(Pollux's E(B) = (B_noise + B0) / (B_noise + B) assumes the lr re-tuned at every B instead.)
The tolerated multiplier of B (and so of the linearly scaled lr) is ``c * h``, c calibrated on measured grids.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _dot(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    return float(np.dot(np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()))


def eps_max(g: Sequence[float] | np.ndarray, hd: Sequence[float] | np.ndarray,
            d: Sequence[float] | np.ndarray | None = None) -> float:
    """The largest lr along direction ``d`` (default: ``g`` itself) at which one step still descends on the
    quadratic model, halved: ``g'd / d'Hd`` with ``hd = H d`` (one Hessian-vector product). inf where the
    curvature along d is not positive (no edge along d); nan where g'd <= 0 (d is not a descent direction)."""
    d_ = g if d is None else d
    gd, dhd = _dot(g, d_), _dot(d_, hd)
    if not gd > 0:
        return math.nan
    return math.inf if dhd <= 0 else gd / dhd


def effective_lr(lr: float, momentum: float = 0.0) -> float:
    """The step a heavy-ball lr takes in steady state: lr / (1 - momentum)."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum={momentum}: must be in [0, 1)")
    return lr / (1.0 - momentum)


def headroom(eps_max_: float, lr: float, momentum: float = 0.0) -> float:
    """h = 2 eps_max / (lr / (1 - momentum)): above 1 the lr is inside the stability edge along the measured
    direction, below 1 beyond it."""
    if not lr > 0:
        raise ValueError(f"lr={lr}: must be > 0")
    return 2.0 * eps_max_ / effective_lr(lr, momentum)


def b_curvature_noise(tr_h_sigma: float, ghg: float) -> float:
    """B_n = tr(H Sigma) / G'HG: the batch at which noise and curvature add equally to a step's loss rise."""
    return math.inf if ghg <= 0 else tr_h_sigma / ghg


def e_lin(B: float, B0: float, eps0: float, eps_max_: float, b_n: float) -> float:
    """Per-sample efficiency of batch B against B0 with the lr scaled linearly from eps0 at B0 (eps0: the
    effective lr, eps/(1 - beta) under momentum): ``[1 - u (B + b_n)] / [1 - u (B0 + b_n)]``,
    ``u = eps0 / (2 B0 eps_max)``. Clipped at 0 beyond the cliff (a step that raises the loss in expectation does
    no work); nan where B0 itself is beyond it (the reference lr does not descend)."""
    if B <= 0 or B0 <= 0 or eps0 <= 0:
        raise ValueError(f"e_lin: B={B}, B0={B0}, eps0={eps0}: each must be > 0")
    if math.isinf(eps_max_):
        return 1.0
    u = eps0 / (2.0 * B0 * eps_max_)
    den = 1.0 - u * (B0 + b_n)
    if den <= 0:
        return math.nan
    return max(0.0, (1.0 - u * (B + b_n)) / den)


def cliff_batch(B0: float, eps0: float, eps_max_: float, b_n: float) -> float:
    """The B where E_lin reaches 0: ``1 / u - b_n`` = 2 B0 eps_max / eps0 - b_n (inf without an edge)."""
    if math.isinf(eps_max_):
        return math.inf
    return 2.0 * B0 * eps_max_ / eps0 - b_n


def tolerated_multiplier(h: float, c: float) -> float:
    """The largest multiplier of B (and of the linearly scaled lr) a move may take: c * h (c calibrated on measured
    grids; bench/adaptive_experiments.py)."""
    if not c > 0:
        raise ValueError(f"c={c}: must be > 0")
    return c * h


def move_allowed(k: float, h: float, c: float) -> bool:
    """Is a move of B by the factor k free under the headroom cap? (k <= 1 always is.)"""
    return k <= 1.0 or k <= tolerated_multiplier(h, c)


def e_lin_h(B: float, B_h: float, h: float, b_n: float) -> float:
    """E_lin in the measured headroom's terms, unnormalised: the per-sample progress at B, with the lr scaled
    linearly from the one at which ``h`` was measured at batch ``B_h``, over the curvature-free ideal:
    ``max(0, 1 - (B + b_n) / (h B_h))`` (u = 1 / (h B_h): e_lin's u with eps0 / eps_max = 2 / h at B0 = B_h).
    Its ratio at two B is e_lin's; 1 without an edge (h = inf)."""
    if B <= 0 or B_h <= 0 or not h > 0:
        raise ValueError(f"e_lin_h: B={B}, B_h={B_h}, h={h}: each must be > 0")
    if math.isinf(h):
        return 1.0
    return max(0.0, 1.0 - (B + max(0.0, b_n)) / (h * B_h))


class HeadroomCap:
    """The cap a policy puts on moves up: the latest measured headroom ``h`` and the batch ``B_h`` it was measured
    at; a move to B above the current batch is refused once ``B / B_h`` exceeds ``c * h`` (move_allowed). Off
    (every move allowed) until a finite h > 0 is measured."""

    def __init__(self, c: float) -> None:
        if not (isinstance(c, (int, float)) and not isinstance(c, bool) and 0.0 < c < math.inf):
            raise ValueError(f"headroom_c={c!r}: must be a finite number > 0, e.g. 4")
        self.c = float(c)
        self.h: float | None = None
        self.B_h: float | None = None

    def observe(self, h: float | None, B: float | None = None) -> bool:
        """One measured headroom (None, nan or <= 0: left out) at batch ``B`` (None: the next decision's B).
        Whether it was taken."""
        if h is None or isinstance(h, bool) or not isinstance(h, (int, float)) or not h > 0:
            return False
        self.h = float(h)
        self.B_h = None if B is None or not B > 0 else float(B)
        return True

    def limit(self, B: float) -> float | None:
        """The largest batch a move up from the current ``B`` may reach (None: no cap, h not measured)."""
        if self.h is None:
            return None
        if self.B_h is None:
            self.B_h = float(B)                   # measured at this decision's B
        return tolerated_multiplier(self.h, self.c) * self.B_h

    def allows(self, B: float, new: float) -> bool:
        """Is the move from ``B`` to ``new`` free? (Never refuses a move down or none.)"""
        if new <= B or self.limit(B) is None or self.h is None or self.B_h is None:
            return True
        # move_allowed(k = new / B_h) but for its k <= 1: a move up to below B_h is free only within c x h too
        return new / self.B_h <= tolerated_multiplier(self.h, self.c)

    def text(self, B: float) -> str:
        lim = self.limit(B)
        return "" if lim is None else (f"headroom h={self.h:.3g} at B={self.B_h:g}: moves up to "
                                       f"c x h = {self.c:g} x {self.h:.3g} -> B <= {lim:.4g}")

    def state_dict(self) -> dict[str, float | None]:
        return {"c": self.c, "h": self.h, "B_h": self.B_h}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        h, b = state.get("h"), state.get("B_h")
        self.h = None if h is None else float(h)
        self.B_h = None if b is None else float(b)
