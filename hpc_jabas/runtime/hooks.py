"""The trainer's typed extension points: controllers, the epoch-end hook, callbacks.

``trainer`` arguments are ``hpc_jabas.runtime.trainer.Trainer``, typed as what controllers, hooks and
callbacks may read of it: ``TrainerView`` (so that this module, which the trainer imports, does not import it
back; mypy checks the Trainer against it where it passes itself). Tests fake a trainer with a class that has
these attributes (tests/fake_trainer.py), and a test checks that the Trainer has every one of them.

- ``Controller`` (a Protocol; ``runtime.controller.BaseController`` implements it): every method the trainer
  calls (``ControllerCore``: those a controller must have; ``with_defaults`` adds the rest). Called on
  every rank after every iteration with the iteration's ``StepRecord`` (runtime/record.py); on its decision
  rounds it runs the decision protocol (``trainer.decisions.run``) and returns the Decision every rank
  received; the trainer applies it.
- ``EpochEndHook`` (an ABC; ``runtime.lifecycle.EpochEndAutoscaler`` implements it): at every
  epoch end, *after* that epoch's checkpoint is on disk, the trainer runs ``decide`` on rank 0
  (contained, broadcast), and on a move ``act`` on rank 0 (contained, broadcast); when the act
  reports a move the trainer records it in ``trainer.moved_to`` and the job ends. The hook keeps
  its own state; the trainer checkpoints it through ``state_dict``/``load_state_dict``.
- ``Callback``: plain notifications on every rank (no collectives of their own).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from hpc_jabas.core.adaptive.decision import Decision, MoveDecision
from hpc_jabas.core.planning.plan import Plan
from hpc_jabas.runtime.record import StepRecord

if TYPE_CHECKING:        # the trainer's parts: imported for the type checker only (the trainer imports this module)
    import torch

    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.perf.perfmodel import PerfModel
    from hpc_jabas.core.planning.planner import Planner
    from hpc_jabas.core.planning.sampler import HeterogeneousSampler
    from hpc_jabas.runtime.metrics import MetricsWriter
    from hpc_jabas.runtime.optim import HeterogeneousOptimizer
    from hpc_jabas.runtime.protocol import DecisionChannel

SchedulerStep = Literal["epoch", "iteration"]
SCHEDULER_STEPS: tuple[SchedulerStep, ...] = ("epoch", "iteration")


class TrainerView(Protocol):
    """What controllers, epoch-end hooks and callbacks may read of the trainer (every rank has them all).

    ``Trainer`` satisfies it; the attributes are plain (no ``getattr`` probes needed). Writing to the
    trainer is the trainer's business: decisions go through ``decisions`` and come back as a Decision."""

    # the world (read-only: the trainer's World, runtime/comm/world.py)
    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int:                      # the rank count
        ...

    @property
    def gpu_types(self) -> list[str]:            # one per rank
        ...

    device: torch.device                         # this rank's device

    @property
    def cfg(self) -> JobConfig:                  # resolved once and frozen (runtime/resolve.py)
        ...

    # the state in force (applied decisions)
    iteration: int                               # iterations done

    @property
    def B(self) -> int:                          # the plan's global batch (stored once, in the plan)
        ...

    plan: Plan
    lr_scale: float

    @property
    def sampler(self) -> HeterogeneousSampler:   # epoch and cursor
        ...

    decision_lead: int                           # a decision made now takes effect this many iterations later
    # the planner the trainer built (core/planning/planner.py): plan(B, factors), batch_space, identical_b,
    # declared_factors (the config's speeds relative to the perf model), spec (its PlanSpec)
    planner: Planner
    # the parts around the loop
    opt: HeterogeneousOptimizer
    controller: Controller | None
    epoch_end_hook: EpochEndHook | None
    decisions: DecisionChannel                   # the decision protocol (runtime/protocol.py)
    metrics: MetricsWriter                       # metrics.jsonl writer (rank 0; a no-op elsewhere): .write(dict)
    run_dir: Path
    moved_to: MoveDecision | None
    fit_epochs: int                              # the epochs fit() trains to (its argument, else the key)
    runs_progress_budget: bool                   # True: fit() runs on to goal = "final"'s progress budget

    @property
    def resumed_from(self) -> str | None:        # the checkpointer's: where this job resumed from
        ...

    @property
    def last_checkpoint_time(self) -> float | None:
        ...

    @property
    def samples_local(self) -> int:              # samples this rank computed in this job
        ...

    @property
    def compute_local_s(self) -> float:
        ...

    def perf_model(self) -> PerfModel:
        """The job's performance model (core/perf/perfmodel.py), built on first use."""

    def announced(self) -> tuple[int, Plan, float]:
        """(B, plan, lr_scale) with every decision announced so far (pending ones included)."""

    def b_trajectory(self) -> list[tuple[int, int]]:
        """(iteration, B) at every change of B so far."""

    def check_decision(self, d: Decision) -> None:
        """Raise on a decision this trainer cannot apply."""

    def noop_decision(self, reason: str = "") -> Decision:
        """The decision that changes nothing, at the next iteration."""


@runtime_checkable
class ControllerCore(Protocol):
    """The methods a controller must have (a user's own, written without subclassing ``Controller``, too)."""

    def attach(self, trainer: TrainerView) -> None:
        """Called once by the trainer's ``setup()`` (its first fit, resume, checkpoint or step), on every rank."""

    def wants_stats(self, iteration: int) -> bool:
        """Should iteration ``iteration`` measure the gradient statistics (same answer on every rank)?"""

    def after_step(self, trainer: TrainerView, rec: StepRecord) -> Decision | None:
        """Collective on decision rounds: the Decision every rank received (or None)."""

    def b_trajectory(self) -> list[tuple[int, int]]:
        """(iteration, B) at every change of B so far (the auto-scaler's forecast input)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, d: dict[str, Any]) -> None: ...


@runtime_checkable
class Controller(ControllerCore, Protocol):
    """What the trainer needs from a batch-size / balancing controller: every method it calls.

    The last three have defaults, which a subclass inherits (``class Mine(Controller)``); a controller written
    without subclassing that lacks them is given them by ``with_defaults`` (the trainer does so)."""

    def measures_similarity(self, iteration: int) -> bool:
        """Whether measuring iteration ``iteration`` keeps the half-batch sum (False: noise-only)."""
        return True

    def defers_stats(self, iteration: int) -> bool:
        """Whether measuring iteration ``iteration`` reads its statistics one iteration later (no wait for their
        reduction); the trainer then hands its record, ``stats`` filled in, to ``observe_held``."""
        return False

    def observe_held(self, trainer: TrainerView, rec: StepRecord) -> None:
        """Every rank: a deferred measurement's record, its ``stats`` read (before the next decision)."""
        return None


class _WithDefaults(Controller):
    """A controller that lacks ``Controller``'s defaulted methods, given them (its other attributes read
    through)."""

    def __init__(self, inner: ControllerCore) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:       # the user's own attributes (not found on the wrapper)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def attach(self, trainer: TrainerView) -> None:
        self.inner.attach(trainer)

    def wants_stats(self, iteration: int) -> bool:
        return self.inner.wants_stats(iteration)

    def after_step(self, trainer: TrainerView, rec: StepRecord) -> Decision | None:
        return self.inner.after_step(trainer, rec)

    def b_trajectory(self) -> list[tuple[int, int]]:
        return self.inner.b_trajectory()

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.inner.load_state_dict(d)


def with_defaults(controller: ControllerCore) -> Controller:
    """``controller`` itself when it has every method of ``Controller``, else it wrapped with the defaults."""
    return controller if isinstance(controller, Controller) else _WithDefaults(controller)


class EpochEndHook(ABC):
    """Decide (rank 0), then act (rank 0) at an epoch end; the trainer broadcasts and contains both."""

    #: True when the hook prices the cost of measurement iterations from the run's own iteration times (the
    #: auto-scaler's meter, core/autoscale/overheads.py): a controller that would measure at every iteration then
    #: leaves a
    #: few unmeasured (``overheads.is_reference``) for the meter to compare with. The same on every rank.
    prices_measuring: bool = False

    @abstractmethod
    def decide(self, trainer: TrainerView, epoch: int) -> MoveDecision:
        """Rank 0 only, after the checkpoint of ``epoch`` is written: stay, or move to another mix."""

    def act(self, trainer: TrainerView, d: MoveDecision) -> MoveDecision:
        """Rank 0 only, for a move: start the next job; returns the move that happened (or a stay)."""
        return MoveDecision.stay("this hook does not act on moves")

    def on_step_end(self, trainer: TrainerView, rec: StepRecord) -> None:
        """Every rank, after every iteration (no collectives): e.g. to meter what the hook prices."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """Carried in the trainer's checkpoint (and, after ``decide``, in a side file; see Trainer)."""
        return {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        return None


class Callback:
    """Override what you need; every rank calls these at the same points."""

    def on_first_step(self, trainer: TrainerView) -> None:
        """After the first iteration of ``Trainer.fit`` (e.g. to measure start-up overhead)."""

    def on_step_end(self, trainer: TrainerView, rec: StepRecord) -> None:
        """After every iteration (and after any decision it triggered was applied)."""

    def on_epoch_end(self, trainer: TrainerView, epoch: int) -> None:
        """After the epoch's checkpoint, before the epoch-end hook."""

    def on_metrics(self, trainer: TrainerView, rec: dict[str, Any]) -> None:
        """Rank 0 only, once per iteration, when the metrics are flushed (every ``metrics_period`` iterations, at
        the first safe point after them, and at the end of ``fit``): the iteration's record of the whole job, as
        metrics.jsonl holds it: ``it``, ``epoch``, ``B``, ``loss`` (the mean over every rank's samples: the global
        loss, no collective of the callback's own), ``lr_scale``, ``samples_per_s``, per-rank ``compute_s``. What a
        tensorboard or wandb logger writes (docs/training.md)."""
