"""The optimal planner's iteration times without its plans, for the auto-scaler's pricing at scale. Pure.

``planning.space.optimal_space`` tabulates (B, seconds) from ``planning.identical.plan_range``, which also
builds one per-rank Plan for every realisable B: on 4,096 ranks that is most of the seconds a mix takes to
price. The auto-scaler only needs the seconds. :func:`group_space` returns the same BatchSpace (same B, the
same floating-point seconds) from ``planning.identical.RangeTimes``, ``plan_range``'s own makespans without
the plans, for the identical-b optimal planner with every rank running (no drop, no per-rank b, no speed
factors) - what ``scaler.epoch_time_fn`` prices. tests/test_mixsearch.py checks the equality against
``optimal_space`` on random mixes and ranges.
"""
from __future__ import annotations

from collections.abc import Sequence

from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning.identical import RangeTimes
from hpc_jabas.core.planning.space import BatchSpace, Row
from hpc_jabas.errors import InfeasibleError


def group_rows(lo: int, hi: int, gpus: Sequence[str], model: PerfModel,
               b_candidates: Sequence[int] | None = None) -> list[Row]:
    """(B, seconds) of ``plan_range(lo, hi, gpus, model, b_candidates=...)``'s rows, without the plans
    ([] when no B is realisable on these ranks)."""
    try:
        times = RangeTimes(list(gpus), model, b_candidates=list(b_candidates) if b_candidates else None)
    except InfeasibleError:
        return []
    return list(times.rows(lo, hi))


def group_space(gpus: Sequence[str], model: PerfModel, B_min: int, B_max: int,
                b_candidates: Sequence[int] | None = None) -> BatchSpace:
    """``planning.space.optimal_space(gpus, model, B_min, B_max, b_candidates)`` (identical b, every rank
    runs); the ranks are grouped once per space."""
    gl = list(gpus)
    cands = list(b_candidates) if b_candidates else None
    prepared: list[RangeTimes | None] = []

    def rows(lo: int, hi: int) -> list[Row]:
        if not prepared:
            try:
                prepared.append(RangeTimes(gl, model, b_candidates=cands))
            except InfeasibleError:
                prepared.append(None)
        times = prepared[0]
        return [] if times is None else list(times.rows(lo, hi))
    return BatchSpace(B_min, B_max, rows, f"optimal planner on {','.join(gl)}" + (f", b in {cands}" if cands else ""),
                      grain=not cands)      # as optimal_space: the same snapping rule on the same space
