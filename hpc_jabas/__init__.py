"""hpc-jabas: adaptive batching and weighted data parallelism for PyTorch on mixed GPU kinds and Slurm, over
torch.distributed (what DDP runs on) or Horovod.

Everything a user needs is here: ``import hpc_jabas`` and nothing deeper (docs/layout.md). Importing the
package is cheap: no torch, Horovod or submitit; the names that need them load on first use.
"""
from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from hpc_jabas.core.config.cliargs import ArgumentParser, add_arguments
from hpc_jabas.core.config.cliargs import from_args as _from_args
from hpc_jabas.core.config.jobspec import JobSpec, SlurmRequest
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.planning import Plan, proportional_plan
from hpc_jabas.errors import (
    CheckpointError,
    ConfigError,
    InfeasibleError,
    JabasError,
    SlurmError,
    StateError,
    error_line,  # noqa: F401  (re-exported)
)
from hpc_jabas.log import add_verbosity_flags, configure_from_args
from hpc_jabas.log import configure as configure_logging
from hpc_jabas.runtime.comm import exits as _exits

if TYPE_CHECKING:      # the lazy names below, for type checkers and editors
    from hpc_jabas.core.adaptive.decision import Decision, MoveDecision
    from hpc_jabas.core.planning.sampler import HeterogeneousSampler
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.evaluate import DistributedEval
    from hpc_jabas.runtime.hooks import Callback, Controller, EpochEndHook
    from hpc_jabas.runtime.job.task import Task
    from hpc_jabas.runtime.loop import Jabas, init
    from hpc_jabas.runtime.optim import HeterogeneousOptimizer
    from hpc_jabas.runtime.trainer import Trainer
    from hpc_jabas.slurm.executor import Submission, submit
    from hpc_jabas.slurm.watch import wait_chain

__version__ = "0.1.0"

#: name -> module, loaded on first use (they import torch, Horovod or submitit)
_LAZY = {
    "Trainer": "hpc_jabas.runtime.trainer",
    "World": "hpc_jabas.runtime.comm.world",
    "Task": "hpc_jabas.runtime.job.task",              # what a Slurm job's task callable returns
    "DistributedEval": "hpc_jabas.runtime.evaluate",
    "HeterogeneousOptimizer": "hpc_jabas.runtime.optim",
    "HeterogeneousSampler": "hpc_jabas.core.planning.sampler",
    "init": "hpc_jabas.runtime.loop",              # start a backend (a script that calls hvd.init() needs none)
    "Jabas": "hpc_jabas.runtime.loop",             # keep your loop: setup, loader, backward, epochs, save
    "Callback": "hpc_jabas.runtime.hooks",          # the trainer's extension points (no backend import)
    "Controller": "hpc_jabas.runtime.hooks",
    "EpochEndHook": "hpc_jabas.runtime.hooks",
    "Decision": "hpc_jabas.core.adaptive.decision",
    "MoveDecision": "hpc_jabas.core.adaptive.decision",
    "submit": "hpc_jabas.slurm.executor",          # submitit
    "Submission": "hpc_jabas.slurm.executor",
    "wait_chain": "hpc_jabas.slurm.watch",
}

__all__ = [
    # training
    "Trainer", "JobConfig", "Task", "World", "DistributedEval", "ArgumentParser", "add_arguments", "config_from_args",
    "run_main",
    "report_throughput",
    # Slurm
    "JobSpec", "SlurmRequest", "submit", "Submission", "wait_chain",
    # logging
    "configure_logging", "add_verbosity_flags", "configure_from_args",
    # errors
    "JabasError", "ConfigError", "SlurmError", "CheckpointError", "InfeasibleError", "StateError",
    # extension points and the low-level layer
    "Callback", "Controller", "EpochEndHook", "Decision", "MoveDecision", "Plan", "proportional_plan",
    "HeterogeneousOptimizer", "HeterogeneousSampler", "init", "Jabas",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hpc_jabas' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def report_throughput(trainer: Trainer, result: dict | None = None, file=None) -> list[dict]:
    """Gather every rank's samples and compute time; rank 0 prints one line per rank. A rank's GPU type is named
    as the Trainer's log names it (``World.describe``): a CPU rank whose type nothing named (no ``gpu_types``, no
    Slurm, no ``--emulate``) shows its device instead, and its row's "gpu" is None."""
    from hpc_jabas.runtime.comm import seam as comm
    said = trainer.world_info.describe()
    gpu = said.split(" gpu=", 1)[1].split()[0] if " gpu=" in said else None
    rows = comm.allgather_object({"rank": trainer.rank, "gpu": gpu, "device": str(trainer.device),
                                  "samples": trainer.samples_local, "compute_s": trainer.compute_local_s},
                                 name="hj.report")
    if trainer.rank == 0:
        out = file or sys.stdout
        wall = (result or {}).get("wall_s") or 0.0
        for r in rows:
            sps = r["samples"] / wall if wall else 0.0
            busy = r["compute_s"] / wall if wall else 0.0
            where = f"gpu={r['gpu']:<8}" if r["gpu"] is not None else f"device={r['device']:<5}"
            print(f"rank {r['rank']} {where} samples={r['samples']:<7d} "
                  f"samples_per_s={sps:9.1f} busy={busy:5.1%}", file=out)
        if result:
            extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items())
            print(f"total {extra}", file=out, flush=True)
    return rows


def config_from_args(args) -> JobConfig:
    """The job's config from parsed arguments (``add_arguments``' flags, the script's own flags it kept, --config),
    validated; -q/--quiet and -v/--verbose applied to the logging."""
    configure_from_args(args)
    return _from_args(args)


def run_main(fn, argv=None) -> None:
    """Run ``fn(argv)`` (a CLI-style main) or a plain ``fn()``: an hpc-jabas error becomes one line (from rank 0,
    or from the rank it concerns) and exit code 2 on every rank (hpc_jabas/exits.py). An uncaught hpc-jabas
    error ends the same way without it: ``import hpc_jabas`` installs the same handling as ``sys.excepthook``."""
    _exits.run_main(fn, argv)


_exits.install()        # an uncaught JabasError: one line, exit code 2, on every rank (hpc_jabas/exits.py)
