"""The simulator's strategies (core/sim/simulate.py): what each one decides with (policy, planner, auto-scaling
objective), compared on the same job, cluster and seed. Pure.

static (fixed B, equal local batches: plain Horovod/DDP), lbbsp (fixed B split in proportion to the
perf model's per-type speeds), simigrad (the similarity policy, equal split, static allocation), jabas
(similarity policy, optimal planner, time-minimising auto-scaling that ignores the restart overhead and
the queue, no margin, as JABAS's released code), hpcjabas-cost (goodput policy, cost objective),
hpcjabas-budget (goodput, least time under a budget: default the SimiGrad row's cost), hpcjabas-queue
(goodput, time objective with the expected queue wait priced and ``max_queue_wait_s``), ramp (the
ramp policy on the static allocation, optimal planner); not in the default comparison: goodput (the
goodput policy on the static allocation, optimal planner: what the trainer runs with auto-scaling off,
for validating the simulator against a real run).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Strategy:
    name: str
    policy: str                  # fixed | similarity | noise-scale | ramp
    planner: str                 # equal | lbbsp | optimal
    objective: str | None        # None: the initial mix throughout
    queue_aware: bool = False
    overhead_aware: bool = True  # False: JABAS (restart overhead priced 0, no margin)
    label: str = ""


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("static", "fixed", "equal", None, label="static, fixed B, equal local batches"),
    Strategy("lbbsp", "fixed", "lbbsp", None, label="LB-BSP: fixed B, speed-proportional split"),
    Strategy("simigrad", "similarity", "equal", None, label="SimiGrad on the static allocation"),
    Strategy("jabas", "similarity", "optimal", "time", overhead_aware=False,
             label="JABAS: adaptive B + time-minimising auto-scaling"),
    Strategy("hpcjabas-cost", "noise-scale", "optimal", "cost", label="hpc-jabas: goodput + cost objective"),
    Strategy("hpcjabas-budget", "noise-scale", "optimal", "time-under-budget",
             label="hpc-jabas: least time under a budget"),
    Strategy("hpcjabas-queue", "noise-scale", "optimal", "time", queue_aware=True,
             label="hpc-jabas: queue-aware moves"),
    Strategy("ramp", "ramp", "optimal", None, label="ramp: B x2 at 25/50/75% of the run"),
    Strategy("goodput", "noise-scale", "optimal", None,
             label="hpc-jabas: goodput on the static allocation (the trainer without auto-scaling)"),
)}
#: the strategies ``--compare`` runs by default (``goodput`` is for validating against a real run,
#: bench/sim_validation.py)
COMPARED = ("static", "lbbsp", "simigrad", "jabas", "hpcjabas-cost", "hpcjabas-budget", "hpcjabas-queue", "ramp")
BASELINE = "simigrad"
