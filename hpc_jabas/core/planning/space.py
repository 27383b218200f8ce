"""Which global batch sizes a job can run, and the rule that turns a policy's wish into one. Pure.

A planner realises only some global batch sizes exactly (B = b * sum(n_i), b from a candidate
list, every rank running at least one micro-batch with the ``optimal`` planner; B a multiple of
the micro-batch size with ``lbbsp``). ``BatchSpace`` is that set within [B_min, B_max] for one
GPU mix, each B with the perf model's predicted iteration time of the plan the planner returns.
Build one with a planner's ``batch_space`` (planning/planner.py: ``make_planner``; ``job_batch_space``
for the controller and the auto-scaler), ``optimal_space`` or ``planner_space``.

The direction-preserving rule (``snap_toward``), used for every planner:

- ``grow``: B' is the realisable B' > B nearest the target; B' == B only when no realisable B'
  exists in (B, B_max] (B is already the largest one);
- ``shrink``: the same below B, in [B_min, B);
- ``stay``: B' == B;
- ties (two realisable B' equally near the target, within 1e-9 relative): the one nearer the
  current B, then the smaller.

The rule reads only the set of realisable B, never the predicted times: two mixes that realise
the same B give the same B' for the same wish (allocation invariance), and grow and shrink round
to the nearest realisable B alike, so alternating them does not drift (an earlier rule broke
near-ties within 2.5% by throughput, which on a per-rank space always favoured the larger B:
grow landed near +12.5%, shrink near -8%). The similarity policy keeps the unrounded target
between decisions (policy.py), so rounding errors do not add up either.

One preference remains, mix-independent and only on an identical-b space with the default
(power-of-two) candidates, where every B >= #ranks is realisable but an odd B only with b = 1
(e.g. 141 = 3 x 47: 141 one-sample micro-batches, many times slower per sample than b = 16, and
BatchNorm cannot train on one sample): among the realisable B' within 2.5% of the target beyond
the nearest, the one with the largest power-of-two factor up to 8 (``grain_of``, a function of B
alone) wins, then the nearest. Per-rank spaces, a pinned micro_batch and lbbsp have no preference:
there every realisable B runs with full-size micro-batches.

A policy that picks a B directly (the goodput policy, direction ``set``) gets its B when it is
realisable, else the realisable B nearest it (ties: the one nearer the current B, then the
smaller); the auto-scaler's forecast values use ``snap_nearest``: the realisable B nearest the
target, ties to the smaller, so a forecast does not depend on the mix it is priced on. A current
B that is outside [B_min, B_max] or not realisable (e.g. after a move to another mix) is pulled
to the nearest realisable B; the note says so. Every ``Snapped`` carries a note that says when a
decision could not move.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpc_jabas.core.config.defaults import KNEE_RISE
from hpc_jabas.core.config.validate import integer, number, passes
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning.identical import plan_range
from hpc_jabas.core.planning.plan import Plan
from hpc_jabas.core.planning.prices import per_rank_times
from hpc_jabas.errors import ConfigError, InfeasibleError

GROW, SHRINK, STAY, SET = "grow", "shrink", "stay", "set"
DIRECTIONS = (GROW, SHRINK, STAY, SET)
TIE_REL = 1e-9           # two distances to a target within this (relative) are a tie
GRAIN_TOL = 0.025        # grain spaces: how much further (relative to the target) a rounder B may be
GRAIN_CAP = 8            # ... and how round is round enough: a power-of-two factor of 8
FULL_TABLE = 1 << 13     # ranges up to this wide are tabulated once, wider ones per window

Row = tuple[int, "float | None"]
RowsFn = Callable[[int, int], Sequence[Row]]


class BatchSpace:
    """The realisable global batch sizes in [B_min, B_max] and their predicted iteration times.

    ``rows_fn(lo, hi)`` returns (B, seconds or None) for every realisable B in [lo, hi], ascending
    (seconds None: no perf model, every B runs equally fast per sample... i.e. unknown).
    """

    def __init__(self, B_min: int, B_max: int, rows_fn: RowsFn, label: str = "", grain: bool = False) -> None:
        if isinstance(B_min, bool) or isinstance(B_max, bool) or not isinstance(B_min, int) \
                or not isinstance(B_max, int) or not 1 <= B_min <= B_max:
            raise ConfigError(f"batch range B_min={B_min!r}, B_max={B_max!r} is invalid; need 1 <= B_min <= B_max")
        self.B_min, self.B_max = B_min, B_max
        self._rows_fn = rows_fn
        self.label = label
        self.grain = grain         # prefer B with a micro-batch of >= GRAIN_CAP samples (module docstring)
        self._full: list[Row] | None = None
        self._index: dict[int, float | None] = {}
        self._windows: list[tuple[int, int, list[Row]]] = []

    @classmethod
    def integers(cls, B_min: int, B_max: int) -> BatchSpace:
        """Every integer in range, no perf model (what a policy uses when no planner is given)."""
        return cls(B_min, B_max, lambda lo, hi: [(B, None) for B in range(lo, hi + 1)], "every integer")

    # ---- lookups ---------------------------------------------------------------------------
    def rows(self, lo: int, hi: int) -> list[Row]:
        """(B, seconds) for the realisable B in [lo, hi] within the range, ascending."""
        lo, hi = max(int(lo), self.B_min), min(int(hi), self.B_max)
        if lo > hi:
            return []
        if self.B_max - self.B_min <= FULL_TABLE:
            if self._full is None:
                self._full = self._fetch(self.B_min, self.B_max)
                self._index = dict(self._full)
            return [r for r in self._full if lo <= r[0] <= hi]
        for a, b, rs in self._windows:
            if a <= lo and hi <= b:
                return [r for r in rs if lo <= r[0] <= hi]
        rs = self._fetch(lo, hi)
        self._windows = (self._windows + [(lo, hi, rs)])[-32:]
        self._index.update(rs)
        return rs

    def _fetch(self, lo: int, hi: int) -> list[Row]:
        out = sorted((int(B), None if t is None else float(t)) for B, t in self._rows_fn(lo, hi))
        for B, t in out:
            if not lo <= B <= hi or (t is not None and not (t > 0 and math.isfinite(t))):
                raise RuntimeError(f"batch space {self.label!r}: bad row ({B}, {t}) for window [{lo}, {hi}]")
        return out

    def table(self) -> list[Row]:
        """Every realisable B in range with its time (the whole range is evaluated)."""
        return self.rows(self.B_min, self.B_max)

    def is_realisable(self, B: int) -> bool:
        return bool(self.rows(B, B))

    def iter_time(self, B: int) -> float | None:
        r = self.rows(B, B)
        if not r:
            raise InfeasibleError(f"global batch B={B} is not realisable here ({self.label})")
        return r[0][1]

    def throughput(self, B: int) -> float | None:
        """Samples per second at B (None when there is no perf model)."""
        t = self.iter_time(B)
        return None if t is None else B / t

    def above(self, B: int) -> int | None:
        """The smallest realisable B' > B in range (None: none)."""
        return self._first(B + 1, self.B_max, up=True)

    def below(self, B: int) -> int | None:
        """The largest realisable B' < B in range (None: none)."""
        return self._first(self.B_min, B - 1, up=False)

    def _first(self, lo: int, hi: int, up: bool) -> int | None:
        lo, hi = max(lo, self.B_min), min(hi, self.B_max)
        w = 64
        while lo <= hi:
            a, b = (lo, min(hi, lo + w)) if up else (max(lo, hi - w), hi)
            rs = self.rows(a, b)
            if rs:
                return rs[0][0] if up else rs[-1][0]
            if up:
                lo = b + 1
            else:
                hi = a - 1
            w *= 2
        return None


@dataclass(frozen=True)
class Snapped:
    """The realised B' for a wish: its direction, the target, whether B moved, and why not."""

    B: int
    direction: str
    target: float
    moved: bool
    note: str = ""


def _pick(space: BatchSpace, lo: int, hi: int, target: float, ref: float | None = None) -> int | None:
    """Realisable B in [lo, hi] nearest ``target``; ties: the one nearer ``ref`` (the current B), then
    the smaller. Only the set of realisable B is read, never the times (module docstring)."""
    lo, hi = max(lo, space.B_min), min(hi, space.B_max)
    if lo > hi:
        return None
    tc = min(max(float(target), float(lo)), float(hi))    # distances to target order like those to tc
    w = 8.0
    while True:
        a, b = max(lo, math.floor(tc - w)), min(hi, math.ceil(tc + w))
        rs = space.rows(a, b)
        if rs:
            break
        if a == lo and b == hi:
            return None
        w *= 2.0
    eps = TIE_REL * max(abs(float(target)), 1.0)
    d_min = min(abs(B - tc) for B, _ in rs)
    band = d_min + eps + (GRAIN_TOL * max(float(target), 1.0) if space.grain else 0.0)
    a2, b2 = max(lo, math.floor(tc - band)), min(hi, math.ceil(tc + band))
    near = [r[0] for r in (rs if a <= a2 and b2 <= b else space.rows(a2, b2)) if abs(r[0] - tc) <= band]
    if space.grain:
        g = max(grain_of(B) for B in near)
        near = [B for B in near if grain_of(B) == g]
        d_min = min(abs(B - tc) for B in near)
        near = [B for B in near if abs(B - tc) <= d_min + eps]
    r0 = tc if ref is None else float(ref)
    return min(near, key=lambda B: (abs(B - r0), B))


def grain_of(B: int) -> int:
    """The largest power of two dividing B, capped at GRAIN_CAP: the micro-batch an identical-b plan of
    power-of-two candidates can use at least. Depends on B alone, never on the mix."""
    return min(B & -B, GRAIN_CAP)


def snap_nearest(space: BatchSpace, target: float, exact_wins: bool = False, ref: float | None = None) -> int:
    """The realisable B in [B_min, B_max] nearest the target; ties: nearer ``ref`` (when given), then
    the smaller. Mix-independent: only the set of realisable B counts.

    ``exact_wins``: a target that is itself realisable is returned as is (a policy that chose it).
    """
    if not passes(number, target, finite=False):
        raise ConfigError(f"target batch size {target!r} must be a number")
    if exact_wins and float(target).is_integer() and space.B_min <= target <= space.B_max \
            and space.is_realisable(int(target)):
        return int(target)
    B = _pick(space, space.B_min, space.B_max, target, ref)
    if B is None:
        raise InfeasibleError(f"no realisable global batch in [{space.B_min}, {space.B_max}] ({space.label})")
    return B


def snap_toward(space: BatchSpace, B: int, direction: str, target: float | None = None) -> Snapped:
    """The direction-preserving rule (module docstring). ``target`` defaults to B (stay) or the
    first realisable B on the asked side; ``direction`` 'set' snaps the target itself."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r} is not one of {DIRECTIONS}")
    B = int(B)
    tgt = float(B if target is None else target)
    if direction == SET:
        nb = snap_nearest(space, tgt, exact_wins=True, ref=B)
        note = "" if abs(nb - tgt) < 0.5 else f"target {tgt:g} realised as {nb}"
        return Snapped(nb, SET, tgt, nb != B, note)
    inside = space.B_min <= B <= space.B_max and space.is_realisable(B)
    if direction == STAY:
        if inside:
            return Snapped(B, STAY, tgt, False, "")
        nb = snap_nearest(space, B)
        return Snapped(nb, STAY, tgt, nb != B, f"current B={B} is not realisable in range; pulled to {nb}")
    up = direction == GROW
    lo, hi = (B + 1, space.B_max) if up else (space.B_min, B - 1)
    if target is None:
        tgt = float(lo if up else hi)
    picked = _pick(space, lo, hi, tgt, B)
    if picked is not None:
        return Snapped(picked, direction, tgt, True,
                       "" if abs(picked - tgt) < 0.5 else f"target {tgt:.4g} realised as {picked}")
    edge = "largest" if up else "smallest"
    if inside:
        return Snapped(B, direction, tgt, False,
                       f"could not {direction}: B={B} is already the {edge} realisable batch in "
                       f"[{space.B_min}, {space.B_max}]")
    nb = snap_nearest(space, B)
    return Snapped(nb, direction, tgt, nb != B,
                   f"could not {direction}: no realisable batch on that side of B={B}; pulled to {nb}")


# ---------------------------------------------------------------- builders


def optimal_space(gpus: Sequence[str], model: PerfModel, B_min: int, B_max: int,
                  b_candidates: Sequence[int] | None = None, *, per_rank: bool = False,
                  speed_factors: Sequence[float] | None = None) -> BatchSpace:
    """What ``identical.plan_batch`` realises on these ranks (every rank runs), with its times.

    per_rank: per-rank micro-batch sizes (every B >= #GPUs is realisable; ``prices.per_rank_times``).
    """
    gl = list(gpus)
    cands = list(b_candidates) if b_candidates else None
    sf = list(speed_factors) if speed_factors else None
    if per_rank:
        def rows_pr(lo: int, hi: int) -> list[Row]:
            try:
                return [(B, t) for B, t in per_rank_times(lo, hi, gl, model, b_candidates=cands, speed_factors=sf)]
            except InfeasibleError:
                return []
        return BatchSpace(B_min, B_max, rows_pr, f"optimal planner, per-rank b, on {','.join(gl)}")

    def rows(lo: int, hi: int) -> list[Row]:
        try:
            return [(B, t) for B, _, t in plan_range(lo, hi, gl, model, b_candidates=cands, speed_factors=sf)]
        except InfeasibleError:
            return []
    return BatchSpace(B_min, B_max, rows, f"optimal planner on {','.join(gl)}"
                      + (f", b in {cands}" if cands else ""), grain=not cands)


def planner_space(B_min: int, B_max: int, step: int, plan_fn: Callable[[int], Plan],
                  time_fn: Callable[[Plan], float] | None, label: str = "") -> BatchSpace:
    """Multiples of ``step`` that ``plan_fn`` realises exactly (plan.B == B), timed by ``time_fn``."""
    if not passes(integer, step, lo=1, whole_float=False):
        raise ConfigError(f"micro-batch size b={step!r} must be an integer >= 1")

    def rows(lo: int, hi: int) -> list[Row]:
        out: list[Row] = []
        for B in range(max(step, -(-lo // step) * step), hi + 1, step):
            try:
                plan = plan_fn(B)
            except (InfeasibleError, ConfigError):
                continue
            if plan.B == B:
                out.append((B, time_fn(plan) if time_fn is not None else None))
        return out
    return BatchSpace(B_min, B_max, rows, label or f"multiples of {step}")


def throughput_knee(rows: Sequence[tuple[int, float | None]], lo: int, rise: float = KNEE_RISE) -> int | None:
    """The knee of a batch space's throughput (``rows``: (B, t_iter) of the realisable B, ascending): the smallest
    B >= ``lo`` whose doubling (the smallest realisable B' >= 2B) raises B / t_iter by at most ``rise``; the largest
    B >= lo when none does (throughput still rising at the top of the range). None: no timed B >= lo."""
    pts = [(int(B), float(t)) for B, t in rows if B >= lo and t is not None and t > 0]
    if not pts:
        return None
    pts.sort()
    for i, (B, t) in enumerate(pts):
        nxt = next(((B2, t2) for B2, t2 in pts[i + 1:] if B2 >= 2 * B), None)
        if nxt is None:
            return pts[-1][0]
        if (nxt[0] / nxt[1]) <= (1.0 + rise) * (B / t):
            return B
    return pts[-1][0]
