"""The profiler's defaults. No torch here: the ``hpc-jabas`` CLI reads them for every command."""
from __future__ import annotations

from hpc_jabas.core.perf.perfmodel import DEFAULT_B_LIST

DEFAULT_B_LIMIT = 4096          # largest micro-batch the memory probe / estimate reports
DEFAULT_ALLREDUCE_SIZES = (4 << 10, 64 << 10, 1 << 20, 8 << 20)
OPTIMIZERS = ("sgd", "adam")

__all__ = ["DEFAULT_ALLREDUCE_SIZES", "DEFAULT_B_LIMIT", "DEFAULT_B_LIST", "OPTIMIZERS"]
