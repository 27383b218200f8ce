"""The optimal planner's iteration times without its plans, for the auto-scaler's pricing at scale. Pure.

``snapping.optimal_space`` tabulates (B, seconds) from ``planner.plan_range``, which also builds one
per-rank Plan for every realisable B: on 4,096 ranks that is most of the seconds a mix takes to price.
The auto-scaler only needs the seconds. :func:`group_space` returns the same BatchSpace (same B, the same
floating-point seconds: ``plan_range``'s own arithmetic on the rank groups, ``planning.slots.
extra_slots_range``, without ``_bulk_plans``) for the identical-b optimal planner with every rank
running (no drop, no per-rank b, no speed factors) - what ``autoscale.epoch_time_fn`` prices.
tests/test_mixsearch.py checks the equality against ``optimal_space`` on random mixes and ranges.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpc_jabas.core.perfmodel import PerfModel
from hpc_jabas.core.planning.identical import MAX_RANGE, _prepare
from hpc_jabas.core.planning.slots import extra_slots_range
from hpc_jabas.core.planning.space import BatchSpace, Row
from hpc_jabas.errors import ConfigError, InfeasibleError


def group_rows(lo: int, hi: int, gpus: Sequence[str], model: PerfModel,
               b_candidates: Sequence[int] | None = None, ctx: Any = None) -> list[Row]:
    """(B, seconds) of ``plan_range(lo, hi, gpus, model, b_candidates=...)``'s rows, without the plans.
    ``ctx``: the planner's prepared groups of these ranks (:func:`group_space` keeps one per space)."""
    if hi - lo > MAX_RANGE:
        raise ConfigError(f"batch range {lo}:{hi} spans more than {MAX_RANGE} values; narrow it")
    if ctx is None:
        try:
            ctx = _prepare(list(gpus), model, list(b_candidates) if b_candidates else None, None, False)
        except InfeasibleError:
            return []
    R = ctx.R
    width = hi - lo + 1
    best_T = np.full(width, np.inf)
    for b in reversed(ctx.cands):            # larger b first; strict '<' keeps it on ties (as plan_range)
        m_lo = max(R, -(-lo // b))
        m_hi = hi // b
        if m_lo > m_hi:
            continue
        ts, us, cs = ctx.params(b, range(len(ctx.groups)))
        V = extra_slots_range(m_lo - R, m_hi - R, ts, us, cs)
        T = np.maximum(V, max(t + u for t, u in zip(ts, us)))
        pos = b * np.arange(m_lo, m_hi + 1) - lo
        better = T < best_T[pos]
        best_T[pos[better]] = T[better]
    tail = model.allreduce_tail(R)
    idx = np.nonzero(np.isfinite(best_T))[0]
    return [(int(lo + i), float(best_T[i]) + tail) for i in idx.tolist()]


def group_space(gpus: Sequence[str], model: PerfModel, B_min: int, B_max: int,
                b_candidates: Sequence[int] | None = None) -> BatchSpace:
    """``snapping.optimal_space(gpus, model, B_min, B_max, b_candidates)`` (identical b, every rank runs)."""
    gl = list(gpus)
    cands = list(b_candidates) if b_candidates else None
    prepared: list[Any] = []

    def rows(lo: int, hi: int) -> list[Row]:
        if not prepared:
            try:
                prepared.append(_prepare(gl, model, cands, None, False))
            except InfeasibleError:
                prepared.append(None)
        if prepared[0] is None:
            return []
        return group_rows(lo, hi, gl, model, cands, prepared[0])
    return BatchSpace(B_min, B_max, rows, f"optimal planner on {','.join(gl)}" + (f", b in {cands}" if cands else ""),
                      grain=not cands)      # as optimal_space: the same snapping rule on the same space
