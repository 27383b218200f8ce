"""The admissible bound of the mix search (mixsearch.py's docstring says why it holds). Pure.

:class:`Bound`: the least seconds one epoch can take on a mix; :func:`perf_bound` builds it from the perf
model and what ``scaler.epoch_time_fn`` prices (forecast, period, batch range, micro-batch).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning.space import GRAIN_TOL, TIE_REL


@dataclass(frozen=True)
class Bound:
    """Lower bound of one epoch's seconds on a mix (module docstring): S / sum n_p peak_p + iters(N) * tail(N).

    ``iters``: the fewest iterations an epoch has, an int or a function of N that never increases with N."""

    samples: float
    peak: Mapping[str, float]                  # partition -> samples/s one GPU never exceeds (> 0)
    iters: int | Callable[[int], int] = 0
    tail: Callable[[int], float] | None = None
    floor: Mapping[str, float] = field(default_factory=dict)   # partition -> least compute s per iteration
    #: optional: ``iters`` of an integer array at once (the same counts, element by element)
    iters_vec: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]] | None = None

    def iters_at(self, n: int) -> int:
        return self.iters(n) if callable(self.iters) else int(self.iters)

    def iters_table(self, n_max: int) -> npt.NDArray[np.float64]:
        """``iters_at(max(n, 1))`` for n = 0..n_max, as floats (what the search tabulates)."""
        ns = np.maximum(np.arange(n_max + 1, dtype=np.int64), 1)
        if self.iters_vec is not None:
            return np.asarray(self.iters_vec(ns), dtype=np.float64)
        if not callable(self.iters):
            return np.full(n_max + 1, float(int(self.iters)))
        return np.array([self.iters_at(int(n)) for n in ns], dtype=np.float64)

    def epoch_s(self, theta: float, n: int, floor: float = 0.0) -> float:
        """The bound for a mix of n GPUs, sum n_p peak_p = theta, largest floor of its partitions ``floor``."""
        base = self.samples / theta if theta > 0 else math.inf
        its = self.iters_at(n)
        return max(base, its * floor) + (its * self.tail(max(n, 1)) if self.tail is not None else 0.0)

    def mix_s(self, mix: Mapping[str, int]) -> float:
        m = {p: n for p, n in mix.items() if n}
        return self.epoch_s(sum(n * self.peak[p] for p, n in m.items()), sum(m.values()),
                            max([self.floor.get(p, 0.0) for p in m], default=0.0))


def peak_rate(model: PerfModel, gpu_type: str) -> float:
    """Most samples/s one GPU of the type processes under the perf model: max b / t(b) over 1 <= b <= max_b."""
    prof = model.profile(gpu_type)
    assert prof.max_b is not None
    return float(max(b / t for b, t in enumerate(prof.time_table(prof.max_b), start=1)))


def snapped_iterations(forecast: Sequence[float], period: int, samples: int, B_min: int, B_max: int,
                       b0: int, tie_tol: float) -> Callable[[int], int]:
    """N -> the fewest iterations ``scaler.epoch_time_fn`` can price on N GPUs (the optimal planner).

    Period k's forecast f is snapped (``planning.space.snap_nearest``) to a realisable B within d + tie_tol *
    max(f, 1) of the clamped target c = min(max(f, B_min), B_max), d the distance to the nearest realisable
    B. Every rank runs one micro-batch at least, of b >= b0 (the smallest candidate), so some b0 * M with M
    >= N is within b0 of c when c >= N b0, and none is below N b0 otherwise: B <= Bhat(N) = min(B_max,
    max(c + b0, N b0) + tie_tol * max(f, 1)). Iterating the epoch with Bhat instead of B consumes the
    samples no slower, so it counts no more iterations; Bhat grows with N, the count never does."""
    def iters(n: int) -> int:
        total, left, k = 0, float(samples), 0
        while left > 0:
            last = k >= len(forecast) - 1
            f = float(forecast[min(k, len(forecast) - 1)])
            c = min(max(f, B_min), B_max)
            Bh = min(float(B_max), max(c + b0, n * b0) + tie_tol * max(f, 1.0))
            its = math.ceil(left / Bh) if last else min(period, math.ceil(left / Bh))   # the last B repeats
            total += its
            left -= its * Bh
            k += 1
        return total
    return iters


def snapped_iterations_vec(forecast: Sequence[float], period: int, samples: int, B_min: int, B_max: int,
                           b0: int, tie_tol: float) -> Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
    """:func:`snapped_iterations` for an array of N at once: the same float64 arithmetic, step by step, per
    element (tests/test_mixsearch.py checks the equality)."""
    fs = [float(x) for x in forecast]

    def iters(ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        nb = np.asarray(ns, dtype=np.int64) * b0
        total = np.zeros(len(nb), dtype=np.int64)
        left = np.full(len(nb), float(samples))
        k = 0
        act = left > 0
        while act.any():
            last = k >= len(fs) - 1
            f = fs[min(k, len(fs) - 1)]
            c = min(max(f, B_min), B_max)
            Bh = np.minimum(float(B_max), np.maximum(c + b0, nb[act].astype(np.float64)) + tie_tol * max(f, 1.0))
            its = np.ceil(left[act] / Bh)
            if not last:
                its = np.minimum(float(period), its)
            total[act] += its.astype(np.int64)
            left[act] = left[act] - its * Bh
            k += 1
            act = left > 0
        return total
    return iters


def perf_bound(model: PerfModel, types: Mapping[str, str], samples: int, B_max: int,
               every_rank_runs: bool = True, *, forecast: Sequence[float] | None = None, period: int | None = None,
               B_min: int = 1, micro_batch: int | None = None) -> Bound:
    """The :class:`Bound` of ``scaler.epoch_time_fn`` on this perf model, for an epoch of ``samples`` at
    batches in [B_min, B_max]. ``every_rank_runs``: the optimal planner (else tail(1), ceil(S / B_max)
    iterations, no floor). With the ``forecast`` and ``period`` that epoch_time_fn prices, the iterations follow
    :func:`snapped_iterations` (b0: ``micro_batch``, else the largest of the types' smallest measured b).
    Floor: every rank runs at least one micro-batch of b >= ``micro_batch`` (else the smallest measured b),
    so an iteration computes at least min over those b of t_p(b) + update_s on each partition in the mix."""
    peaks = {t: peak_rate(model, t) for t in set(types.values())}
    if not every_rank_runs:
        return Bound(float(samples), {p: peaks[t] for p, t in types.items()}, math.ceil(samples / max(1, B_max)),
                     lambda n: float(model.allreduce_tail(1)))
    iters: int | Callable[[int], int] = math.ceil(samples / max(1, B_max))
    vec = None
    if forecast and period:
        b0 = micro_batch or max(min(model.profile(t).b) for t in set(types.values()))
        table: dict[int, int] = {}
        count = snapped_iterations(forecast, period, samples, B_min, B_max, b0,
                                   GRAIN_TOL + TIE_REL)  # the widest band snap_nearest may pick from

        def iters_fn(n: int) -> int:
            if n not in table:
                table[n] = count(n)
            return table[n]
        iters = iters_fn
        vec = snapped_iterations_vec(forecast, period, samples, B_min, B_max, b0, GRAIN_TOL + TIE_REL)
    b_lo = micro_batch or min(min(model.profile(t).b) for t in set(types.values()))
    floors = {t: _floor(model, t, b_lo) for t in set(types.values())}
    return Bound(float(samples), {p: peaks[t] for p, t in types.items()}, iters, model.allreduce_tail,
                 {p: floors[t] for p, t in types.items()}, vec)


def _floor(model: PerfModel, gpu_type: str, b_lo: int) -> float:
    """Least seconds a GPU of the type computes per iteration when it runs (>= 1 micro-batch of b >= b_lo)."""
    prof = model.profile(gpu_type)
    assert prof.max_b is not None
    tab = prof.time_table(prof.max_b)[b_lo - 1:]
    return float(min(tab)) + prof.update_s if tab else 0.0
