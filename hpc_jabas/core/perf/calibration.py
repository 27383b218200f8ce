"""Online calibration of the perf model from what the job measures. Pure: plain Python + numpy.

Per rank, the measured compute of an iteration (every micro-batch's forward + backward, the input
pipeline's fetch of its batch included: the trainer times both) is fitted as::

    y  =  factor * x  +  offset * n

    x = the profile's time of the rank's micro-batches, (n-1) t(b) + t(r), divided by the rank's
        declared speed factor (what the planner prices), n = the number of micro-batch calls.

``factor`` is the rank's slowdown against the profile (> 1: slower), ``offset`` seconds per call
that the profile leaves out (data path, launch overhead). Fitted by recursive least squares with
exponential forgetting (``forgetting``: ~1/(1-lambda) iterations of memory, so a drift is followed)
in normalised coordinates theta = [factor, offset / scale] (``scale``: the profile's time of one
call at the first observation), robust to outliers (Huber weights on the a-priori residual, against
a running mean of |residual|), with the wind-up guard of balancing/speed_models.py (no direction more
uncertain than the prior) in the prior's whitened coordinates. The prior is theta = [1, 0] with
variances ``delta`` and ``delta * offset_prior``: when every iteration has the same x / n (one
plan, one b) factor and offset cannot be told apart, and the prior puts the difference into the
factor; each change of b separates them.

The calibrated model (:func:`apply_corrections`) is the profile of each GPU type corrected with the
mean (factor, offset) of its ranks: ``t'(b) = factor * t(b) + offset`` (an emulated profile keeps
its formula: base' = factor base + offset speed, per_sample' = factor per_sample). Per-rank
differences within a type are what the rebalancer's speed factors measure against that model.

:class:`Calibration` holds every rank's fit, is stored in checkpoints (plain floats, lists and
dicts) and as ``calibration.json`` (CALIBRATION_FILE) in the run directory, and seeds the next job
(:meth:`Calibration.seeded`: the same rank on the same type keeps its fit, other ranks start from
their type's mean).
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hpc_jabas.core.config import gpus as _gpus
from hpc_jabas.core.config.validate import number
from hpc_jabas.core.perf.compute_profile import ComputeProfile
from hpc_jabas.errors import ConfigError

CALIBRATION_FILE = "calibration.json"
STATE_VERSION = 1
CHANGE_STREAK = 3                 # consecutive one-sided large residuals that mean a change
FACTOR_RANGE = (0.02, 50.0)        # a fit outside is clipped when used (numerical trouble, not a speed)


class RankCalibration:
    """One rank's fit of ``y = factor * x + offset * n`` (module docstring)."""

    def __init__(self, gpu: str, *, forgetting: float = 0.98, delta: float = 10.0, offset_prior: float = 0.01,
                 huber: float = 3.0, factor: float = 1.0, offset: float = 0.0, scale: float | None = None) -> None:
        self.gpu = _gpus.normalize(gpu)
        self.forgetting = number(forgetting, "forgetting")
        if not 0.5 <= self.forgetting <= 1.0:
            raise ConfigError(f"forgetting={forgetting!r} is invalid; it must be in [0.5, 1]")
        self.delta = number(delta, "delta")
        self.offset_prior = number(offset_prior, "offset_prior")
        self.huber = number(huber, "huber")
        if self.delta <= 0 or self.offset_prior <= 0 or self.huber <= 0:
            raise ConfigError("delta, offset_prior and huber must be > 0")
        self.scale = None if scale is None else number(scale, "scale")
        if self.scale is not None and self.scale <= 0:
            raise ConfigError(f"scale={scale!r} must be > 0")
        self._f0 = number(factor, "factor")
        self._o0 = number(offset, "offset")
        self.prior = np.array([self.delta, self.delta * self.offset_prior])
        self.theta = np.array([self._f0, 0.0])
        self.P = np.diag(self.prior)
        self.resid = 0.0               # running mean of |a-priori residual| (normalised units, per call)
        self.streak = 0                # consecutive large residuals of one sign (+k / -k): a change, not outliers
        self.n_obs = 0
        self.n_resets = 0
        if self.scale is not None:
            self.theta[1] = self._o0 / self.scale

    # -- the fit ----------------------------------------------------------------------------
    @property
    def factor(self) -> float:
        return float(self.theta[0])

    @property
    def offset(self) -> float:
        """Seconds per micro-batch call (0 until the first observation sets the scale)."""
        return float(self.theta[1]) * self.scale if self.scale is not None else self._o0

    def predict(self, x: float, n: int) -> float:
        return self.factor * x + self.offset * n

    def update(self, x: float, n: int, y: float) -> None:
        """One iteration of this rank: profile time x of its n calls, measured seconds y."""
        x, y = number(x, "profile time x"), number(y, "measured time y")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 or x <= 0 or y < 0:
            raise ConfigError(f"calibration sample (x={x}, n={n}, y={y}) is invalid; need x > 0, n >= 1, y >= 0")
        if self.scale is None:
            self.scale = x / n
            self.theta[1] = self._o0 / self.scale
        phi = np.array([x / self.scale, float(n)])
        target = y / self.scale
        err = target - float(self.theta @ phi)
        per_call = abs(err) / n
        w = 1.0
        if self.n_obs >= 3 and self.resid > 0 and per_call > self.huber * self.resid:
            sign = 1 if err > 0 else -1
            self.streak = self.streak + sign if self.streak * sign > 0 else sign
            if abs(self.streak) >= CHANGE_STREAK:
                # the same large miss CHANGE_STREAK times running: the rank changed (a slowdown, a new
                # neighbour), not an outlier: covariance reset, so the fit moves there now
                self.P = np.diag(self.prior)
                self.resid = per_call
                self.streak = 0
                self.n_resets += 1
            else:
                w = self.huber * self.resid / per_call      # Huber: a far outlier counts as k x the typical one
        else:
            self.streak = 0
        # the typical residual learns from clipped residuals, so outliers do not inflate it
        self.resid = per_call if self.n_obs == 0 else 0.9 * self.resid + 0.1 * min(per_call, self.huber * self.resid)
        lam = self.forgetting
        Pphi = self.P @ phi
        denom = lam / w + float(phi @ Pphi)
        theta = self.theta + Pphi * (err / denom)
        P = (self.P - np.outer(Pphi, Pphi) / denom) / lam
        P = 0.5 * (P + P.T)
        if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(P))):
            theta, P = np.array([self._f0, self._o0 / self.scale]), np.diag(self.prior)   # start over
        else:
            # wind-up guard in the prior's whitened coordinates: no direction more uncertain than the prior
            s = np.sqrt(self.prior)
            Pw = P / np.outer(s, s)
            ev, V = np.linalg.eigh(0.5 * (Pw + Pw.T))
            if ev[-1] > 1.0 or ev[0] <= 0:
                Pw = (V * np.clip(ev, 1e-12, 1.0)) @ V.T
                P = 0.5 * (Pw + Pw.T) * np.outer(s, s)
        self.theta, self.P = theta, P
        self.n_obs += 1

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain floats, lists and dicts (checkpoints load with weights_only=True; JSON as well)."""
        return {"kind": "rank_calibration", "version": STATE_VERSION, "gpu": self.gpu,
                "config": {"forgetting": self.forgetting, "delta": self.delta, "offset_prior": self.offset_prior,
                           "huber": self.huber, "factor": self._f0, "offset": self._o0},
                "scale": self.scale, "theta": [float(v) for v in self.theta],
                "P": [[float(v) for v in row] for row in self.P], "resid": float(self.resid), "n_obs": self.n_obs,
                "streak": self.streak, "n_resets": self.n_resets,
                "factor": self.factor, "offset_s": self.offset}

    @classmethod
    def from_state(cls, st: Mapping[str, Any]) -> RankCalibration:
        if not isinstance(st, Mapping) or st.get("kind") != "rank_calibration" or st.get("version") != STATE_VERSION:
            raise ConfigError("rank calibration state is not a RankCalibration.state_dict() of this version")
        try:
            new = cls(str(st["gpu"]), scale=st["scale"], **dict(st["config"]))
            theta = np.asarray(st["theta"], dtype=float)
            P = np.asarray(st["P"], dtype=float)
            new.resid = number(st["resid"], "resid")
            new.n_obs = int(st["n_obs"])
            new.streak = int(st.get("streak", 0))
            new.n_resets = int(st.get("n_resets", 0))
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"rank calibration state is malformed ({type(e).__name__}: {e})") from None
        if theta.shape != (2,) or P.shape != (2, 2) or not (np.all(np.isfinite(theta)) and np.all(np.isfinite(P))):
            raise ConfigError("rank calibration state has a malformed theta or P")
        new.theta, new.P = theta, P
        return new


# ---------------------------------------------------------------------------------------------
# the calibrated model
# ---------------------------------------------------------------------------------------------

def corrected_profile(p: ComputeProfile, factor: float, offset: float) -> ComputeProfile:
    """``p`` with t'(b) = factor * t(b) + offset (kept positive); update_s and max_b unchanged."""
    f = min(max(number(factor, "factor"), FACTOR_RANGE[0]), FACTOR_RANGE[1])
    o = number(offset, "offset")
    src = f"{p.source} | calibrated: x{f:.4g} {o:+.3g}s/call"
    if p.formula is not None:
        fm = p.formula
        base = max(f * fm["base_s"] + o * fm["speed"], 0.0)
        ps = f * fm["per_sample_s"]
        if base + ps <= 0:
            base = f * fm["base_s"]
        if base + ps <= 0:
            return p
        form = {"base_s": base, "per_sample_s": ps, "speed": fm["speed"]}
        return ComputeProfile(p.gpu, list(p.b), [(base + ps * b) / fm["speed"] for b in p.b], update_s=p.update_s,
                              max_b=p.max_b, emulated=p.emulated, source=src, formula=form)
    ts = [max(f * t + o, 1e-3 * f * t) for t in p.t]
    return ComputeProfile(p.gpu, list(p.b), ts, update_s=p.update_s, max_b=p.max_b, emulated=p.emulated, source=src)


def apply_corrections(profiles: Mapping[str, ComputeProfile],
                      corrections: Mapping[str, tuple[float, float]]) -> dict[str, ComputeProfile]:
    """Every profile, corrected by its type's (factor, offset) where one is given."""
    out = {}
    for g, p in profiles.items():
        c = corrections.get(g)
        out[g] = corrected_profile(p, c[0], c[1]) if c is not None else p
    return out


class Calibration:
    """Every rank's fit; ``declared``: each rank's declared speed factor (the planner divides by it)."""

    def __init__(self, ranks: Sequence[RankCalibration], declared: Sequence[float] | None = None,
                 tail_scale: float = 1.0) -> None:
        self.ranks = list(ranks)
        #: measured / modelled tail of an iteration (allreduce + update + synchronisation), a running mean
        self.tail_scale = max(0.0, number(tail_scale, "tail_scale"))
        self.declared = [1.0] * len(self.ranks) if declared is None else [float(v) for v in declared]
        if len(self.declared) != len(self.ranks):
            raise ConfigError(f"{len(self.declared)} declared speed factors for {len(self.ranks)} ranks")

    @classmethod
    def fresh(cls, gpu_types: Sequence[str], declared: Sequence[float] | None = None, **kw: Any) -> Calibration:
        return cls([RankCalibration(g, **kw) for g in gpu_types], declared)

    def type_corrections(self, min_obs: int = 1) -> dict[str, tuple[float, float]]:
        """GPU type -> (mean factor, mean offset) of its ranks with >= min_obs observations.

        The offset is in the model's units (the rank's fitted offset x its declared speed factor)."""
        acc: dict[str, list[tuple[float, float]]] = {}
        for rc, sf in zip(self.ranks, self.declared):
            if rc.n_obs >= min_obs:
                acc.setdefault(rc.gpu, []).append((rc.factor, rc.offset * sf))
        return {g: (sum(v[0] for v in vs) / len(vs), sum(v[1] for v in vs) / len(vs)) for g, vs in acc.items()}

    def apply(self, profiles: Mapping[str, ComputeProfile], min_obs: int = 1) -> dict[str, ComputeProfile]:
        return apply_corrections(profiles, self.type_corrections(min_obs))

    def observe_tail(self, measured_tail: float, modelled_tail: float, rate: float = 0.3) -> None:
        """One window: the measured iteration time minus the slowest rank's predicted finish, against the
        model's allreduce tail; the scale follows their ratio (running mean, rate per window)."""
        if modelled_tail > 0 and math.isfinite(measured_tail):
            r = min(max(measured_tail / modelled_tail, 0.0), 10.0)
            self.tail_scale += rate * (r - self.tail_scale)

    # -- storage ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"kind": "calibration", "version": STATE_VERSION, "declared": list(self.declared),
                "tail_scale": self.tail_scale,
                "ranks": [rc.state_dict() for rc in self.ranks],
                "types": {g: {"factor": f, "offset_s": o} for g, (f, o) in sorted(self.type_corrections().items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "calibration") -> Calibration:
        if not isinstance(d, Mapping) or d.get("kind") != "calibration" or d.get("version") != STATE_VERSION:
            raise ConfigError(f"{where}: not a calibration of version {STATE_VERSION}")
        try:
            return cls([RankCalibration.from_state(s) for s in d["ranks"]], d.get("declared"), d.get("tail_scale", 1.0))
        except (KeyError, TypeError) as e:
            raise ConfigError(f"{where}: malformed calibration ({e})") from None

    def seeded(self, gpu_types: Sequence[str], declared: Sequence[float] | None = None) -> Calibration:
        """A calibration for a job on ``gpu_types``, started from this one (module docstring)."""
        types = self.type_corrections()
        dec = [1.0] * len(gpu_types) if declared is None else list(declared)
        out = []
        for i, g in enumerate(gpu_types):
            g = _gpus.normalize(g)
            if i < len(self.ranks) and self.ranks[i].gpu == g and abs(self.declared[i] - dec[i]) <= 1e-12 * dec[i]:
                out.append(RankCalibration.from_state(self.ranks[i].state_dict()))
            elif g in types:
                f, o = types[g]
                out.append(RankCalibration(g, factor=f, offset=o / dec[i]))
            else:
                out.append(RankCalibration(g))
        return Calibration(out, dec, self.tail_scale)

    def to_json(self) -> str:
        """What :meth:`save` writes (and the run's ``calibration.json``: runtime/calibrate.py)."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"

    def save(self, path: str | os.PathLike[str]) -> str:
        """Written beside ``path`` and renamed into place; the temporary file is never opened through a link."""
        p = os.fspath(path)
        tmp = p + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(self.to_json())
        os.replace(tmp, p)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        from hpc_jabas.core.config.textfile import read_json
        p = os.fspath(path)
        d = read_json(p, "calibration", "a run's calibration.json (JSON)")
        return cls.from_dict(d, p)
