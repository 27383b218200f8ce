"""The task contract: what a Slurm job's task callable ("module:callable") returns, typed.

    def build() -> hpc_jabas.Task:
        model = make_model()
        return hpc_jabas.Task(model, torch.optim.SGD(model.parameters(), lr=0.1), dataset, nn.CrossEntropyLoss())

A task callable with a required argument gets the job's JobConfig (``build(cfg)``: ``cfg.batch``, ``cfg.epochs``,
``cfg.seed``, ...; :func:`call_task`), so that its lr or schedule can follow the job's keys.

The fields mirror the Trainer's arguments. A task callable may still return the older dict with the same
keys ("model", "optimizer", "dataset", "loss_fn", optional "scheduler", "eval_fn", "forward_fn",
"callbacks", "scheduler_step"); ``Task.from_parts`` converts it. ``validate`` checks the types once, with
one ConfigError line per problem; ``hpc-jabas submit``'s dry run and the job's launcher
(runtime/job/launch.py) both go through ``from_parts``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.hooks import SCHEDULER_STEPS, Callback, SchedulerStep

#: the dict keys a task must give (loss_fn may be left out, or None, when forward_fn computes the loss)
REQUIRED = ("model", "optimizer", "dataset")


@dataclass
class Task:
    """A training task: the Trainer's arguments that the user's code builds (config comes from the job)."""

    model: Any                                   # torch.nn.Module
    optimizer: Any                               # torch.optim.Optimizer over the model's parameters
    dataset: Any                                 # a map-style Dataset, or a DataLoader over one
    loss_fn: Callable | None = None              # loss_fn(model(x), y); None when forward_fn gives the loss
    scheduler: Any = None
    eval_fn: Callable | None = None
    forward_fn: Callable | None = None           # forward_fn(model, batch) -> loss
    callbacks: Sequence[Callback] = field(default_factory=tuple)
    scheduler_step: SchedulerStep = "epoch"

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_parts(cls, parts: Any, name: str = "task") -> Task:
        """A Task from what a task callable returned (a Task, or the older dict), validated.
        ``name``: the task as the user wrote it ("module:callable"), for the error line."""
        if isinstance(parts, Task):
            return parts.validate(name)
        keys = cls.fields()
        must = (f"it must return a hpc_jabas.Task (or a dict with {', '.join(keys[:4])}; optional: "
                f"{', '.join(keys[4:])})")
        if not isinstance(parts, dict):
            raise ConfigError(f"task {name!r} returned {type(parts).__name__}; {must}")
        missing = [k for k in REQUIRED if k not in parts]
        if "loss_fn" not in parts and parts.get("forward_fn") is None:
            missing.append("loss_fn")
        if missing:
            raise ConfigError(f"task {name!r} returned a dict without {', '.join(missing)}; {must}")
        unknown = [k for k in parts if k not in keys]
        if unknown:
            raise ConfigError(f"task {name!r} returned a dict with unknown key {unknown[0]!r} "
                              f"(valid: {', '.join(keys)})")
        d = dict(parts)
        if d.get("callbacks") is None:
            d.pop("callbacks", None)
        if d.get("scheduler_step") is None:
            d.pop("scheduler_step", None)
        return cls(**d).validate(name)

    def validate(self, name: str = "task") -> Task:
        """Check what the Trainer needs of the parts (one ConfigError line each); returns self."""
        import torch
        from torch.utils.data import DataLoader

        def bad(key: str, want: str, got: object) -> ConfigError:
            return ConfigError(f"task {name!r} returned {key}={type(got).__module__}.{type(got).__qualname__}"
                               f"{f' ({got!r})' if isinstance(got, (str, int, float)) else ''}; it must be {want}")
        if not isinstance(self.model, torch.nn.Module):
            raise bad("model", "a torch.nn.Module", self.model)
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise bad("optimizer", "a torch.optim.Optimizer (over the model's parameters)", self.optimizer)
        ds = self.dataset
        if not isinstance(ds, DataLoader) and not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
            raise bad("dataset", "a map-style Dataset (__len__ and __getitem__) or a DataLoader over one", ds)
        if self.forward_fn is None and not callable(self.loss_fn):
            raise bad("loss_fn", "callable (e.g. torch.nn.CrossEntropyLoss()), or give forward_fn", self.loss_fn)
        if self.forward_fn is not None and not callable(self.forward_fn):
            raise bad("forward_fn", "callable: forward_fn(model, batch) -> loss", self.forward_fn)
        if self.loss_fn is not None and not callable(self.loss_fn):
            raise bad("loss_fn", "callable (e.g. torch.nn.CrossEntropyLoss()), or None", self.loss_fn)
        if self.eval_fn is not None and not callable(self.eval_fn):
            raise bad("eval_fn", "callable: eval_fn(model) -> dict of metrics", self.eval_fn)
        if isinstance(self.callbacks, (str, bytes)) or not isinstance(self.callbacks, Sequence):
            raise bad("callbacks", "a list of hpc_jabas.Callback instances", self.callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise bad("callbacks", "a list of hpc_jabas.Callback instances; one item is not", cb)
        if self.scheduler_step not in SCHEDULER_STEPS:
            raise ConfigError(f"task {name!r} returned scheduler_step={self.scheduler_step!r}; it must be one of "
                              f"{', '.join(SCHEDULER_STEPS)}")
        return self

    def trainer_kwargs(self) -> dict[str, Any]:
        """The Trainer's keyword arguments besides model, optimizer, dataset and loss_fn."""
        return {"scheduler": self.scheduler, "eval_fn": self.eval_fn, "forward_fn": self.forward_fn,
                "callbacks": list(self.callbacks), "scheduler_step": self.scheduler_step}


def call_task(fn: Callable[..., Any], config: Mapping[str, Any], run_dir: str | None = None) -> Any:
    """What a task callable returns: ``fn(cfg)`` when it has a required positional argument, with ``cfg`` the
    job's JobConfig (batch, batch_ref, epochs, seed, ...: the same keys the job's Trainer gets), else ``fn()``
    (a ``build(lr=0.05)`` whose arguments all have defaults is called as before, with none)."""
    import inspect
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    except (TypeError, ValueError):
        params = []
    if not params:
        return fn()
    from hpc_jabas.core.config.sections import JobConfig
    d = {k: v for k, v in config.items() if k != "job"}
    if run_dir is not None:
        d["run_dir"] = run_dir
    return fn(JobConfig.from_dict(d))
