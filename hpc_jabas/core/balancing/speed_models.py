"""Per-rank speed models for LB-BSP: the last-value baseline and NARX + RLS. Pure: plain Python + numpy.

What is predicted, the update/predict protocol and the ``exo`` signals: see balancing/predictor.py, which
also keeps one of these models per rank (``RankPredictors``).

NarxPredictor: the model
------------------------
Linear NARX in *increments*, fitted by recursive least squares (RLS) with exponential forgetting::

    (v_t - v_{t-1}) / S  =  theta . phi_t + noise

    phi_t = [1,                                             bias
             v_{t-1}/S, (v_{t-1}-v_{t-2})/S, ..., (v_{t-d+1}-v_{t-d})/S,      d speed lags
             for each signal x:  x_{t-1}/E_x, (x_{t-1}-x_{t-2})/E_x, ..., (x_{t-d'}-x_{t-d'-1})/E_x]

No oracle: every feature of the window t being predicted comes from windows t-1 and before
(speeds measured, and signals measured during those windows); ``predict()`` takes no signals at
all, so nothing about window t itself can reach the model. A signal helps only where it *leads*
speed (it moves a window before the speed does, or its level carries information the past speeds
do not).

This is the same model family as regressing v_t on v_{t-1..t-d} and x_{t-1..t-d'-1} (a linear
re-parametrisation), but written so that theta = 0 *is* the last-value predictor: RLS starts at
theta = 0 with P = delta * I, i.e. ridge-regularised toward "no change", so an unexcited model
predicts the last value exactly (a constant series is predicted exactly) and a signal is only
used once it has explained something. Increments and differences of signals are also much better
conditioned than raw levels (levels of consecutive windows are nearly collinear).

Normalisation: S is the largest speed seen so far and E_x the largest |x| seen so far, so every
feature is O(1) whatever the units (utilisation in 0..1 or 0..100, clocks in MHz). When a scale
grows, theta and P are transformed so that the fitted function is unchanged (an exact change of
coordinates), so the model never restarts.

RLS with forgetting factor lambda (0.95..0.99: the model remembers ~1/(1-lambda) windows)::

    e = y - theta.phi;  k = P phi / (lambda + phi' P phi);  theta += k e;  P = (P - k phi' P) / lambda

Wind-up guard: with forgetting, P grows without bound in directions the data does not excite (a
constant signal, collinear features); its eigenvalues are clipped to the prior variance delta, so
those directions go back to the prior while the excited ones keep learning at full speed. (A
global trace cap would shrink the excited directions too and slow learning down several-fold.)

Safety of ``predict``: until ``min_train`` samples were fitted (default 2 x number of features),
and whenever the model output is not finite, the prediction is the last observed speed; the
model output is always clipped to [clip_lo, clip_hi] x the last observed speed (default
[0.25, 4]).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from hpc_jabas.core.config.validate import integer, is_number, number, positive
from hpc_jabas.errors import ConfigError, JabasError, StateError

STATE_VERSION = 2          # 2: signals lag one window (predict() takes none)
MAX_LAGS = 64


# ---------------------------------------------------------------------------------------------
# checking
# ---------------------------------------------------------------------------------------------

def exo_dict(exo: Any, what: str = "exo") -> dict[str, float]:
    """Validated signals: name -> float, non-finite values dropped (treated as missing)."""
    if exo is None:
        return {}
    if not isinstance(exo, Mapping):
        raise ConfigError(f"{what}={exo!r} is invalid; give a dict of named numbers, e.g. {{'cpu': 0.4}}")
    out = {}
    for k, v in exo.items():
        if not isinstance(k, str) or not k:
            raise ConfigError(f"{what} signal name {k!r} is invalid; names must be non-empty strings")
        if not is_number(v):
            raise ConfigError(f"{what} signal {k!r}={v!r} is not a number")
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


def check_state(state: Any, kind: str) -> Mapping[str, Any]:
    if not isinstance(state, Mapping) or state.get("kind") != kind:
        got = state.get("kind") if isinstance(state, Mapping) else type(state).__name__
        raise ConfigError(f"predictor state of kind {got!r} cannot be loaded into a {kind!r} predictor")
    if state.get("version") != STATE_VERSION:
        raise ConfigError(f"predictor state version {state.get('version')!r} is not supported; "
                          f"this version reads {STATE_VERSION}")
    return state


@contextlib.contextmanager
def restoring(what: str, made_by: str) -> Iterator[None]:
    """Around the restore of a balancing part's ``state_dict``: a missing key or a value of the wrong type or
    form is one StateError line naming ``what`` and ``made_by``; our own errors raised inside pass as they are."""
    try:
        yield
    except JabasError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise StateError(f"{what} state is malformed ({type(e).__name__}: {e}); give a dict made by {made_by}") \
            from e


# ---------------------------------------------------------------------------------------------
# last value
# ---------------------------------------------------------------------------------------------

class LastValuePredictor:
    """Baseline: the next speed is the last observed one. Exogenous signals are ignored."""

    kind = "last"

    def __init__(self) -> None:
        self.last: float | None = None
        self.n_obs = 0

    def update(self, speed: float, exo: Mapping[str, float] | None = None) -> None:
        v = positive(speed, "speed")
        exo_dict(exo)
        self.last = v
        self.n_obs += 1

    def predict(self) -> float:
        if self.last is None:
            raise ConfigError("no speed observed yet; call update(speed) at least once before predict()")
        return self.last

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": STATE_VERSION, "last": self.last, "n_obs": self.n_obs}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        st = check_state(state, self.kind)
        last = st.get("last")
        self.last = None if last is None else positive(last, "state last")
        self.n_obs = integer(st.get("n_obs", 0), "state n_obs", lo=0, hi=2**62)


# ---------------------------------------------------------------------------------------------
# NARX + RLS
# ---------------------------------------------------------------------------------------------

class NarxPredictor:
    """NARX speed predictor trained online by RLS with forgetting (see the module docstring).

    d: speed lags (>= 1). d_exo: differences of each exogenous signal besides its value in the
    last measured window (>= 0). forgetting: RLS lambda in [0.5, 1] (0.95..0.99 advised). delta:
    initial P = delta * I (prior variance of theta; larger learns faster from few samples).
    min_train: fitted samples before the model is used (default 2 x number of features).
    clip: (lo, hi) multiples of the last speed the prediction is clipped to. exo_names: use only
    these signals (default: every name seen, up to max_exo).
    """

    kind = "narx"

    def __init__(self, d: int = 3, d_exo: int = 1, forgetting: float = 0.97, *, delta: float = 10.0,
                 min_train: int | None = None, clip: tuple[float, float] = (0.25, 4.0),
                 exo_names: Sequence[str] | None = None, max_exo: int = 16) -> None:
        self.d = integer(d, "d (speed lags)", lo=1, hi=MAX_LAGS)
        self.d_exo = integer(d_exo, "d_exo (exogenous lags)", lo=0, hi=MAX_LAGS)
        self.forgetting = number(forgetting, "forgetting", lo=0.5, hi=1.0)
        self.delta = number(delta, "delta", lo=0.0, hi=1e12, lo_open=True)
        self.min_train = None if min_train is None else integer(min_train, "min_train", lo=1, hi=2**31)
        if not isinstance(clip, (tuple, list)) or len(clip) != 2:
            raise ConfigError(f"clip={clip!r} is invalid; give (lo, hi) with 0 < lo <= 1 <= hi, e.g. (0.25, 4)")
        lo = number(clip[0], "clip lo", lo=0.0, hi=1.0, lo_open=True)
        hi = number(clip[1], "clip hi", lo=1.0, hi=1e6)
        self.clip = (lo, hi)
        self.max_exo = integer(max_exo, "max_exo", lo=0, hi=1024)
        if exo_names is not None:
            if isinstance(exo_names, str):
                exo_names = [exo_names]
            names = list(exo_names)
            if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
                raise ConfigError(f"exo_names={exo_names!r} is invalid; give distinct non-empty names")
            if len(names) > self.max_exo:
                raise ConfigError(f"{len(names)} exo_names exceed max_exo={self.max_exo}; raise max_exo")
        self.exo_names = None if exo_names is None else tuple(exo_names)
        self._reset()

    # -- state -----------------------------------------------------------------------------
    def _reset(self) -> None:
        self.names: list[str] = []             # signals in feature order
        self.xscale: dict[str, float] = {}      # E_x: largest |x| seen (0 until a nonzero value)
        self.xhist: dict[str, list[float]] = {}  # last d_exo values, most recent first
        self.xlast: dict[str, float] = {}
        self.yscale = 0.0                       # S: largest speed seen
        self.y: list[float] = []                # last d speeds, most recent first
        dim = self._dim(0)
        self.theta = np.zeros(dim)
        self.P = np.eye(dim) * self.delta
        self.n_obs = 0
        self.n_train = 0
        self.n_resets = 0

    def _dim(self, n_names: int) -> int:
        return 1 + self.d + n_names * (1 + self.d_exo)

    @property
    def dim(self) -> int:
        """Number of features (bias + d speed lags + (1 + d_exo) per signal)."""
        return self._dim(len(self.names))

    @property
    def warmup(self) -> int:
        """Fitted samples needed before the model is used."""
        return self.min_train if self.min_train is not None else 2 * self.dim

    @property
    def last(self) -> float | None:
        return self.y[0] if self.y else None

    @property
    def ready(self) -> bool:
        """True when predict() uses the model (otherwise it returns the last speed)."""
        return self.n_train >= self.warmup and len(self.y) >= self.d

    # -- features --------------------------------------------------------------------------
    def _add_name(self, name: str, value: float) -> None:
        self.names.append(name)
        self.xhist[name] = [value] * self.d_exo      # unknown past: no change (and the window
                                                      # before a first sighting reads the same)
        self.xlast[name] = value
        self.xscale[name] = 0.0
        k = 1 + self.d_exo
        self.theta = np.concatenate([self.theta, np.zeros(k)])
        n = self.P.shape[0]
        P = np.zeros((n + k, n + k))
        P[:n, :n] = self.P
        P[n:, n:] = np.eye(k) * self.delta
        self.P = P

    def _resolve(self, exo: dict[str, float], learn: bool) -> dict[str, float]:
        """Values of every known signal for one window (missing -> last value); learn adds names."""
        if learn:
            for k in exo:
                if k in self.xlast:
                    continue
                if self.exo_names is not None:
                    if k not in self.exo_names:
                        continue
                elif len(self.names) >= self.max_exo:
                    raise ConfigError(f"exogenous signal {k!r} would exceed max_exo={self.max_exo} signals "
                                      f"(have {', '.join(self.names)}); raise max_exo or pass exo_names")
                self._add_name(k, exo[k])
        return {k: exo.get(k, self.xlast[k]) for k in self.names}

    def _features(self, ylags: Sequence[float], xnow: Mapping[str, float]) -> np.ndarray:
        S = self.yscale
        f = [1.0, ylags[0] / S]
        f += [(ylags[j] - ylags[j + 1]) / S for j in range(self.d - 1)]
        for k in self.names:
            E = self.xscale[k] or 1.0
            seq = [xnow[k]] + self.xhist[k]           # x_{t-1}, x_{t-2}, ...: the past only
            f.append(seq[0] / E)
            f += [(seq[j] - seq[j + 1]) / E for j in range(self.d_exo)]
        return np.asarray(f, dtype=float)

    def _rescale(self, S_new: float, E_new: dict[str, float]) -> None:
        """Change of coordinates when scales grow: the fitted function stays the same."""
        c = self.yscale / S_new if self.yscale > 0 else 1.0      # target scale factor
        a = np.ones(self.dim)                                     # feature scale factors
        a[1:1 + self.d] = c
        k = 1 + self.d_exo
        for i, name in enumerate(self.names):
            old, new = self.xscale[name], E_new[name]
            if old > 0:        # (a scale set for the first time: the prior is in the new units)
                a[1 + self.d + i * k: 1 + self.d + (i + 1) * k] = old / new
        if c != 1.0 or np.any(a != 1.0):
            self.theta = c * self.theta / a
            self.P = self.P / np.outer(a, a)
        self.yscale = S_new
        self.xscale.update(E_new)

    # -- API -------------------------------------------------------------------------------
    def update(self, speed: float, exo: Mapping[str, float] | None = None) -> None:
        """Record the measured speed of the window that just ended and the signals during it."""
        v = positive(speed, "speed")
        known = set(self.names)
        xnow = self._resolve(exo_dict(exo), learn=True)
        S_new = max(self.yscale, v)
        E_new = {k: max(self.xscale[k], abs(xnow[k])) for k in self.names}
        self._rescale(S_new, E_new)
        if len(self.y) >= self.d:
            # the sample: what was known before this window (speeds and signals of earlier windows)
            # (a signal first seen in this window has no earlier value: it reads 0 here, never x_t)
            phi = self._features(self.y, {k: (self.xlast[k] if k in known else 0.0) for k in self.names})
            target = (v - self.y[0]) / self.yscale
            self._rls(phi, target)
        self.y = ([v] + self.y)[: self.d]
        for k in self.names:
            if self.d_exo:
                self.xhist[k] = ([self.xlast[k]] + self.xhist[k])[: self.d_exo]
            self.xlast[k] = xnow[k]
        self.n_obs += 1

    def _rls(self, phi: np.ndarray, target: float) -> None:
        lam = self.forgetting
        Pphi = self.P @ phi
        denom = lam + float(phi @ Pphi)
        err = target - float(self.theta @ phi)
        theta = self.theta + Pphi * (err / denom)
        P = (self.P - np.outer(Pphi, Pphi) / denom) / lam
        P = 0.5 * (P + P.T)
        ok = bool(np.all(np.isfinite(theta)) and np.all(np.isfinite(P)))
        if ok:
            # wind-up guard: no direction more uncertain than the prior (eigenvalues <= delta)
            w, V = np.linalg.eigh(P)
            if w[-1] > self.delta or w[0] <= 0:
                P = (V * np.clip(w, 1e-12 * self.delta, self.delta)) @ V.T
                P = 0.5 * (P + P.T)
        if not ok:
            theta = np.zeros_like(self.theta)         # numerical trouble: start the fit over
            P = np.eye(len(phi)) * self.delta
            self.n_train = -1
            self.n_resets += 1
        self.theta, self.P = theta, P
        self.n_train += 1

    def features(self) -> np.ndarray:
        """The feature vector predict() uses for the next window: built only from stored past windows."""
        return self._features(self.y, self.xlast)

    def predict_raw(self) -> float:
        """The model's output without warm-up fallback or clipping (nan before d speeds)."""
        if len(self.y) < self.d:
            return math.nan
        phi = self.features()
        with np.errstate(all="ignore"):
            return float(self.y[0] + self.yscale * float(self.theta @ phi))

    def predict(self) -> float:
        """Predicted speed of the next window from past windows only (module docstring: fallbacks)."""
        if not self.y:
            raise ConfigError("no speed observed yet; call update(speed) at least once before predict()")
        last = self.y[0]
        raw = self.predict_raw()
        if not self.ready or not math.isfinite(raw):
            return last
        lo, hi = self.clip
        return min(max(raw, lo * last), hi * last)

    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly snapshot (configuration and learned state)."""
        return {
            "kind": self.kind, "version": STATE_VERSION,
            "config": {"d": self.d, "d_exo": self.d_exo, "forgetting": self.forgetting, "delta": self.delta,
                       "min_train": self.min_train, "clip": list(self.clip),
                       "exo_names": None if self.exo_names is None else list(self.exo_names),
                       "max_exo": self.max_exo},
            "names": list(self.names), "xscale": dict(self.xscale),
            "xhist": {k: list(v) for k, v in self.xhist.items()}, "xlast": dict(self.xlast),
            "yscale": self.yscale, "y": list(self.y),
            "theta": self.theta.tolist(), "P": self.P.tolist(),
            "n_obs": self.n_obs, "n_train": self.n_train, "n_resets": self.n_resets,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state_dict (configuration included). Invalid state -> ConfigError, self unchanged."""
        st = check_state(state, self.kind)
        try:
            cfg = dict(st["config"])
            cfg["clip"] = tuple(cfg["clip"])
            new = NarxPredictor(**cfg)
            names = [str(n) for n in st["names"]]
            for n in names:
                new._add_name(n, float(st["xlast"][n]))
                new.xscale[n] = float(st["xscale"][n])
                new.xhist[n] = [float(x) for x in st["xhist"][n]]
            new.yscale = float(st["yscale"])
            new.y = [positive(x, "state speed") for x in st["y"]]
            theta = np.asarray(st["theta"], dtype=float)
            P = np.asarray(st["P"], dtype=float)
            new.n_obs = int(st["n_obs"])
            new.n_train = int(st["n_train"])
            new.n_resets = int(st.get("n_resets", 0))
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"narx predictor state is malformed ({type(e).__name__}: {e}); "
                              "give a dict made by NarxPredictor.state_dict()") from None
        dim = new.dim
        if (theta.shape != (dim,) or P.shape != (dim, dim) or len(new.y) > new.d
                or any(len(v) != new.d_exo for v in new.xhist.values())
                or not (np.all(np.isfinite(theta)) and np.all(np.isfinite(P)))):
            raise ConfigError(f"narx predictor state does not match its configuration (expected {dim} "
                              f"features, theta has shape {theta.shape}); give a dict made by state_dict()")
        new.theta, new.P = theta, P
        self.__dict__.update(new.__dict__)


#: Either per-rank model (what ``RankPredictors`` holds).
SpeedModel: TypeAlias = LastValuePredictor | NarxPredictor
