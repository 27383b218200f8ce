"""Online per-rank speed prediction for LB-BSP (docs/formulas.md, section 6). Pure: plain Python + numpy.

LB-BSP splits the fixed global batch in proportion to each worker's *predicted* speed of the next
window, the prediction coming from a NARX model (nonlinear autoregressive with exogenous inputs)
of the worker's past speeds and its host's load. This module keeps one small online model per rank.

What is predicted
-----------------
A **speed**: any positive rate where larger means faster, e.g. samples/s or micro-batches/s of a
rank's compute, or its *speed factor* (profiled time / measured time, as the controller measures
it over a balancing window), which is what the planner consumes. Rates rather
than times, because LB-BSP's share rule is linear in speed (x_i = B v_i / sum v). The models are
scale-free: feeding samples/s or speed factors gives the same relative predictions.

Protocol, per window t (one window = one or more iterations with one measurement)::

    v_hat = p.predict()             # from windows t-1, t-2, ... only: no signal of window t
    ...window t runs...
    p.update(v_t, exo_t)            # v_t: measured speed of window t; exo_t: signals measured during it

``exo`` is a dict of named floats (host CPU / memory utilisation, GPU utilisation, clock, power,
...). The set of names is discovered on the fly (or fixed with ``exo_names``); a name missing
from one window's dict, or given as NaN/inf (telemetry that failed), holds its last observed value
(0.0 if never seen); names first seen later start with zero weight. There is deliberately no way
to hand the predictor signals of the window it predicts: on the real path nobody has them (the
controller measures a window's signals when the window has ended), and a benchmark or test that
passes them scores an oracle, not the predictor.

The models (balancing/speed_models.py): ``LastValuePredictor`` (the baseline) and ``NarxPredictor`` (linear
NARX in increments fitted by recursive least squares with forgetting; the docstring of
speed_models.py explains the model, the normalisation and the fallbacks of ``predict``).

RankPredictors keeps one predictor per rank plus the running mean absolute relative error of its
own one-step predictions and of the last-value baseline over the same steps (``error_report``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from hpc_jabas.core.balancing.speed_models import (
    STATE_VERSION,
    LastValuePredictor,
    NarxPredictor,
    SpeedModel,
    check_state,
    exo_dict,
    restoring,
)
from hpc_jabas.core.config.validate import integer, positive
from hpc_jabas.errors import ConfigError, StateError

# ---------------------------------------------------------------------------------------------
# one per rank
# ---------------------------------------------------------------------------------------------

_KINDS: dict[str, type[NarxPredictor] | type[LastValuePredictor]] = {"narx": NarxPredictor, "last": LastValuePredictor}

#: Signals for every rank: one dict for all ranks, one dict (or None) per rank, or None.
ExoArg: TypeAlias = Sequence[Mapping[str, float] | None] | Mapping[str, float] | None


class RankPredictors:
    """One predictor per rank plus running one-step error statistics.

    ``predict()`` remembers its predictions and the last observed speeds; the next ``update()``
    scores both against what was observed: ``mean_abs_rel_error`` (this predictor) and
    ``lastvalue_error`` (the last-value baseline), mean over every (step, rank) pair that had a
    prediction, a previous observation and a new observation. Steps without a preceding
    predict() are not scored. A rank whose speed is ``None`` in update() (it ran nothing, e.g. a
    dropped rank) is neither updated nor scored.
    """

    def __init__(self, n_ranks: int, kind: str = "narx", **kwargs: Any) -> None:
        self.n_ranks = integer(n_ranks, "n_ranks", lo=1, hi=1_000_000)
        if kind not in _KINDS:
            raise ConfigError(f"predictor kind={kind!r} is unknown; use one of: {', '.join(_KINDS)}")
        if kind == "last" and kwargs:
            raise ConfigError(f"the 'last' predictor takes no options (got {', '.join(sorted(kwargs))})")
        self.kind = kind
        self.kwargs = dict(kwargs)
        self.ranks: list[SpeedModel] = [_KINDS[kind](**kwargs) for _ in range(self.n_ranks)]
        self._pending: list[float | None] | None = None
        self._pending_last: list[float | None] | None = None
        self.n_scored = 0
        self._err_sum = 0.0
        self._base_sum = 0.0

    def __len__(self) -> int:
        return self.n_ranks

    def __getitem__(self, rank: int) -> SpeedModel:
        return self.ranks[rank]

    def _per_rank(self, exo: Any, what: str) -> list[Mapping[str, float] | None]:
        if exo is None:
            return [None] * self.n_ranks
        if isinstance(exo, Mapping):                       # the same signals for every rank
            return [exo] * self.n_ranks
        if not isinstance(exo, (list, tuple)) or len(exo) != self.n_ranks:
            raise ConfigError(f"{what} must be None, one dict for all ranks, or a list of {self.n_ranks} "
                              f"dicts (one per rank); got {exo!r}")
        return list(exo)

    def update(self, speeds: Sequence[float | None], exo: ExoArg = None) -> None:
        """Measured speed of every rank for the window that just ended (None: not measured)."""
        if isinstance(speeds, (str, bytes)) or not isinstance(speeds, Sequence) or len(speeds) != self.n_ranks:
            raise ConfigError(f"speeds={speeds!r} is invalid; give a list of {self.n_ranks} speeds (one per rank)")
        vs = [None if s is None else positive(s, f"speed of rank {i}") for i, s in enumerate(speeds)]
        xs = self._per_rank(exo, "exo")
        for i, x in enumerate(xs):
            exo_dict(x, f"exo of rank {i}")
        pending, pending_last = self._pending, self._pending_last
        if pending is not None and pending_last is not None:
            for i, v in enumerate(vs):
                p, last = pending[i], pending_last[i]
                if v is None or p is None or last is None:
                    continue
                self._err_sum += abs(p - v) / v
                self._base_sum += abs(last - v) / v
                self.n_scored += 1
        self._pending = self._pending_last = None
        for r, v, x in zip(self.ranks, vs, xs):
            if v is not None:
                r.update(v, x)

    def predict(self, default: float | None = None) -> list[float]:
        """Predicted speed of every rank for the next window, from past windows only.

        A rank with no observation yet gets ``default``; without a default that is a ConfigError.
        """
        out: list[float] = []
        pend: list[float | None] = []
        lasts: list[float | None] = []
        for i, r in enumerate(self.ranks):
            if r.last is None:
                if default is None:
                    raise ConfigError(f"rank {i} has no observed speed yet; update() it first or pass default=")
                out.append(positive(default, "default"))
                pend.append(None)
                lasts.append(None)
                continue
            p = r.predict()
            out.append(p)
            pend.append(p)
            lasts.append(r.last)
        self._pending, self._pending_last = pend, lasts
        return out

    @property
    def mean_abs_rel_error(self) -> float:
        """Mean |predicted - observed| / observed of this predictor's scored steps (nan if none)."""
        return self._err_sum / self.n_scored if self.n_scored else math.nan

    @property
    def lastvalue_error(self) -> float:
        """The same for the last-value baseline over the same (step, rank) pairs."""
        return self._base_sum / self.n_scored if self.n_scored else math.nan

    def error_report(self) -> dict[str, Any]:
        return {"predictor_error": self.mean_abs_rel_error, "lastvalue_error": self.lastvalue_error,
                "scored": self.n_scored, "kind": self.kind}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "ranks", "version": STATE_VERSION, "predictor": self.kind, "kwargs": dict(self.kwargs),
                "n_ranks": self.n_ranks, "ranks": [r.state_dict() for r in self.ranks],
                "n_scored": self.n_scored, "err_sum": self._err_sum, "base_sum": self._base_sum}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        st = check_state(state, "ranks")
        with restoring("rank predictor", "RankPredictors.state_dict()"):
            kind, kwargs, n = st["predictor"], dict(st["kwargs"]), st["n_ranks"]
            kwargs = {k: tuple(v) if k == "clip" else v for k, v in kwargs.items()}
            new = RankPredictors(n, kind, **kwargs)
            if len(st["ranks"]) != new.n_ranks:
                raise StateError(f"rank predictor state has {len(st['ranks'])} ranks, expected {new.n_ranks}")
            for r, s in zip(new.ranks, st["ranks"]):
                r.load_state_dict(s)
            new.n_scored = int(st["n_scored"])
            new._err_sum = float(st["err_sum"])
            new._base_sum = float(st["base_sum"])
        self.__dict__.update(new.__dict__)
