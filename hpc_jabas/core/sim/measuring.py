"""What a simulated run spends besides its training iterations (core/sim/simulate.py's time line): the measuring
iterations of a policy (one per period p, and every measure_every between, less the trainer's reference
iterations: core/autoscale/overheads.py), and the curvature-headroom probe at decision rounds
(runtime/headroom_probe.py). Pure.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from hpc_jabas.core.adaptive.policy import default_measure_every
from hpc_jabas.core.autoscale.overheads import REFERENCE_EVERY, Overheads, references
from hpc_jabas.core.sim.simconfig import Job

#: the headroom probe's cost in training micro-steps (forward + backward) per micro-batch of its probe batch: one
#: forward and backward with the graph kept, then the Hessian-vector product's second backward; measured 3.0-4.0x a
#: forward + backward of the same samples (CPU, MLPs of 64 -> 512 -> 512 -> 10 at 1,024 samples and 64 -> 64 ->
#: 64 -> 10 at 256; the smaller one Python-bound), not yet on a GPU
PROBE_PASSES = 3.0
#: the probe's micro-batch when the job pins none
PROBE_MICRO_BATCH = 32


def probe_seconds(t_micro: Callable[[str, int], float], types: Sequence[str], n: int, b: int | None) -> float:
    """One headroom probe of ``n`` samples in micro-batches of ``b`` (None: PROBE_MICRO_BATCH) on the slowest of
    ``types``: PROBE_PASSES x (full micro-batches + the partial last one), each at ``t_micro(type, size)``."""
    if n <= 0:
        return 0.0
    bb = max(1, min(int(b or PROBE_MICRO_BATCH), n))
    full, last = divmod(int(n), bb)
    return PROBE_PASSES * max(full * t_micro(g, bb) + (t_micro(g, last) if last else 0.0) for g in types)


def measurements(done: int, end: int, p: int, k: int | None, reference: bool = False) -> int:
    """The measuring iterations after ``done`` up to ``end`` (iterations counted from 1): every p-th (a decision's)
    and every k-th (measure_every's; None: none), each counted once, less the reference iterations that the
    trainer leaves unmeasured when ``reference`` (k = 1 or p = 1 under auto-scaling: core/autoscale/overheads.py)."""
    n = end // p - done // p
    if k is not None:
        both = math.lcm(p, k)
        n += (end // k - done // k) - (end // both - done // both)
    return n - (references(done, end, p, k) if reference else 0)


def measure_share(p: int, k: int | None, reference: bool = False) -> float:
    """The share of iterations that measure (``measurements`` over a long run): 1/p + 1/k - 1/lcm(p, k), less
    the reference iterations' share when ``reference``."""
    share = (1.0 / p) if k is None else 1.0 / p + 1.0 / k - 1.0 / math.lcm(p, k)
    if reference:                     # references() counts none unless k = 1 or p = 1
        period = math.lcm(p, REFERENCE_EVERY)
        share -= references(0, period, p, k) / period
    return share


def run_overheads(job: Job, policy: str, autoscaling: bool, p: int) -> Overheads:
    """What the job file says a run of ``policy`` costs besides its iterations, as the trainer's meter would
    measure it: the policy's measurement iterations (one per period p, and every measure_every between; under
    ``autoscaling`` less the reference iterations), and the epoch end."""
    factor = job.model.measure_factor
    measures = policy in ("similarity", "noise-scale") and factor > 1.0
    k = default_measure_every(policy, job.policy.measure_every, p) if job.batch_min < job.batch_max else None
    return Overheads(measure_share=measure_share(p, k, autoscaling) if measures else 0.0,
                     measure_factor=factor if measures else 1.0, epoch_end_s=job.model.epoch_end_s)
