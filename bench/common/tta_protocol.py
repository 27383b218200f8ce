"""The fair protocol's pure pieces (bench/adaptive_tta.py --fair): plain numbers in, plain numbers out.

- ``crossing_time``: the time a run's accuracy curve first reaches a target, interpolated linearly between the two
  evaluations that bracket it (evaluations every quarter epoch with the clock paused), inf if it never does.
- ``targets``: a task's two targets from fixed-32's curves on the selection seeds: mid-curve (the median accuracy
  at a fraction of the budget) and plateau (the median final accuracy less two standard deviations over seeds).
- ``choose_reference``: the reference fixed configuration, chosen on the selection seeds (the fastest whose
  median final accuracy is within ``tol`` of fixed-32's), and scored by its time on FRESH seeds, so a lucky
  outlier of the selection seeds does not set the bar (AlgoPerf re-runs its target-setting configuration).
- ``profile`` and ``summary``: a performance profile over (task, target) pairs, a miss counting as infinite, the
  geometric-mean regret, the worst regret and the misses.
- ``one_run_vs_grid``: one adaptive run's time over the whole grid's time (what a user saves by not sweeping).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

#: the performance profile's thresholds
TAUS = (1.10, 1.25, 1.5)
#: the reference: the fastest fixed configuration ending within this many accuracy points of fixed-32's final
ACC_TOL_PTS = 0.5


def crossing_time(points: Sequence[tuple[float, float]], target: float) -> float:
    """``points``: (time, accuracy) in time order, the first one the evaluation before training (time 0). The
    first time the piecewise-linear curve through them reaches ``target``: the first point's time if it already
    does, else the linear interpolation between the last point below the target and the first at or above it;
    inf if no point reaches it."""
    prev: tuple[float, float] | None = None
    for t, a in points:
        if a >= target:
            if prev is None:
                return float(t)
            t0, a0 = prev
            return float(t0 + (target - a0) / (a - a0) * (t - t0))
        prev = (t, a)
    return math.inf


def targets(mid_accs: Sequence[float], finals: Sequence[float], sd_mult: float = 2.0) -> tuple[float, float]:
    """(mid, plateau): the median of ``mid_accs`` (fixed-32's accuracy at the mid-curve fraction of the budget, one
    per selection seed); the median of ``finals`` less ``sd_mult`` sample standard deviations (0 with one seed)."""
    sd = statistics.stdev(finals) if len(finals) > 1 else 0.0
    return float(statistics.median(mid_accs)), float(statistics.median(finals) - sd_mult * sd)


def choose_reference(select_times: Mapping[str, Sequence[float]], select_finals: Mapping[str, Sequence[float]],
                     base_final: float, tol: float = ACC_TOL_PTS / 100) -> str | None:
    """The reference configuration, chosen on the selection seeds only: among the configurations whose median
    final accuracy is at least ``base_final - tol`` (fractions, not points), the one with the smallest median time
    to the target (a tie: the first name in sorted order); None where none qualifies or none reaches the target.
    Its score is then its median time on fresh seeds (``fresh_score``), never these times."""
    ok = [k for k in sorted(select_times)
          if statistics.median(select_finals[k]) >= base_final - tol - 1e-12
          and math.isfinite(statistics.median(select_times[k]))]
    if not ok:
        return None
    return min(ok, key=lambda k: (statistics.median(select_times[k]), k))


def fresh_score(fresh_times: Sequence[float]) -> float:
    """A configuration's score: its median time on the fresh seeds (inf where most missed)."""
    return float(statistics.median(fresh_times)) if fresh_times else math.nan


def regret(method_times: Sequence[float], reference_times: Sequence[float]) -> float:
    """median(method) / median(reference) over the fresh seeds; inf where the method's median is a miss (and the
    reference's is not); nan where the reference's median is a miss."""
    m, r = fresh_score(method_times), fresh_score(reference_times)
    if not math.isfinite(r):
        return math.nan
    return math.inf if math.isinf(m) else m / r


def profile(regrets: Sequence[float], taus: Sequence[float] = TAUS) -> dict[float, float]:
    """The performance profile: for each tau, the fraction of the (task, target) pairs whose regret is at most tau
    (a miss, inf, is never within; nan pairs are left out)."""
    v = [r for r in regrets if not math.isnan(r)]
    return {tau: (sum(r <= tau + 1e-12 for r in v) / len(v) if v else math.nan) for tau in taus}


def geomean(values: Sequence[float]) -> float:
    """The geometric mean; inf if any value is inf (a miss); nan values are left out."""
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return math.nan
    if any(math.isinf(x) for x in v):
        return math.inf
    return math.exp(sum(math.log(x) for x in v) / len(v))


def summary(regrets: Sequence[float]) -> dict[str, float]:
    """regret_geomean, regret_worst, misses (pairs at inf), profile_110, profile_125, profile_150."""
    v = [r for r in regrets if not math.isnan(r)]
    prof = profile(v)
    return {"regret_geomean": geomean(v), "regret_worst": max(v) if v else math.nan,
            "misses": float(sum(math.isinf(r) for r in v)),
            "profile_110": prof[1.10], "profile_125": prof[1.25], "profile_150": prof[1.5]}


def one_run_vs_grid(run_time: float, grid_times: Sequence[float]) -> float:
    """One adaptive run's time to the end over the sum of the grid's runs' times to the end (same seed)."""
    total = sum(grid_times)
    return run_time / total if total > 0 else math.nan
