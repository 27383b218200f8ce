"""The trainer's typed extension points: controllers, the epoch-end hook, callbacks.

``trainer`` arguments are ``hpc_jabas.runtime.trainer.Trainer`` (typed ``Any`` here so that this
module, which the trainer imports, does not import it back).

- ``Controller`` (a Protocol; ``runtime.controller.BaseController`` implements it): called on
  every rank after every iteration; on its decision rounds it runs the decision protocol
  (``trainer.decisions.run``) and returns the Decision every rank received; the trainer applies it.
- ``EpochEndHook`` (an ABC; ``runtime.lifecycle.EpochEndAutoscaler`` implements it): at every
  epoch end, *after* that epoch's checkpoint is on disk, the trainer runs ``decide`` on rank 0
  (contained, broadcast), and on a move ``act`` on rank 0 (contained, broadcast); when the act
  reports a move the trainer records it in ``trainer.moved_to`` and the job ends. The hook keeps
  its own state; the trainer checkpoints it through ``state_dict``/``load_state_dict``.
- ``Callback``: plain notifications on every rank (no collectives of their own).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal, Protocol, runtime_checkable

from hpc_jabas.core.decision import Decision, MoveDecision

SchedulerStep = Literal["epoch", "iteration"]
SCHEDULER_STEPS: tuple[SchedulerStep, ...] = ("epoch", "iteration")


@runtime_checkable
class Controller(Protocol):
    """What the trainer needs from a batch-size / balancing controller."""

    def attach(self, trainer: Any) -> None:
        """Called once by the trainer's constructor, on every rank."""

    def wants_stats(self, iteration: int) -> bool:
        """Should iteration ``iteration`` measure the gradient statistics (same answer on every rank)?"""

    def after_step(self, trainer: Any, rec: dict[str, Any]) -> Decision | None:
        """Collective on decision rounds: the Decision every rank received (or None)."""

    def b_trajectory(self) -> list[tuple[int, int]]:
        """(iteration, B) at every change of B so far (the auto-scaler's forecast input)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, d: dict[str, Any]) -> None: ...


class EpochEndHook(ABC):
    """Decide (rank 0), then act (rank 0) at an epoch end; the trainer broadcasts and contains both."""

    @abstractmethod
    def decide(self, trainer: Any, epoch: int) -> MoveDecision:
        """Rank 0 only, after the checkpoint of ``epoch`` is written: stay, or move to another mix."""

    def act(self, trainer: Any, d: MoveDecision) -> MoveDecision:
        """Rank 0 only, for a move: start the next job; returns the move that happened (or a stay)."""
        return MoveDecision.stay("this hook does not act on moves")

    def state_dict(self) -> dict[str, Any]:
        """Carried in the trainer's checkpoint (and, after ``decide``, in a side file; see Trainer)."""
        return {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        return None


class Callback:
    """Override what you need; every rank calls these at the same points."""

    def on_first_step(self, trainer: Any) -> None:
        """After the first iteration of ``Trainer.fit`` (e.g. to measure start-up overhead)."""

    def on_step_end(self, trainer: Any, rec: dict[str, Any]) -> None:
        """After every iteration (and after any decision it triggered was applied)."""

    def on_epoch_end(self, trainer: Any, epoch: int) -> None:
        """After the epoch's checkpoint, before the epoch-end hook."""
