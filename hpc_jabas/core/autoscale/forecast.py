"""Forecast of the next epoch's global-batch-size trajectory. Pure: numpy (+ scikit-learn where installed).

JABAS's epoch-end auto-scaler prices every candidate allocation on the B trajectory it expects
for the next epoch (docs/formulas.md, section 7). Like JABAS, the forecast blends two models 50/50:

- a Gaussian-process regression of B on the iteration (RBF + white-noise kernel, normalised
  targets, fixed random_state): follows smooth curves, reverts to the mean far from the data;
- damped Holt exponential smoothing (level + trend) on the sequence of decisions, its three
  parameters picked from a small grid by one-step-ahead squared error: follows trends and
  plateaus.

The GP is scikit-learn's (``pip install 'hpc-jabas[forecast]'``; its L-BFGS-B fit from two starts) where it is
installed; without it, the same model fitted in numpy (:func:`_fit_gp_numpy`: the log marginal likelihood maximised
over the same kernel bounds by a grid and a pattern search), whose forecasts agree with scikit-learn's where both
find the likelihood's maximum (tests/test_forecast_gp.py), so the base install forecasts too.

With fewer than 3 decisions the forecast is the last value. Only the most recent MAX_HISTORY
decisions are used. Everything is clipped to
[B_min, B_max] and rounded to integers. Deterministic: same input, same output; a fit is therefore
reused for the same history (FIT_CACHE_SIZE most recent), whatever iteration is forecast from.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import numpy.typing as npt

from hpc_jabas.core.config.validate import integer
from hpc_jabas.errors import ConfigError

MIN_POINTS = 3
MAX_POINTS = 100_000
MAX_HISTORY = 256          # the models see the most recent decisions only (GP cost grows as n^3)
_HOLT_GRID = [(a, b, phi) for a in (0.2, 0.4, 0.6, 0.8, 1.0)
              for b in (0.05, 0.2, 0.5, 0.8) for phi in (0.9, 0.98, 1.0)]

FloatArray = npt.NDArray[np.float64]


def _clean_history(history: Sequence[tuple[int, float]]) -> tuple[FloatArray, FloatArray]:
    pts: dict[float, float] = {}
    last = -math.inf
    for item in history:
        try:
            it_raw, b_raw = item
            it, B = float(it_raw), float(b_raw)
        except (TypeError, ValueError):
            raise ConfigError(f"history entry {item!r} is invalid; give (iteration, B) pairs") from None
        if not (math.isfinite(it) and math.isfinite(B) and B > 0):
            raise ConfigError(f"history entry {item!r} is invalid; need a finite iteration and B > 0")
        if it < last:
            raise ConfigError(f"history iteration {it:g} comes after {last:g}; give entries in iteration order")
        last = it
        pts[it] = B                       # a repeated iteration keeps its latest decision
    ts = np.array(sorted(pts), dtype=float)
    return ts, np.array([pts[t] for t in ts], dtype=float)


def _holt(y: FloatArray, alpha: float, beta: float, phi: float) -> tuple[float, float, float]:
    """Damped Holt: returns (level, trend, sum of squared one-step errors)."""
    level, trend = float(y[0]), float(y[1] - y[0])
    sse = 0.0
    for v in y[1:]:
        pred = level + phi * trend
        sse += float(v - pred) ** 2
        new_level = alpha * v + (1 - alpha) * pred
        trend = beta * (new_level - level) + (1 - beta) * phi * trend
        level = new_level
    return level, trend, sse


def _holt_fit(ya: FloatArray) -> tuple[float, float, float]:
    """(level, trend, phi) of the grid's best damped Holt fit (least one-step error; ties: the order below)."""
    best = min(_HOLT_GRID, key=lambda g: (_holt(ya, *g)[2], -g[0], g[1], -g[2]))
    level, trend, _ = _holt(ya, *best)
    return level, trend, best[2]


def _holt_eval(fit: tuple[float, float, float], h: FloatArray) -> FloatArray:
    level, trend, phi = fit
    damp: FloatArray = h if phi == 1.0 else phi * (1 - phi ** h) / (1 - phi)
    return level + damp * trend


def holt_forecast(y: npt.ArrayLike, steps: npt.ArrayLike) -> FloatArray:
    """Damped-trend Holt smoothing of an equally spaced series, forecast ``steps`` ahead (>= 0, may be fractional)."""
    ya = np.asarray(y, dtype=np.float64)
    h = np.asarray(steps, dtype=np.float64)
    if len(ya) < 2:
        return np.full(len(h), float(ya[-1]))
    return _holt_eval(_holt_fit(ya), h)


def _one_thread() -> AbstractContextManager[Any]:
    """The matrices are tiny: keep BLAS to one thread (no oversubscription inside a trainer)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return contextlib.nullcontext()
    limits: AbstractContextManager[Any] = threadpool_limits(1)
    return limits


#: the GP kernel's hyperparameter bounds (scikit-learn's ConstantKernel, RBF length scale, WhiteKernel), as fitted
GP_BOUNDS = ((1e-3, 1e3), (1e-2, 1e3), (1e-6, 1e1))


def have_sklearn() -> bool:
    """Whether scikit-learn's GP is installed (the ``forecast`` extra)."""
    try:
        import sklearn.gaussian_process  # noqa: F401
    except ImportError:
        return False
    return True


def _gp_lml(x: FloatArray, y: FloatArray, theta: FloatArray) -> tuple[float, FloatArray | None]:
    """The log marginal likelihood of normalised targets ``y`` under c * RBF(l) + white(w), theta = log(c, l, w);
    and alpha = K^-1 y (None where K is not positive definite)."""
    c, ell, w = np.exp(theta)
    # + 1e-10 on the diagonal: scikit-learn's GaussianProcessRegressor alpha (its default), for the same model
    k = c * np.exp(-0.5 * (x[:, None] - x[None, :]) ** 2 / (ell * ell)) + (w + 1e-10) * np.eye(len(x))
    try:
        chol = np.linalg.cholesky(k)
    except np.linalg.LinAlgError:
        return -math.inf, None
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    return float(-0.5 * y @ alpha - np.log(np.diag(chol)).sum() - 0.5 * len(x) * math.log(2 * math.pi)), alpha


def _fit_gp_numpy(x: FloatArray, ys: FloatArray) -> Callable[[FloatArray], FloatArray]:
    """The GP of :func:`_fit_gp` in numpy (x already scaled to [0, 1]): normalised targets as scikit-learn's
    normalize_y, hyperparameters maximising the log marginal likelihood within GP_BOUNDS (a grid over length scale
    and noise at three amplitudes, then a pattern search to 1e-4 in log space); its mean."""
    mean, std = float(ys.mean()), float(ys.std())
    std = std if std > 0 else 1.0
    y = (ys - mean) / std
    bt, _ = _gp_hyper(x, y)
    c, ell, _w = np.exp(bt)
    alpha = _gp_lml(x, y, bt)[1]
    assert alpha is not None                         # the best point had a finite likelihood

    def predict(xq: FloatArray) -> FloatArray:
        kq = c * np.exp(-0.5 * (xq[:, None] - x[None, :]) ** 2 / (ell * ell))
        out: FloatArray = (kq @ alpha) * std + mean
        return out
    return predict


def _gp_hyper(x: FloatArray, y: FloatArray) -> tuple[FloatArray, float]:
    """log(c, l, w) maximising the log marginal likelihood of ``y`` within GP_BOUNDS, and that likelihood."""
    lo, hi = np.log(np.array([b[0] for b in GP_BOUNDS])), np.log(np.array([b[1] for b in GP_BOUNDS]))
    best, bt = -math.inf, np.zeros(3)
    for lc in (math.log(0.3), 0.0, math.log(3.0)):
        for ll in np.linspace(lo[1], hi[1], 16):
            for lw in np.linspace(lo[2], hi[2], 12):
                t = np.array([lc, ll, lw])
                v = _gp_lml(x, y, t)[0]
                if v > best:
                    best, bt = v, t
    step = (hi - lo) / 8
    while step.max() > 1e-4:
        moved = False
        for i in range(3):
            for sgn in (-1.0, 1.0):
                t = bt.copy()
                t[i] = min(max(t[i] + sgn * step[i], lo[i]), hi[i])
                v = _gp_lml(x, y, t)[0]
                if v > best + 1e-12:
                    best, bt, moved = v, t, True
        if not moved:
            step = step / 2
    return bt, best


def _fit_gp(ts: FloatArray, ys: FloatArray, *, use_sklearn: bool | None = None) -> Callable[[FloatArray], FloatArray]:
    """Fit a GP (RBF + WhiteKernel, normalize_y, random_state=0) of B on the iteration; return its mean. With
    scikit-learn where it is installed (``use_sklearn`` None), else in numpy (:func:`_fit_gp_numpy`)."""
    t0 = float(ts[0])
    span = max(float(ts[-1] - ts[0]), 1.0)

    def scale(t: FloatArray) -> FloatArray:
        return ((np.asarray(t, dtype=np.float64) - t0) / span)[:, None]

    if np.ptp(ys) == 0.0:
        const = float(ys[0])
        return lambda tq: np.full(len(tq), const)
    if not (have_sklearn() if use_sklearn is None else use_sklearn):
        fitted = _fit_gp_numpy(scale(ts)[:, 0], ys)
        return lambda tq: fitted(scale(tq)[:, 0])
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    kernel = (ConstantKernel(1.0, (1e-3, 1e3)) * RBF(1.0, (1e-2, 1e3))
              + WhiteKernel(1e-2, (1e-6, 1e1)))
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, random_state=0, n_restarts_optimizer=1)
    with warnings.catch_warnings(), _one_thread():
        warnings.simplefilter("ignore")   # ConvergenceWarning at kernel bounds is expected and harmless
        gp.fit(scale(ts), ys)

    def predict(tq: FloatArray) -> FloatArray:
        with _one_thread():
            mean: FloatArray = gp.predict(scale(tq))
        return mean
    return predict


def gp_forecast(ts: Sequence[float], ys: Sequence[float], tq: Sequence[float], *,
                use_sklearn: bool | None = None) -> FloatArray:
    """Gaussian-process mean of B at iterations ``tq``, fitted on (ts, ys) (``use_sklearn``: None = where
    installed; False: the numpy fit)."""
    fitted = _fit_gp(np.asarray(ts, dtype=float), np.asarray(ys, dtype=float), use_sklearn=use_sklearn)
    return fitted(np.asarray(tq, dtype=float))


class _Model:
    """The fitted 50/50 blend, evaluated at any future iteration."""

    def __init__(self, ts: FloatArray, ys: FloatArray) -> None:
        self.ts, self.ys = ts, ys
        self.short = len(ys) < MIN_POINTS
        gaps = np.diff(ts)
        step = float(np.median(gaps)) if len(gaps) else 1.0
        self.step = step if step > 0 else 1.0
        self.gp: Callable[[FloatArray], FloatArray] | None = None if self.short else _fit_gp(ts, ys)
        self.holt = None if self.short else _holt_fit(ys)      # len(ys) >= MIN_POINTS >= 2

    def __call__(self, tq: npt.ArrayLike) -> FloatArray:
        tqa = np.asarray(tq, dtype=np.float64)
        if self.gp is None or self.holt is None:
            return np.full(len(tqa), float(self.ys[-1]))
        steps = np.maximum(tqa - self.ts[-1], 0.0) / self.step
        return 0.5 * self.gp(tqa) + 0.5 * _holt_eval(self.holt, steps)


#: fitted models kept for reuse, keyed on the exact history they were fitted on (the fit is deterministic:
#: the same points give the same model, so a hit decides exactly as a refit). 0: no reuse.
FIT_CACHE_SIZE = 128
_fits: OrderedDict[tuple[bytes, bytes], _Model] = OrderedDict()


def _model(ts: FloatArray, ys: FloatArray) -> _Model:
    if FIT_CACHE_SIZE <= 0:
        return _Model(ts, ys)
    key = (ts.tobytes(), ys.tobytes())
    m = _fits.get(key)
    if m is None:
        m = _fits[key] = _Model(ts, ys)
        while len(_fits) > FIT_CACHE_SIZE:
            _fits.popitem(last=False)
    else:
        _fits.move_to_end(key)
    return m


def preload() -> None:
    """Import scikit-learn's GP now where it is installed (seconds, once per process), so that a timed decision
    does not pay it."""
    have_sklearn()


def forecast_next_epoch(history: Sequence[tuple[int, float]],
                        iters_per_epoch: int | Callable[[int], int],
                        horizon_iters: int | None = None,
                        period_p: int = 100,
                        B_min: int = 1,
                        B_max: int | None = None,
                        *, start_iter: int | None = None, reuse_fit: bool = True) -> list[int]:
    """One forecast B per decision period of the next epoch, clipped to [B_min, B_max].

    ``history``: the (iteration, B) decisions so far, in iteration order (global iteration
    numbers; the initial B counts as a decision at its start iteration).
    ``iters_per_epoch``: the epoch length in iterations, or a callable ``f(B) -> iterations``
    giving an epoch's length at a constant B (e.g. ``lambda B: ceil(N / B)``); with a callable the
    epoch ends once the forecast periods have consumed one epoch of data (sum of p / f(B_k) >= 1).
    ``horizon_iters``: optional cap on the iterations forecast (None: the whole epoch).
    ``period_p``: iterations between decisions. ``start_iter``: the first iteration of the next
    epoch (default: last decision + period_p). ``reuse_fit``: take the fitted model of the same history
    from the cache (FIT_CACHE_SIZE) instead of refitting; the result is the same either way. Returns
    ``[B_0, B_1, ...]`` for the periods starting at start_iter, start_iter + p, ...
    """
    p = integer(period_p, "period_p", lo=1)
    lo = integer(B_min, "B_min", lo=1)
    hi = None if B_max is None else integer(B_max, "B_max", lo=1)
    if hi is not None and lo > hi:
        raise ConfigError(f"B_min={B_min} is larger than B_max={B_max}; need 1 <= B_min <= B_max")
    if horizon_iters is not None:
        integer(horizon_iters, "horizon_iters", lo=1)
    if not history:
        raise ConfigError("history is empty; give at least the initial (iteration, B) decision")
    ts, ys = _clean_history(history)
    ts, ys = ts[-MAX_HISTORY:], ys[-MAX_HISTORY:]
    start = float(ts[-1] + p) if start_iter is None else float(start_iter)
    model = _model(ts, ys) if reuse_fit else _Model(ts, ys)

    def finish(v: FloatArray) -> list[int]:
        v = np.maximum(v, lo)
        if hi is not None:
            v = np.minimum(v, hi)
        return [int(round(float(x))) for x in v]

    if callable(iters_per_epoch):
        cap = MAX_POINTS if horizon_iters is None else math.ceil(horizon_iters / p)
        # the blend is evaluated in chunks; the epoch length depends on the forecast itself
        out: list[int] = []
        done = 0.0
        chunk = 64
        while done < 1.0 and len(out) < cap:
            tq = start + p * np.arange(len(out), len(out) + chunk)
            for B in finish(model(tq)):
                n = iters_per_epoch(B)
                if isinstance(n, bool) or not isinstance(n, (int, float, np.integer, np.floating)) or not n > 0:
                    raise ConfigError(f"iters_per_epoch({B}) returned {n!r}; it must return a number > 0")
                out.append(B)
                done += p / float(n)
                if done >= 1.0 - 1e-12 or len(out) >= cap:
                    break
            chunk = min(chunk * 2, 4096)
        if done < 1.0 and horizon_iters is None:
            raise ConfigError(f"the next epoch needs more than {MAX_POINTS} decision periods; "
                              "check iters_per_epoch and period_p")
        return out
    n_iter = integer(iters_per_epoch, "iters_per_epoch", lo=1)
    if horizon_iters is not None:
        n_iter = min(n_iter, horizon_iters)
    n = math.ceil(n_iter / p)
    if n > MAX_POINTS:
        raise ConfigError(f"iters_per_epoch={iters_per_epoch} / period_p={p} gives {n} periods; "
                          f"at most {MAX_POINTS} are supported")
    return finish(model(start + p * np.arange(n)))


def forecast_error(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Mean absolute percentage error, as a fraction (0.158 = 15.8%), over the common prefix.

    Lengths may differ (the real epoch may take more or fewer periods than forecast); the
    shorter length is compared. Actual values must be > 0.
    """
    n = min(len(predicted), len(actual))
    if n == 0:
        raise ConfigError("forecast_error needs at least one predicted and one actual value")
    p = np.asarray(predicted[:n], dtype=float)
    a = np.asarray(actual[:n], dtype=float)
    if np.any(a <= 0) or not np.all(np.isfinite(a)) or not np.all(np.isfinite(p)):
        raise ConfigError("forecast_error needs finite values and actual batch sizes > 0")
    return float(np.mean(np.abs(p - a) / a))
