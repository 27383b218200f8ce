"""What a run costs besides its iterations, measured on the run itself, and priced by the auto-scaler. Pure.

Two costs that the perf model's iteration time leaves out:

- **measurement iterations.** An adaptive policy (similarity, noise-scale) measures gradient statistics on
  some iterations; such an iteration takes ``measure_factor`` times a normal one at the same B (two half-batch
  gradients, their norms). ``measure_share`` is the share of iterations that measure.
- **epoch ends.** Evaluation, the checkpoint and the epoch-end decision: ``epoch_end_s`` seconds each.

``OverheadMeter`` is fed what the job measures (rank 0's iteration times, with a flag for measurement
iterations, and the duration of each epoch end) and gives an ``Overheads`` estimate: medians, robust to a
slow iteration or two. A job whose every iteration measures (goodput's ``measure_every`` is 1 when p < 15; any
adaptive policy at p = 1) has no normal iteration to compare with; where its measuring is priced (the epoch-end
auto-scaler), its controller leaves one iteration in REFERENCE_EVERY unmeasured (``is_reference``), and the
simulator replays the same.
``Overheads.iteration_scale`` and ``epoch_end_s`` are what ``scaler.epoch_time_fn`` adds to the perf model's
price of an epoch; the simulator prices the same way from its job file's ``[model] measure_factor`` and
``epoch_end_s``. The meter takes seconds as given (no clock here); the runtime adapter (runtime/job/lifecycle.py)
times them.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from hpc_jabas.errors import ConfigError

KEEP_ITERATIONS = 512        # the most recent iterations the meter keeps (bounded memory)
KEEP_EPOCH_ENDS = 16
MIN_NORMAL = 3               # normal iterations compared (each with the measurement iterations at its B) before pricing
#: a job whose every iteration measures (measure_every = 1, or a decision every iteration: p = 1) and whose
#: measuring is priced (the epoch-end auto-scaler) leaves one iteration in REFERENCE_EVERY unmeasured, the
#: REFERENCE_AT-th, so that the meter has normal iterations at the same B to compare with. It is never a decision's
#: unless every iteration is one (p = 1): that decision is then made without a fresh measurement, as a decision on
#: an epoch's shrunk tail is
REFERENCE_EVERY = 16
REFERENCE_AT = 9            # odd: never a decision's at an even p (at 8, p = 2, 4 or 8 would take every one)


def is_reference(done: int, p: int, k: int | None) -> bool:
    """Whether the iteration that completes ``done`` iterations (counted from 1) is a reference iteration: when
    every iteration measures (``k`` = measure_every = 1, or p = 1), at done = REFERENCE_AT mod REFERENCE_EVERY,
    and never a decision's (p) unless p = 1."""
    return (k == 1 or p == 1) and done % REFERENCE_EVERY == REFERENCE_AT and (p == 1 or done % p != 0)


def measures_between(done: int, p: int, k: int | None, reference: bool) -> bool:
    """Whether the iteration completing ``done`` takes a measure_every measurement (``k``; None: none), the
    reference iterations left out when ``reference`` (measuring priced): the one schedule of the trainer's
    controller and the simulator. A decision's iteration (done % p == 0) measures as :func:`measures` says."""
    return k is not None and done % k == 0 and not (reference and is_reference(done, p, k))


def measures(done: int, p: int, k: int | None, reference: bool) -> bool:
    """Whether the iteration completing ``done`` measures at all: a decision's (every p-th) or measure_every's,
    less the reference iterations when ``reference`` (at p = 1 these are decisions made without a fresh
    measurement)."""
    return (done % p == 0 or (k is not None and done % k == 0)) and not (reference and is_reference(done, p, k))


def references(done: int, end: int, p: int, k: int | None) -> int:
    """The reference iterations after ``done`` up to ``end`` (counted from 1)."""
    if (k != 1 and p != 1) or end <= done:
        return 0
    first = done + 1 + (REFERENCE_AT - (done + 1)) % REFERENCE_EVERY
    return sum(1 for x in range(first, end + 1, REFERENCE_EVERY) if p == 1 or x % p != 0)


@dataclass(frozen=True)
class Overheads:
    """``measure_share`` in [0, 1]; ``measure_factor`` >= 1; ``epoch_end_s`` >= 0. The default prices nothing."""

    measure_share: float = 0.0
    measure_factor: float = 1.0
    epoch_end_s: float = 0.0

    def __post_init__(self) -> None:
        for name, v, lo, hi in (("measure_share", self.measure_share, 0.0, 1.0),
                                ("measure_factor", self.measure_factor, 1.0, math.inf),
                                ("epoch_end_s", self.epoch_end_s, 0.0, math.inf)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (lo <= v <= hi) or math.isnan(v):
                valid = f"in [{lo:g}, {hi:g}]" if hi < math.inf else f">= {lo:g}"
                raise ConfigError(f"{name}={v!r} is invalid; it must be a number {valid}")

    @property
    def iteration_scale(self) -> float:
        """Mean iteration time over a normal one's, measurement iterations included (>= 1)."""
        return 1.0 + self.measure_share * (self.measure_factor - 1.0)

    def to_dict(self) -> dict[str, float]:
        return {k: round(float(v), 6) for k, v in asdict(self).items()}


class OverheadMeter:
    """Rank 0's measured iteration times (normal and measurement) and epoch-end durations, bounded."""

    def __init__(self) -> None:
        self.iterations: deque[tuple[int, float, bool]] = deque(maxlen=KEEP_ITERATIONS)   # (B, seconds, measure)
        self.epoch_ends: deque[float] = deque(maxlen=KEEP_EPOCH_ENDS)
        self.compared = 0            # normal iterations the last estimate compared (< MIN_NORMAL: priced nothing)

    def observe_iteration(self, B: int, seconds: float, measure: bool, samples: int | None = None) -> None:
        """One iteration at B; ``samples`` (None: B) fewer than B is an epoch's shrunk tail, which never measures
        and takes less than an iteration at B: left out, or it would pass for a fast normal iteration at B."""
        if samples is not None and int(samples) != int(B):
            return
        if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0:
            self.iterations.append((int(B), float(seconds), bool(measure)))

    def observe_epoch_end(self, seconds: float) -> None:
        if isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0:
            self.epoch_ends.append(float(seconds))

    def estimate(self) -> Overheads:
        """The medians of what was measured; with nothing to compare, the default (prices nothing)."""
        its = list(self.iterations)
        share = sum(1 for _, _, m in its if m) / len(its) if its else 0.0
        by_b: dict[int, tuple[list[float], list[float]]] = {}
        for B, s, m in its:
            by_b.setdefault(B, ([], []))[1 if m else 0].append(s)
        # each normal iteration against the median measurement iteration at its B, pooled over the Bs: a job
        # that moves B often still gathers MIN_NORMAL comparisons (reference iterations are 1 in 16)
        ratios = [statistics.median(meas) / t for norm, meas in by_b.values() if meas for t in norm if t > 0]
        self.compared = len(ratios)
        factor = max(1.0, statistics.median(ratios)) if len(ratios) >= MIN_NORMAL else 1.0
        end = statistics.median(self.epoch_ends) if self.epoch_ends else 0.0
        return Overheads(measure_share=share if factor > 1.0 else 0.0, measure_factor=factor, epoch_end_s=end)

    def state_dict(self) -> dict[str, Any]:
        return {"iterations": [list(t) for t in self.iterations], "epoch_ends": list(self.epoch_ends)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.iterations.clear()
        self.epoch_ends.clear()
        for t in d.get("iterations", []):
            if isinstance(t, (list, tuple)) and len(t) == 3:
                self.observe_iteration(int(t[0]), t[1], bool(t[2]))
        for s in d.get("epoch_ends", []):
            self.observe_epoch_end(s)
