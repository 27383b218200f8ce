"""hpc-jabas: adaptive batching and weighted heterogeneous data parallelism on Horovod + Slurm.

Importing the package is cheap and imports no Horovod; ``Trainer`` (and ``comm``) load it.
"""
from __future__ import annotations

import sys

from hpc_jabas.core.config import JobConfig, add_arguments
from hpc_jabas.core.config import from_args as config_from_args
from hpc_jabas.core.plan import Plan, proportional_plan
from hpc_jabas.errors import ConfigError, JabasError

__version__ = "0.1.0"
__all__ = ["JobConfig", "Plan", "Trainer", "HeterogeneousOptimizer", "HeterogeneousSampler", "add_arguments",
           "config_from_args", "proportional_plan", "report_throughput", "run_main", "ConfigError", "JabasError",
           "Decision", "MoveDecision", "Callback", "Controller", "EpochEndHook"]


def __getattr__(name):
    if name == "Trainer":
        from hpc_jabas.runtime.trainer import Trainer
        return Trainer
    if name in ("Callback", "Controller", "EpochEndHook"):     # the trainer's extension points (no Horovod)
        from hpc_jabas.runtime import hooks
        return getattr(hooks, name)
    if name in ("Decision", "MoveDecision"):
        from hpc_jabas.core import decision
        return getattr(decision, name)
    if name == "HeterogeneousOptimizer":
        from hpc_jabas.runtime.optim import HeterogeneousOptimizer
        return HeterogeneousOptimizer
    if name == "HeterogeneousSampler":
        from hpc_jabas.core.sampler import HeterogeneousSampler
        return HeterogeneousSampler
    raise AttributeError(name)


def report_throughput(trainer, result: dict | None = None, file=None) -> list[dict]:
    """Gather every rank's samples and compute time; rank 0 prints one line per rank."""
    from hpc_jabas.runtime import comm
    rows = comm.allgather_object({"rank": trainer.rank, "gpu": trainer.gpu_types[trainer.rank],
                                  "samples": trainer.samples_local, "compute_s": trainer.compute_local_s},
                                 name="hj.report")
    if trainer.rank == 0:
        out = file or sys.stdout
        wall = (result or {}).get("wall_s") or 0.0
        for r in rows:
            sps = r["samples"] / wall if wall else 0.0
            busy = r["compute_s"] / wall if wall else 0.0
            print(f"rank {r['rank']} gpu={r['gpu']:<8} samples={r['samples']:<7d} "
                  f"samples_per_s={sps:9.1f} busy={busy:5.1%}", file=out)
        if result:
            extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items())
            print(f"total {extra}", file=out, flush=True)
    return rows


def run_main(fn, argv=None) -> None:
    """Run a main(), turning hpc-jabas errors into one clear line and exit code 2."""
    try:
        rc = fn(argv)
    except JabasError as e:
        if not getattr(e, "quiet", False):      # the other ranks of an error rank 0 has already said
            print(f"hpc-jabas: error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(rc or 0)
