"""Epoch-end auto-scaling: which GPU allocation ("mix") to train the next epochs on. Pure.

A mix maps Slurm partitions to GPU counts, e.g. {"v100": 4, "p100": 2}; every partition has
one GPU type. At each epoch end the job (docs/design.md, section 1; docs/formulas.md, section 7):

1. the mixes the cluster can give now (free GPUs, limits): ``mixsearch.search`` walks them by
   branch-and-bound (cluster scale); ``enumerate_mixes`` lists every one (brute force, small clusters);
2. ``price``: predicted epoch time of each mix (``epoch_time_fn(mix) -> seconds``, injected;
   ``epoch_time_fn(...)`` here builds the real one: the forecast B trajectory snapped to what the
   job's planner realises on the mix, each B's plan priced by the perf model) and its cost
   (GPUs x rate per GPU-hour x hours; the rate is a Slurm billing weight or a catalog price);
3. ``choose``: the best mix for the objective over the remaining epochs. Moving means
   checkpoint, resubmit and resume: it costs the restart overhead in time, and that time on the
   new mix in money. Unlike JABAS's released code (time only, overhead ignored), the comparison
   includes the overhead and a relative margin, so a small predicted gain never triggers a move
   and two nearly equal mixes never ping-pong.

Objectives (over the remaining epochs, moves include the overhead):
- ``time``: least total time;
- ``cost``: least total cost;
- ``time-under-budget``: least time among mixes whose total cost <= budget (if none fits:
  least cost, and the reason says the budget cannot be met);
- ``cost-under-deadline``: least cost among mixes whose total time <= deadline_s, a duration
  from now (if none fits: least time, and the reason says so).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpc_jabas.core.autoscale.overheads import Overheads
from hpc_jabas.core.config import gpus
from hpc_jabas.core.config.defaults import DEFAULT_MARGIN
from hpc_jabas.core.config.defaults import OBJECTIVES as OBJECTIVES
from hpc_jabas.core.config.defaults import RESTART_PRIOR_S as RESTART_PRIOR_S
from hpc_jabas.core.config.validate import integer, number, passes
from hpc_jabas.core.planning import make_planner, snap_nearest
from hpc_jabas.core.planning.planner import PlanSpec
from hpc_jabas.errors import ConfigError, InfeasibleError

Mix = dict[str, int]
EpochTimeFn = Callable[[Mix], "float | None"]

WaitFn = Callable[[Mix], "float | None"]

def _norm_mix(mix: Mapping[str, int]) -> Mix:
    if not isinstance(mix, Mapping):
        raise ConfigError(f"mix {mix!r} is invalid; give a mapping partition -> GPU count")
    out: Mix = {}
    for part, n in mix.items():
        if not passes(integer, n, lo=0, whole_float=False):
            raise ConfigError(f"mix {dict(mix)!r} has count {n!r} for partition {part!r}; counts must be integers >= 0")
        if n:
            out[str(part)] = int(n)
    return dict(sorted(out.items()))


def mix_key(mix: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Hashable, order-independent identity of a mix (zero counts dropped)."""
    return tuple(_norm_mix(mix).items())


def mix_label(mix: Mapping[str, int]) -> str:
    """'p100:2+v100:4' (sorted by partition); '-' for the empty mix."""
    m = _norm_mix(mix)
    return "+".join(f"{p}:{n}" for p, n in m.items()) or "-"


@dataclass(frozen=True)
class Candidate:
    """A mix plus the GPU type of each of its partitions."""

    mix: dict[str, int]
    gpu_types: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        m = _norm_mix(self.mix)
        if not m:
            raise ConfigError("a candidate mix has no GPU; give at least one partition with a count >= 1")
        missing = [p for p in m if p not in self.gpu_types]
        if self.gpu_types and missing:
            raise ConfigError(f"no GPU type given for partition(s) {', '.join(missing)}; "
                              f"known partitions: {', '.join(sorted(self.gpu_types)) or 'none'}")
        object.__setattr__(self, "mix", m)
        object.__setattr__(self, "gpu_types", {p: str(self.gpu_types[p]) for p in m if p in self.gpu_types})

    @property
    def gpus(self) -> int:
        return sum(self.mix.values())

    @property
    def key(self) -> tuple[tuple[str, int], ...]:
        return tuple(self.mix.items())

    def __str__(self) -> str:
        return mix_label(self.mix)

    def to_dict(self) -> dict[str, Any]:
        return {"mix": dict(self.mix), "gpu_types": dict(self.gpu_types)}


def _as_candidate(c: Candidate | Mapping[str, int], types: Mapping[str, str] | None = None) -> Candidate:
    if isinstance(c, Candidate):
        return c
    m = _norm_mix(c)
    return Candidate(m, {p: types[p] for p in m if types and p in types})


def enumerate_mixes(free: Mapping[str, int], types: Mapping[str, str], max_gpus: int, min_gpus: int = 1,
                    allowed: Iterable[str] | None = None, max_partitions: int | None = None) -> list[Mix]:
    """Every mix the cluster can give now: 0..free[p] GPUs per partition, min_gpus..max_gpus in all.

    Brute force: the list grows as prod(free[p] + 1); ``mixsearch.search`` decides at cluster scale.

    ``allowed``: partition names or GPU types to consider (None: all). ``max_partitions``: at most
    this many partitions in one mix (a hetjob with many components is fragile). Returned sorted by
    GPU count, then by partition name and counts: deterministic.
    """
    integer(max_gpus, "max_gpus", lo=1, whole_float=False)
    integer(min_gpus, "min_gpus", lo=1, whole_float=False)
    if min_gpus > max_gpus:
        raise ConfigError(f"min_gpus={min_gpus} is larger than max_gpus={max_gpus}")
    if max_partitions is not None and not passes(integer, max_partitions, lo=1, whole_float=False):
        raise ConfigError(f"max_partitions={max_partitions!r} is invalid; it must be an integer >= 1 or None")
    for part, n in free.items():
        if not passes(integer, n, lo=0, whole_float=False):
            raise ConfigError(f"free GPU count {n!r} for partition {part!r} is invalid; it must be an integer >= 0")
    missing = [p for p in free if p not in types]
    if missing:
        raise ConfigError(f"no GPU type for partition(s) {', '.join(map(str, missing))}; "
                          f"typed partitions: {', '.join(sorted(types)) or 'none'}")
    parts = sorted(free)
    if allowed is not None:
        allowed = [str(a) for a in allowed]
        valid = set(parts) | {types[p] for p in parts}
        unknown = [a for a in allowed if a not in valid]
        if unknown:
            raise ConfigError(f"allowed name(s) {', '.join(unknown)} match no partition or GPU type; "
                              f"valid: {', '.join(sorted(valid))}")
        parts = [p for p in parts if p in allowed or types[p] in allowed]
    parts = [p for p in parts if free[p] > 0]
    maxp = len(parts) if max_partitions is None else max_partitions
    out: list[Mix] = []

    def rec(i: int, cur: dict[str, int], total: int, used: int) -> None:
        if i == len(parts):
            if min_gpus <= total:
                out.append(dict(cur))
            return
        p = parts[i]
        top = min(free[p], max_gpus - total) if used < maxp else 0
        for n in range(0, top + 1):
            if n:
                cur[p] = n
            rec(i + 1, cur, total + n, used + (1 if n else 0))
            cur.pop(p, None)

    rec(0, {}, 0, 0)
    out.sort(key=lambda m: (sum(m.values()), tuple(m.items())))
    return out


@dataclass(frozen=True)
class Estimate:
    """Predicted epoch time (s) and cost of one epoch on a mix; time/cost are None when infeasible."""

    time_s: float | None
    cost: float | None
    feasible: bool = True
    note: str = ""
    rate_per_hour: float = 0.0


def mix_rate(mix: Mapping[str, int], rates: Mapping[str, float]) -> float:
    """Price of holding the mix for one hour: sum of count * rate[partition]."""
    m = _norm_mix(mix)
    missing = [p for p in m if p not in rates]
    if missing:
        raise ConfigError(f"no rate for partition(s) {', '.join(missing)}; "
                          f"rated partitions: {', '.join(sorted(rates)) or 'none'}")
    total = 0.0
    for p, n in m.items():
        r = rates[p]
        if not passes(number, r, lo=0.0):
            raise ConfigError(f"rate {r!r} for partition {p!r} is invalid; a rate per GPU-hour must be a number >= 0")
        total += n * float(r)
    return total


def catalog_rates(types: Mapping[str, str], prices: Mapping[str, float] | None = None) -> dict[str, float]:
    """Rates per GPU-hour from the GPU catalog (gpus.py), partition -> price of its GPU type."""
    return {p: gpus.get(t, dict(prices) if prices is not None else None).price_per_hour for p, t in types.items()}


def price(candidate: Candidate | Mapping[str, int], epoch_time_fn: EpochTimeFn,
          rates: Mapping[str, float]) -> Estimate:
    """Predicted time and cost of one epoch on the candidate.

    ``epoch_time_fn(mix)`` gets a fresh dict partition -> count and returns seconds, or None when
    the mix cannot run the job (e.g. the forecast B does not fit its memory); a ConfigError it
    raises also marks the mix infeasible, its message kept as the note.
    """
    cand = _as_candidate(candidate)
    rate = mix_rate(cand.mix, rates)
    try:
        t = epoch_time_fn(dict(cand.mix))
    except InfeasibleError as e:
        return Estimate(None, None, False, str(e), rate)
    if t is None:
        return Estimate(None, None, False, "infeasible: the performance model has no time for this mix", rate)
    if not passes(number, t, lo=0.0):
        raise ConfigError(f"epoch_time_fn({mix_label(cand.mix)}) returned {t!r}; "
                          "it must return seconds >= 0 or None when infeasible")
    return Estimate(float(t), float(t) / 3600.0 * rate, True, "", rate)


def expand_mix(mix: Mapping[str, int], types: Mapping[str, str]) -> list[str]:
    """Per-rank GPU types of a mix, partitions in sorted order (the order ranks get in a hetjob)."""
    return [types[p] for p in sorted(mix) for _ in range(mix[p])]


def epoch_time_fn(model: Any, types: Mapping[str, str], forecast: Sequence[float], period: int, num_samples: int,
                  cands: Sequence[int] | None = None, *, planner: str = "optimal", B_min: int | None = None,
                  B_max: int | None = None, speeds: Sequence[float] | None = None,
                  spaces: dict[Any, Any] | None = None, overheads: Overheads | None = None,
                  min_micro_batch: int | None = None, spec: PlanSpec | None = None) -> EpochTimeFn:
    """Predicted time of one epoch on a mix, pricing what the trainer would run there.

    The forecast B of each period of ``period`` iterations is first snapped to a B the job's planner
    realises on that mix (``planning.space.snap_nearest``: the nearest realisable B in [B_min, B_max],
    near-ties to the faster; default bounds: the forecast's own range), then that B's plan is
    priced by the perf model, period after period until the epoch's samples are used. ``cands``:
    the job's micro-batch size as a one-element list, or None (the planner chooses);
    ``planner``: 'optimal' or 'lbbsp' (``speeds``: declared per-rank speeds, used when they fit).
    A mix with no realisable B in range is infeasible (InfeasibleError, which ``price`` records).
    ``spaces``: a dict the caller keeps across calls with the same ``model`` and ``types`` (e.g. successive
    epoch-end decisions) in which each mix's batch space is kept and reused: a space depends only on the
    mix, the model, the planner and the range, never on the forecast, so reuse prices exactly as a fresh one.
    ``overheads`` (core/autoscale/overheads.py, measured on the run): every iteration is priced at its
    ``iteration_scale`` (measurement iterations included) and the epoch end's ``epoch_end_s`` is added once.
    Both are >= their no-overhead values, so ``mixsearch.perf_bound`` stays a lower bound.
    ``min_micro_batch``: the job's smallest micro-batch (its trainer's, BatchNorm included; planner.py
    candidate_sizes), so each mix is priced with the sizes its planner would use.
    ``spec``: the job's PlanSpec (the trainer's planner's), in place of ``cands``, ``planner``, ``speeds`` and
    ``min_micro_batch``; each mix's space is its planner's ``pricing_space`` (identical b, no declared factors).
    """
    if not forecast:
        raise ConfigError("the forecast B trajectory is empty; give at least one batch size")
    lo = int(B_min) if B_min is not None else max(1, math.floor(min(forecast)))
    hi = int(B_max) if B_max is not None else max(lo, math.ceil(max(forecast)))
    if spec is None:
        spec = PlanSpec(kind=planner, micro_batch=cands[0] if cands else None, min_micro_batch=min_micro_batch,
                        speeds=None if speeds is None else tuple(speeds))
    ps = spec
    ov = overheads or Overheads()
    scale, end_s = ov.iteration_scale, ov.epoch_end_s

    def fn(mix: Mix) -> float | None:
        gl = expand_mix(mix, types)
        if not gl:
            return None
        skey = (mix_key(mix), ps, lo, hi)
        space = None if spaces is None else spaces.get(skey)
        if space is None:
            space = make_planner(ps, gl, model, identical_b=True, speed_factors=None,
                                 strict_speeds=False).pricing_space(lo, hi)
            if spaces is not None:
                spaces[skey] = space
        total, left, k = 0.0, num_samples, 0
        while left > 0:
            B = snap_nearest(space, float(forecast[min(k, len(forecast) - 1)]))
            T = space.iter_time(B)
            assert T is not None
            its = min(period, math.ceil(left / B))
            total += its * T * scale
            left -= its * B
            k += 1
        return total + end_s
    return fn


@dataclass(frozen=True)
class Choice:
    """The decision: the mix to run next, why, and the priced table (JSON-ready rows)."""

    mix: dict[str, int]
    reason: str
    table: list[dict[str, Any]]
    move: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"mix": dict(self.mix), "reason": self.reason, "move": self.move, "table": self.table}


class RestartOverhead:
    """Restart overhead estimate: a prior until the first measurement, then the mean of measurements."""

    def __init__(self, prior_s: float = RESTART_PRIOR_S) -> None:
        self.prior_s = self._check(prior_s, "prior_s")
        self.measured: list[float] = []

    @staticmethod
    def _check(x: Any, name: str) -> float:
        if not passes(number, x, lo=0.0):
            raise ConfigError(f"{name}={x!r} is invalid; a restart overhead must be a number of seconds >= 0")
        return float(x)

    def record(self, seconds: float) -> None:
        self.measured.append(self._check(seconds, "measured restart"))

    @property
    def seconds(self) -> float:
        return sum(self.measured) / len(self.measured) if self.measured else self.prior_s

    def state_dict(self) -> dict[str, Any]:
        return {"prior_s": self.prior_s, "measured": list(self.measured)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prior_s = self._check(state["prior_s"], "prior_s")
        self.measured = [self._check(x, "measured restart") for x in state.get("measured", [])]


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(float(x), 6)


def choose(current_mix: Mapping[str, int], candidates: Iterable[Candidate | Mapping[str, int]],
           epoch_time_fn: EpochTimeFn, rates: Mapping[str, float], objective: str,
           restart_overhead_s: float | RestartOverhead, margin: float = DEFAULT_MARGIN,
           budget: float | None = None, deadline_s: float | None = None,
           remaining_epochs: float = 1, wait_fn: WaitFn | None = None,
           max_queue_wait_s: float | None = None) -> Choice:
    """Pick the mix for the remaining epochs; stay unless moving wins by more than ``margin``.

    Totals over ``remaining_epochs``: staying costs R * epoch; moving costs R * epoch plus the
    restart overhead (time) and overhead x rate of the new mix (cost). The best candidate replaces
    the current mix only when its total objective value is below (1 - margin) x the current one's,
    or when it satisfies the budget/deadline that the current mix violates, or when the current
    mix is infeasible. Nothing feasible: stay, and the reason says so.
    ``budget``: money left for the remaining epochs; ``deadline_s``: seconds left from now.
    ``wait_fn(mix)``: expected queue wait (s) before a job on the mix starts, None when it cannot start;
    a move's total time adds it (its cost does not: nothing is billed while pending); a candidate
    that cannot start or waits more than ``max_queue_wait_s`` is listed, never chosen.
    """
    obj, overhead = _check_choice(objective, restart_overhead_s, margin, remaining_epochs, budget, deadline_s)
    R = remaining_epochs
    cur = _norm_mix(current_mix)
    cur_key = tuple(cur.items())
    limits = _Limits(obj, budget, deadline_s)
    rows = [_priced_row(c, c.key == cur_key, epoch_time_fn, rates, wait_fn, max_queue_wait_s, overhead, R, limits)
            for c in _with_current(cur, candidates)]

    def finish(mix: Mix, reason: str) -> Choice:
        return _finish(rows, cur_key, mix, reason, wait_fn is not None)

    feasible = [r for r in rows if r["feasible"]]
    if not feasible:
        return finish(cur, "no feasible candidate; staying on the current mix " + mix_label(cur))
    pool, primary, limit_note = _ranked_pool(obj, feasible, budget, deadline_s)
    best = _best_of(pool, primary)
    unit = "s" if primary == "time" else ""
    prefix = (limit_note + "; ") if limit_note else ""
    over = f"({primary} {_metric(best, primary):.6g}{unit} over {R:g} epochs)"
    stay_row = next((r for r in rows if r["current"]), None)
    if best["current"]:
        return finish(cur, f"{prefix}current mix {mix_label(cur)} is best for {obj} {over}")
    if stay_row is None or not stay_row["feasible"]:
        why = "no current mix" if stay_row is None else "current mix is infeasible"
        return finish(best["mix"], f"{prefix}{why}; moving to {best['label']} {over}")
    if obj in ("time-under-budget", "cost-under-deadline") and best["within_limit"] and not stay_row["within_limit"]:
        limit = "budget" if obj == "time-under-budget" else "deadline"
        return finish(best["mix"], f"current mix {mix_label(cur)} breaks the {limit}; moving to {best['label']} {over}")
    # here the current mix is in the ranked pool too: apply the margin (hysteresis)
    new_v, old_v = _metric(best, primary), _metric(stay_row, primary)
    gain = (old_v - new_v) / old_v if old_v > 0 else 0.0
    if new_v < old_v and new_v <= old_v * (1.0 - margin):
        return finish(best["mix"], f"{prefix}moving {mix_label(cur)} -> {best['label']}: {primary} "
                                   f"{old_v:.6g}{unit} -> {new_v:.6g}{unit} over {R:g} epochs incl. restart "
                                   f"overhead {overhead:.0f} s ({gain:.1%} better, margin {margin:.0%})")
    return finish(cur, f"{prefix}staying on {mix_label(cur)}: best other {best['label']} gains "
                       f"{gain:.1%} in {primary} incl. restart overhead {overhead:.0f} s, "
                       f"below the margin {margin:.0%}")


def _check_choice(objective: str, restart_overhead_s: float | RestartOverhead, margin: float, R: float,
                  budget: float | None, deadline_s: float | None) -> tuple[str, float]:
    """``choose``'s inputs checked (one ConfigError line each): (canonical objective, restart overhead s)."""
    obj = str(objective).strip().lower().replace("_", "-")
    if obj not in OBJECTIVES:
        raise ConfigError(f"unknown objective {objective!r}; valid objectives: {', '.join(OBJECTIVES)}")
    overhead = restart_overhead_s.seconds if isinstance(restart_overhead_s, RestartOverhead) else \
        RestartOverhead._check(restart_overhead_s, "restart_overhead_s")
    if not passes(number, margin, lo=0.0, hi=1.0, hi_open=True):
        raise ConfigError(f"margin={margin!r} is invalid; it must be a fraction in [0, 1), e.g. 0.05")
    if not passes(number, R, lo=0.0, lo_open=True):
        raise ConfigError(f"remaining_epochs={R!r} is invalid; it must be a number > 0")
    if obj == "time-under-budget":
        if not passes(number, budget, lo=0.0, finite=False):
            raise ConfigError(f"objective 'time-under-budget' needs budget >= 0 (money left), got {budget!r}")
    if obj == "cost-under-deadline":
        if not passes(number, deadline_s, lo=0.0, finite=False):
            raise ConfigError("objective 'cost-under-deadline' needs deadline_s >= 0 (seconds left), "
                              f"got {deadline_s!r}")
    return obj, overhead


def _with_current(cur: Mix, candidates: Iterable[Candidate | Mapping[str, int]]) -> list[Candidate]:
    """The current mix (when there is one) first, then each other candidate once."""
    cands: list[Candidate] = []
    seen: set[tuple[tuple[str, int], ...]] = set()
    if cur:
        cands.append(Candidate(cur))
        seen.add(tuple(cur.items()))
    for c in candidates:
        cc = _as_candidate(c)
        if cc.key not in seen:
            seen.add(cc.key)
            cands.append(cc)
    return cands


@dataclass(frozen=True)
class _Limits:
    objective: str
    budget: float | None
    deadline_s: float | None


def _priced_row(c: Candidate, stay: bool, epoch_time_fn: EpochTimeFn, rates: Mapping[str, float],
                wait_fn: WaitFn | None, max_queue_wait_s: float | None, overhead: float, R: float,
                limits: _Limits) -> dict[str, Any]:
    """One row of the table: the candidate's epoch estimate, its queue wait, its totals over R epochs (a move
    adds the restart overhead and the wait) and whether it keeps the objective's budget or deadline."""
    est = price(c, epoch_time_fn, rates)
    wait = 0.0 if stay or wait_fn is None or not est.feasible else wait_fn(dict(c.mix))
    if wait is None or (max_queue_wait_s is not None and wait > max_queue_wait_s):
        est = Estimate(None, None, False, "cannot start: the queue gives no expected start" if wait is None
                       else f"expected queue wait {wait:.0f} s > max_queue_wait_s {max_queue_wait_s:g}")
    row: dict[str, Any] = {
        "mix": dict(c.mix), "label": str(c), "gpus": c.gpus, "current": stay, "time_s": _rounded(est.time_s),
        "cost": _rounded(est.cost), "rate_per_hour": _rounded(est.rate_per_hour), "feasible": est.feasible,
        "total_time_s": None, "total_cost": None, "within_limit": None, "chosen": False, "note": est.note}
    if wait_fn is not None:
        row["wait_s"] = _rounded(wait)
    if est.feasible and est.time_s is not None and est.cost is not None:
        move_t = 0.0 if stay else overhead
        total_t = R * est.time_s + move_t + (wait or 0.0)
        total_c = R * est.cost + move_t / 3600.0 * est.rate_per_hour
        row["total_time_s"], row["total_cost"] = _rounded(total_t), _rounded(total_c)
        row["_t"], row["_c"] = total_t, total_c
        if limits.objective == "time-under-budget":
            row["within_limit"] = total_c <= float(limits.budget or 0.0) + 1e-12
        elif limits.objective == "cost-under-deadline":
            row["within_limit"] = total_t <= float(limits.deadline_s or 0.0) + 1e-9
        if not stay and overhead:
            row["note"] = f"includes restart overhead {overhead:.0f} s"
    return row


def _finish(rows: list[dict[str, Any]], cur_key: tuple[tuple[str, int], ...], mix: Mix, reason: str,
            priced_wait: bool) -> Choice:
    """The Choice of ``mix``: the rows marked (chosen) and stripped of their raw totals."""
    key = mix_key(mix)
    for r in rows:
        r.pop("_t", None)
        r.pop("_c", None)
        r["chosen"] = tuple(sorted(r["mix"].items())) == key
        if r["chosen"] and priced_wait:
            reason += f"; queue wait priced {r['wait_s'] or 0.0:.0f} s"
    return Choice(dict(mix), reason, rows, move=key != cur_key)


def _metric(r: dict[str, Any], which: str) -> float:
    return float(r["_t"] if which == "time" else r["_c"])


def _best_of(rs: list[dict[str, Any]], primary: str) -> dict[str, Any]:
    secondary = "cost" if primary == "time" else "time"
    return min(rs, key=lambda r: (_metric(r, primary), _metric(r, secondary), r["gpus"],
                                  tuple(sorted(r["mix"].items()))))


def _ranked_pool(obj: str, feasible: list[dict[str, Any]], budget: float | None, deadline_s: float | None
                 ) -> tuple[list[dict[str, Any]], str, str]:
    """(the rows the objective ranks, what it minimises, a note when its limit cannot be kept)."""
    if obj in ("time", "cost"):
        return feasible, obj, ""
    fits = [r for r in feasible if r["within_limit"]]
    if obj == "time-under-budget":
        if fits:
            return fits, "time", ""
        return feasible, "cost", f"no mix stays under the budget {budget:g}; minimising cost instead"
    if fits:
        return fits, "cost", ""
    return feasible, "time", f"no mix meets the deadline {deadline_s:g} s; minimising time instead"


def replan(pending_mix: Mapping[str, int], free: Mapping[str, int], types: Mapping[str, str],
           unavailable: Iterable[str], table: Sequence[Mapping[str, Any]] | None = None,
           rates: Mapping[str, float] | None = None, objective: str = "time", max_gpus: int | None = None,
           max_partitions: int | None = None) -> Mix | None:
    """The next-best mix for a job that pends on ``unavailable`` partitions (drained, down): None when none fits.

    With the priced ``table`` of the decision that chose ``pending_mix`` (:func:`choose`'s rows), its ranking:
    the best feasible row by ``objective`` (total time, else total cost; the budget/deadline rows within the
    limit first) whose partitions avoid ``unavailable`` and whose counts fit ``free``. Without a table (or no
    row fits): the mixes the cluster can give now without those partitions, at most as many GPUs as the
    pending mix: the most GPUs, then the lowest rate (``rates``, else the catalog's), then the name."""
    bad = {str(p) for p in unavailable}
    want = sum(int(n) for n in pending_mix.values())

    def fits(m: Mapping[str, int]) -> bool:
        return bool(m) and all(p not in bad and 0 < int(n) <= int(free.get(p, 0)) for p, n in m.items())

    obj = str(objective).strip().lower().replace("_", "-")
    primary = "total_cost" if obj in ("cost", "cost-under-deadline") else "total_time_s"
    secondary = "total_time_s" if primary == "total_cost" else "total_cost"
    rows = [r for r in (table or []) if r.get("feasible") and r.get(primary) is not None and fits(r.get("mix") or {})]
    if rows:
        best = min(rows, key=lambda r: (r.get("within_limit") is False, float(r[primary]),
                                        float(r.get(secondary) or 0.0), tuple(sorted(r["mix"].items()))))
        return _norm_mix(best["mix"])
    avail = {p: int(n) for p, n in free.items() if p not in bad and p in types and int(n) > 0}
    if not avail or want < 1:
        return None
    top = min(want, max_gpus or want)
    mixes = enumerate_mixes(avail, {p: types[p] for p in avail}, max_gpus=top, min_gpus=1,
                            max_partitions=max_partitions)
    if not mixes:
        return None
    r = dict(rates) if rates and all(p in rates for p in avail) else catalog_rates({p: types[p] for p in avail})
    return _norm_mix(min(mixes, key=lambda m: (-sum(m.values()), mix_rate(m, r), tuple(sorted(m.items())))))
