"""Per-rank plans' prices over a range of B, on every profile (identical.py's per-rank mode). Pure.

On a monotone profile ``per_rank.makespans`` gives every T*(B) at once, and it is the model's
price of the plan (the same floating-point expressions). On a measured dip the per-rank planner is
exact only for the running maximum of the profile, so each B's result is the faster, as the perf
model prices them, of that plan and the identical-b plan (which may use the dip); ``per_rank_times``
then reports the model's price of exactly that plan. Either way the batch space, the auto-scaler and
``plan_batch(..., per_rank=True)`` agree, and the per-rank plan is never slower than identical b.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning.identical import MAX_RANGE, _check_B, _prepare, _rank_tables, identical_rows
from hpc_jabas.core.planning.per_rank import is_monotone, makespans, plan_per_rank
from hpc_jabas.errors import ConfigError


def per_rank_times(B_min: int, B_max: int, gpus: Sequence[str], model: PerfModel, *,
                   b_candidates: Iterable[int] | None = None,
                   speed_factors: Sequence[float] | None = None) -> list[tuple[int, float]]:
    """(B, predicted iteration seconds of ``plan_batch(B, ..., per_rank=True)``) for every B in
    [max(B_min, #GPUs), B_max], all at once (per_rank.makespans); what a batch space needs."""
    B_min = _check_B(B_min, "B_min")
    B_max = _check_B(B_max, "B_max")
    if B_max - B_min > MAX_RANGE:
        raise ConfigError(f"batch range {B_min}:{B_max} spans more than {MAX_RANGE} values; narrow it")
    ctx = _prepare(gpus, model, b_candidates, speed_factors, False, per_rank=True)
    lo = max(B_min, ctx.R)
    if lo > B_max:
        return []
    types, groups = _rank_tables(ctx)
    if is_monotone(types):
        T = makespans(types, groups, lo, B_max) + model.allreduce_tail(ctx.R)
        return list(zip(range(lo, B_max + 1), T.tolist()))
    # a measured dip: each B's plan priced by the model as it is (one plan per B, slower than the
    # closed form; only measured non-monotone profiles get here)
    cands = None if b_candidates is None else list(b_candidates)
    ident = {B: (plan, t) for B, plan, t in identical_rows(lo, B_max, gpus, model, cands, speed_factors)}
    out = []
    for B in range(lo, B_max + 1):
        plan = plan_per_rank(types, groups, ctx.R, B)
        t = model.iteration_time(plan, gpus, speed_factors)
        if B in ident and ident[B][1] < t:
            t = ident[B][1]
        out.append((B, t))
    return out
