"""The training state a job carries from iteration to iteration, and from one job of a chain to the next.

``TrainState`` is one typed value: the iterations done, the B and plan in force, the lr scale, the
decisions announced but not in force yet (runtime/persist/pending.py) and the sampler (core/planning/sampler.py: the
epoch, the cursor in its permutation). Beside the model, the optimizer and the parts' own states it is
what a checkpoint holds (runtime/resume.py); its ``state_dict`` keeps the checkpoint's top-level keys
(``iteration``, ``B``, ``plan``, ``lr_scale``, ``pending``, ``sampler``), so checkpoints of earlier
versions load unchanged. B is stored once, in the plan (``B`` reads it); the checkpoint still writes it, and a
plan saved for another rank count is replanned from it.

Every rank holds the same TrainState: decisions are applied at the iteration they name
(docs/design.md, section 3), so the state changes at the same iteration everywhere.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from hpc_jabas.core.adaptive.decision import Decision
from hpc_jabas.core.adaptive.policy import canonical_policy, decision_period, make_lr_rule
from hpc_jabas.core.adaptive.scaling import AdaScaleRule
from hpc_jabas.core.config.defaults import KNEE_RISE
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.planning import Plan, Planner, throughput_knee
from hpc_jabas.core.planning.sampler import HeterogeneousSampler
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.persist.pending import PendingDecisions

log = get_logger(__name__)

Replan = Callable[[int], Plan]     # B -> a plan of B for this job's ranks


_T = TypeVar("_T")


class InState(Generic[_T]):
    """A Trainer attribute that is the field of the same name of its TrainState (read and written there: the
    owner's ``state``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, trainer: Any, owner: type | None = None) -> _T:
        if trainer is None:                      # looked up on the class (help(), introspection)
            return self  # type: ignore[return-value]
        return getattr(trainer.state, self.name)

    def __set__(self, trainer: Any, value: _T) -> None:
        setattr(trainer.state, self.name, value)


@dataclass
class TrainState:
    """``iteration`` iterations done; ``plan`` (and its global batch ``B``), ``lr_scale`` in force; ``pending``:
    announced decisions; ``sampler``: the epoch and the cursor of the sample order; ``samples``: the samples
    trained on since the run began."""

    plan: Plan
    sampler: HeterogeneousSampler
    iteration: int = 0
    lr_scale: float = 1.0
    pending: PendingDecisions = field(default_factory=PendingDecisions)
    si_carry: float = 0.0     # AdaScale: the fraction of a scheduler step not taken yet (scheduler_steps)
    samples: int = 0          # samples trained on since the run began (over every job and resume of it)
    # an lr warm-up (batch_start = "knee"): (iterations W, starting factor r0); the step's lr scale is lr_scale x
    # r0 + (1 - r0) min(1, (iteration + 1) / W). None: none
    lr_warmup: tuple[int, float] | None = None

    @property
    def B(self) -> int:
        """The global batch in force: the plan's (stored once, in the plan)."""
        return self.plan.B

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def cursor(self) -> int:
        return self.sampler.cursor

    def announced(self) -> tuple[int, Plan, float]:
        """(B, plan, lr_scale) as announced so far: the last pending decision's, else those in force."""
        d = self.pending.latest()
        return (d.B, d.plan, d.lr_scale) if d is not None else (self.B, self.plan, self.lr_scale)

    def apply_due(self) -> None:
        """Put in force every pending decision due at the current iteration (the last one wins)."""
        for d in self.pending.due(self.iteration):
            self.plan, self.lr_scale = d.plan, d.lr_scale

    def plan_at(self, iteration: int) -> Plan:
        """The plan in force at ``iteration`` (>= the current one), pending decisions included."""
        return self.pending.plan_at(iteration, self.plan)

    def add(self, d: Decision) -> None:
        """File an announced decision; it is put in force by :meth:`apply_due`."""
        self.pending.add(d)

    def lr_factor(self) -> float:
        """The lr warm-up's factor at the current iteration (1 without a warm-up or past it)."""
        if self.lr_warmup is None:
            return 1.0
        w, r0 = self.lr_warmup
        return r0 + (1.0 - r0) * min(1.0, (self.iteration + 1) / w)

    def scheduler_steps(self, scale_invariant: bool) -> int:
        """How often a scheduler stepped per iteration steps after this iteration: once, or under AdaScale
        (``scale_invariant``) the iteration's gain, lr_scale, in scale-invariant iterations, with the fraction
        carried to the next iteration (and through checkpoints)."""
        if not scale_invariant:
            return 1
        self.si_carry += self.lr_scale
        n = int(self.si_carry)
        self.si_carry -= n
        return n

    # ---- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's entries for this state (plain containers: core/planning's and core/decision's dicts)."""
        return {"sampler": self.sampler.state_dict(), "iteration": self.iteration, "B": self.B,
                "plan": self.plan.to_dict(), "lr_scale": self.lr_scale, "pending": self.pending.state_dict(),
                "si_carry": self.si_carry, "samples": self.samples,
                "lr_warmup": None if self.lr_warmup is None else list(self.lr_warmup)}

    def load_state_dict(self, st: dict[str, Any], world: int, replan: Replan) -> None:
        """Back from a checkpoint. A plan saved for another rank count (a job on another allocation) is
        replaced by ``replan(B)``: the same B, planned for this job's ``world`` ranks."""
        self.sampler.load_state_dict(st["sampler"])
        self.iteration = int(st["iteration"])
        self.lr_scale = float(st["lr_scale"])
        self.si_carry = float(st.get("si_carry", 0.0))       # absent in checkpoints of earlier versions
        warm = st.get("lr_warmup")                            # absent in checkpoints of earlier versions: none
        self.lr_warmup = None if not warm else (int(warm[0]), float(warm[1]))
        # absent in checkpoints of earlier versions: the epochs done and the cursor (exact with tail "shrink")
        self.samples = int(st.get("samples", self.sampler.epoch * self.sampler.num_samples + self.sampler.cursor))
        plan = Plan.from_dict(st["plan"])
        self.plan = plan if plan.world_size == world else replan(int(st["B"]))
        # decisions announced ahead of the loader, not in force yet (the sampler above is the position)
        self.pending.load_state_dict(st.get("pending") or [], world, replan=replan)


def initial_state(cfg: JobConfig, planner: Planner, sampler: HeterogeneousSampler, world: int,
                  rank: int) -> TrainState:
    """The state before the first step: the plan of the starting B (``batch_start``: the batch, or the
    throughput's knee on this mix, its lr warmed up from the batch's over the first decision period)."""
    plan = initial_plan(cfg, planner, world, sampler.num_samples)
    if cfg.batch_start != "knee":
        return TrainState(plan, sampler)
    rows = [r for r in planner.batch_space(cfg.B_min, cfg.B_max).table() if r[0] <= sampler.num_samples]
    knee = throughput_knee(rows, lo=cfg.batch)
    if knee is None or knee <= plan.B:
        return TrainState(plan, sampler)
    rule = make_lr_rule(cfg.lr_rule, B_ref=cfg.batch_ref or cfg.batch, policy=canonical_policy(cfg.policy))
    lr = 1.0 if isinstance(rule, AdaScaleRule) else rule.lr_scale(knee)      # AdaScale's gain starts at 1
    w = decision_period(cfg.p, sampler.num_samples, cfg.batch)
    r0 = rule.lr_scale(cfg.batch) / lr if lr > 0 else 1.0
    if rank == 0:
        log.info("batch_start=knee: B=%d (its doubling adds at most %g%% modelled samples/s on this mix) "
                 "instead of batch=%d; lr scale %.4g, warmed up from %.4g over %d iterations",
                 knee, 100 * KNEE_RISE, cfg.batch, lr, lr * r0, w)
    return TrainState(planner.plan(knee, None), sampler, lr_scale=lr, lr_warmup=(w, r0) if r0 < 1.0 else None)


def initial_plan(cfg: JobConfig, planner: Planner, world: int, n: int) -> Plan:
    """The plan of the config's batch for ``world`` ranks, refused when it does not fit them or the dataset (of
    ``n`` samples)."""
    plan = planner.plan(cfg.batch, None)
    if plan.world_size != world:
        raise ConfigError(f"plan {plan} has {plan.world_size} ranks but the job has {world}; "
                          "give one micro-batch count per rank")
    if plan.B > n:             # an iteration would be the whole epoch, cut short: not a batch of B samples
        what = f"batch={plan.B}" if cfg.plan is None else f"plan {plan} (B={plan.B})"
        raise ConfigError(f"{what} is larger than the dataset ({n} samples): one iteration cannot hold more "
                          f"samples than an epoch; give {cfg.give('batch', n)} or less")
    return plan
