"""The Trainer's arguments checked before anything is built, and what a rank totals in a job (runtime/trainer.py)."""
from __future__ import annotations

from dataclasses import dataclass

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime import data, evaluate
from hpc_jabas.runtime.hooks import SCHEDULER_STEPS, Callback, ControllerCore, EpochEndHook


def check_parts(dataset, scheduler, scheduler_step: str, controller, epoch_end_hook, callbacks) -> None:
    """The Trainer's arguments, checked before anything is built (ConfigError, or TypeError for a wrong type)."""
    if scheduler_step not in SCHEDULER_STEPS:
        raise ConfigError(f"scheduler_step={scheduler_step!r} is invalid; use one of {', '.join(SCHEDULER_STEPS)}")
    if scheduler_step == "iteration" and evaluate.is_plateau(scheduler):
        raise ConfigError("scheduler_step='iteration' cannot drive ReduceLROnPlateau (it steps on the "
                          "evaluation metric at each epoch end); use scheduler_step='epoch'")
    if controller is not None and not isinstance(controller, ControllerCore):
        raise TypeError(f"controller {controller!r} does not implement hpc_jabas.runtime.hooks.Controller")
    if epoch_end_hook is not None and not isinstance(epoch_end_hook, EpochEndHook):
        raise TypeError(f"epoch_end_hook {epoch_end_hook!r} is not an hpc_jabas.runtime.hooks.EpochEndHook")
    if not all(isinstance(cb, Callback) for cb in callbacks):
        raise TypeError("callbacks must be hpc_jabas.runtime.hooks.Callback instances")
    data.check_input(dataset)          # a map-style Dataset or a DataLoader over one (runtime/data.py)


@dataclass
class RankTotals:
    """What this rank computed in this job (not checkpointed: a resumed job counts afresh): samples, and compute
    seconds (an emulated GPU's wait included). The trainer's ``samples_local`` and ``compute_local_s``."""
    samples: int = 0
    compute_s: float = 0.0
