"""The script's own loop: what a training script that keeps its loop calls from ``hpc_jabas``.

:func:`init` (``hpc_jabas.init``) starts a backend for a script that starts none. A script that calls
hvd.init() or ``torch.distributed.init_process_group(...)`` itself needs no call: the low-level layer
(``HeterogeneousOptimizer``) adopts that initialisation at its first ``begin()`` (runtime/comm.py ``adopt``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime import comm


class Process(NamedTuple):
    """Where this process stands in the job: what :func:`init` returns."""

    rank: int
    size: int
    local_rank: int
    device: torch.device
    backend: str


def init(backend: str | None = None) -> Process:
    """Start the job's backend in this process and return its rank, size, local rank, device and backend name.

    ``backend``: "horovod", "torch" or "auto" (None: the ``HPC_JABAS_BACKEND`` environment variable, else
    "auto": Horovod when it imports, torch under torchrun). The ranks find each other as the launcher started
    them (mpirun, srun, torchrun; none: one rank). A script that already called hvd.init() or
    ``init_process_group`` gets that one; asking for the other backend then is a ConfigError. Idempotent."""
    if backend is not None:
        comm.check_backend(backend)
    if not comm.adopt():
        comm.use(backend)
        comm.init()
    elif backend not in (None, "auto") and comm.backend() != backend:
        raise ConfigError(f"hpc_jabas.init(backend={backend!r}) but this process already runs the "
                               f"{comm.backend()} backend (the script's own initialisation); one process runs one")
    return Process(comm.rank(), comm.size(), comm.local_rank(), comm.device(), comm.backend())
