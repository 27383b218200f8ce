"""What every batch-size policy is: the ``Policy`` protocol the controller holds, its inputs (``PolicyState`` at a
decision, ``Observation`` between decisions) and outputs (``Wish``, ``BatchDecision``), and ``BatchPolicy``, the
base class the built-in policies and a user's own extend (override ``wish``; register it by name with
``core/adaptive/policies/registry.py``'s ``register_policy``).

What differs between policies is said by the policy, never by its name at the caller: ``adaptive`` (False: B never
moves, the fixed policy), ``reads`` (the gradient statistics it decides on: "similarity", "noise"; empty: none are
measured for it), ``uses_times`` (it prices B with the batch space's predicted iteration times, so a recalibrated
perf model rebuilds its space), and the hooks ``observe``, ``start``, ``first_round``, ``noise_estimate``,
``decision_stats`` with do-nothing defaults here.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hpc_jabas.core.config.defaults import DEFAULT_P
from hpc_jabas.core.config.validate import integer
from hpc_jabas.core.planning.space import GROW, SHRINK, STAY, BatchSpace, snap_toward
from hpc_jabas.errors import ConfigError

if TYPE_CHECKING:
    from hpc_jabas.core.adaptive.stats import NoiseMemory, NoiseWindow
    from hpc_jabas.core.config.sections import JobConfig

#: what a policy may read: the cosine of the half-batch means, the noise-scale terms (|G|^2, tr(Sigma))
SIMILARITY, NOISE = "similarity", "noise"


@dataclass(frozen=True)
class Observation:
    """One measurement between decisions (the controller's ``measure_every``), what ``Policy.observe`` takes.

    ``similarity``: the cosine of the two half-batch mean gradients (None: not measured, e.g. a noise-only one).
    ``g2``, ``s``: the fresh unbiased estimates of |G|^2 and tr(Sigma) (None: not measured, or not read).
    ``samples``: the samples trained since the previous fresh (g2, s) (None: counted as one).
    ``headroom``: the measured curvature headroom h (core/adaptive/headroom.py; None: not measured) and
    ``headroom_B`` the
    batch it was measured at (None: the next decision's B).
    """

    similarity: float | None = None
    g2: float | None = None
    s: float | None = None
    samples: float | None = None
    headroom: float | None = None
    headroom_B: float | None = None


@dataclass(frozen=True)
class PolicyState:
    """What a policy sees: the current global batch B, the iteration, the latest statistics.

    ``similarity``: cosine similarity of the two half-batch mean gradients (None if not measured).
    ``b_noise``: the smoothed gradient noise scale (None if unknown, inf if the signal is lost).
    ``g2``, ``s``: this iteration's fresh unbiased estimates of |G|^2 and tr(Sigma)
    (stats.noise_scale_terms; None: no fresh measurement). The goodput policy averages them itself.
    ``progress``: the fraction of the run done, in samples (what the ramp policy reads; None: unknown).
    ``samples``: the samples trained since the previous fresh measurement, what a fresh (g2, s) stands for in
    an estimate with a memory in samples (``noise_memory``; None: one iteration's, B).
    ``headroom``: a curvature headroom h (core/adaptive/headroom.py; None: not measured) and ``headroom_B`` the
    batch it was measured at (None: this B; the controller's probe measures at the B in force, which differs from
    the announced B while a decision is pending).
    """

    B: int
    iteration: int = 0
    similarity: float | None = None
    b_noise: float | None = None
    g2: float | None = None
    s: float | None = None
    progress: float | None = None
    samples: float | None = None
    headroom: float | None = None
    headroom_B: float | None = None

    @classmethod
    def coerce(cls, state: PolicyState | Mapping[str, Any]) -> PolicyState:
        if isinstance(state, PolicyState):
            return state
        if isinstance(state, Mapping):
            extra = set(state) - {"B", "iteration", "similarity", "b_noise", "g2", "s", "progress", "samples",
                                  "headroom", "headroom_B"}
            if extra or "B" not in state:
                raise ConfigError(f"policy state {dict(state)!r} is invalid; give keys B (required), "
                                  "iteration, similarity, b_noise, g2, s, progress, samples, headroom, headroom_B")
            return cls(**state)
        raise ConfigError(f"policy state {state!r} is invalid; give a PolicyState or a dict with key B")


@dataclass(frozen=True)
class Wish:
    """What a policy asks before snapping: a direction (grow, shrink, stay, or set = this B) and a target."""

    direction: str
    target: float
    reason: str


@dataclass(frozen=True)
class BatchDecision:
    """The realised decision: new B, what was asked (direction, target), whether B moved, why."""

    B: int
    direction: str
    target: float
    moved: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"B": self.B, "direction": self.direction, "target": self.target, "moved": self.moved,
                "reason": self.reason}


class Policy(Protocol):
    """What the controller (runtime/controller.py) holds: one object per job, built from the registry by name."""

    name: str
    p: int
    #: False: B never moves (nothing is measured, no decision rounds)
    adaptive: bool
    #: the statistics its decisions read (SIMILARITY, NOISE); empty: none are measured for it
    reads: frozenset[str]
    #: it prices B with the batch space's predicted iteration times (rebuilt when the perf model is recalibrated)
    uses_times: bool

    def observe(self, stats: Observation) -> bool:
        """One measurement between decisions; whether it was taken."""
        ...

    def decide(self, state: PolicyState | Mapping[str, Any], space: BatchSpace | None = None) -> BatchDecision:
        """The decision at a decision round: a realisable B (snapped into ``space``), what was asked, why."""
        ...

    def default_measure_every(self, measure_every: int | None, p: int) -> int | None:
        """The iterations between measurements at decision period ``p`` (None: at decisions only)."""
        ...

    def start(self, samples_per_epoch: int) -> None:
        """The job's epoch is known (the controller's attach)."""
        ...

    def first_round(self, measure_every: int | None) -> int | None:
        """An extra first decision round before the first period ends (None: none)."""
        ...

    def noise_estimate(self) -> NoiseWindow | NoiseMemory | None:
        """The policy's own noise-scale estimate for the lr rule (None: the controller's moving average)."""
        ...

    def decision_stats(self, B: int, *, fresh: bool, between: bool) -> dict[str, Any]:
        """What the last decision read, for its record (``fresh``: it had a fresh measurement; ``between``:
        measurements are taken between decisions)."""
        ...

    def config(self) -> dict[str, Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class BatchPolicy:
    """Base: bounds [B_min, B_max] and the decision period p. Subclasses implement ``wish``."""

    name = "base"
    adaptive = True
    reads: frozenset[str] = frozenset()
    uses_times = False
    #: the lr rule "auto" stands for with this policy (policy.AUTO_LR_RULE)
    auto_lr_rule = "sqrt"
    #: the options ``make_policy`` accepts for it (constructor arguments)
    options: frozenset[str] = frozenset({"B_min", "B_max", "p"})

    def __init__(self, B_min: int = 1, B_max: int | None = None, p: int = DEFAULT_P) -> None:
        self.B_min = integer(B_min, "B_min", lo=1)
        self.B_max = None if B_max is None else integer(B_max, "B_max", lo=1)
        if self.B_max is not None and self.B_min > self.B_max:
            raise ConfigError(f"B_min={B_min} is larger than B_max={B_max}; need 1 <= B_min <= B_max")
        self.p = integer(p, "p", lo=1)

    def wish(self, state: PolicyState, space: BatchSpace) -> Wish:
        return Wish(STAY, float(state.B), "keep B")

    def _space(self, state: PolicyState, space: BatchSpace | None) -> BatchSpace:
        hi = self.B_max if self.B_max is not None else max(self.B_min, int(state.B))
        if space is None:
            return BatchSpace.integers(self.B_min, hi)
        if (space.B_min, space.B_max) != (self.B_min, hi):
            raise ValueError(f"batch space range [{space.B_min}, {space.B_max}] differs from the policy's "
                             f"[{self.B_min}, {hi}]")
        return space

    def decide(self, state: PolicyState | Mapping[str, Any], space: BatchSpace | None = None) -> BatchDecision:
        """The policy's wish, realised with ``snap_toward`` on ``space`` (default: every integer in range)."""
        st = PolicyState.coerce(state)
        integer(st.B, "B", lo=1)
        sp = self._space(st, space)
        w = self.wish(st, sp)
        tgt = min(max(w.target, float(sp.B_min)), float(sp.B_max))
        s = snap_toward(sp, int(st.B), w.direction, tgt)
        reason = w.reason + (f"; {s.note}" if s.note else "")
        if w.direction in (GROW, SHRINK) and s.moved:
            reason += f"; {w.direction} {st.B} -> {s.B}"
        return BatchDecision(s.B, w.direction, tgt, s.moved, reason)

    # ---- what the controller asks of every policy (the Policy protocol); defaults: a policy that reads nothing

    @classmethod
    def job_options(cls, cfg: JobConfig) -> dict[str, Any]:
        """Its constructor's options from a job's configuration, beyond B_min, B_max and p."""
        return {}

    @classmethod
    def from_job(cls, cfg: JobConfig, p: int) -> BatchPolicy:
        """The policy a job runs: its range, decision period ``p`` and ``job_options``."""
        return cls(B_min=cfg.B_min, B_max=cfg.B_max, p=p, **cls.job_options(cfg))

    @classmethod
    def default_measure_every(cls, measure_every: int | None, p: int) -> int | None:
        """As set when the policy reads statistics (None: at decisions only); a policy that reads none measures
        nothing between decisions."""
        if not cls.reads or measure_every is None:
            return None
        return integer(measure_every, "measure_every", lo=1)

    def observe(self, stats: Observation) -> bool:
        return False

    def start(self, samples_per_epoch: int) -> None:
        return None

    def first_round(self, measure_every: int | None) -> int | None:
        return None

    def noise_estimate(self) -> NoiseWindow | NoiseMemory | None:
        return None

    def decision_stats(self, B: int, *, fresh: bool, between: bool) -> dict[str, Any]:
        return {}

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "B_min": self.B_min, "B_max": self.B_max, "p": self.p}

    # policies carry no learned state; the dicts exist so a checkpoint can record the config
    def state_dict(self) -> dict[str, Any]:
        return self.config()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ConfigError(f"policy state is for {state.get('name')!r}, not {self.name!r}")


class FixedPolicy(BatchPolicy):
    """Keep the current B."""

    name = "fixed"
    adaptive = False
