"""Planning: from a global batch B and the ranks' GPU types to an exact per-rank plan. Pure.

Modules, along their seams:

* ``plan.py``: the ``Plan`` type (identical b or per-rank b; docs/invariants.md, invariant 2), the
  proportional splits (LB-BSP) and the half split of the similarity statistic;
* ``identical.py``: the exact planner (``plan_batch``, ``plan_range``, ``snap_batch``): input checks,
  rank groups, the choice of b (docs/formulas.md, section 5);
* ``slots.py``: its slot arithmetic on the rank groups;
* ``per_rank.py``: the exact planner for per-rank micro-batch sizes;
* ``prices.py``: per-rank plans' iteration times over a range of B;
* ``grouptimes.py``: the optimal planner's iteration times without its plans (the auto-scaler's pricing);
* ``space.py``: ``BatchSpace`` (the realisable B of a mix) and the direction-preserving snap;
* ``planner.py``: the ``Planner`` protocol and ``make_planner``, the one place a job's planner is
  built (kinds ``optimal``, ``lbbsp``, ``fixed``).
"""
from __future__ import annotations

from hpc_jabas.core.planning.identical import plan_batch, plan_range, snap_batch
from hpc_jabas.core.planning.plan import (
    Plan,
    half_split,
    proportional_plan,
    proportional_samples_plan,
    rank_split,
    split_proportional,
)
from hpc_jabas.core.planning.planner import (
    Planner,
    PlannerFn,
    PlanSpec,
    job_batch_space,
    lbbsp_speeds,
    make_planner,
    wants_identical_b,
)
from hpc_jabas.core.planning.prices import per_rank_times
from hpc_jabas.core.planning.space import (
    DIRECTIONS,
    GROW,
    SET,
    SHRINK,
    STAY,
    BatchSpace,
    Snapped,
    grain_of,
    optimal_space,
    planner_space,
    snap_nearest,
    snap_toward,
    throughput_knee,
)

__all__ = [
    "DIRECTIONS", "GROW", "SET", "SHRINK", "STAY", "BatchSpace", "Plan", "PlanSpec", "Planner", "PlannerFn", "Snapped",
    "grain_of", "half_split", "job_batch_space", "lbbsp_speeds", "make_planner", "optimal_space",
    "per_rank_times", "plan_batch", "plan_range", "planner_space", "proportional_plan",
    "proportional_samples_plan", "rank_split", "snap_batch", "snap_nearest", "snap_toward",
    "split_proportional", "throughput_knee", "wants_identical_b",
]
