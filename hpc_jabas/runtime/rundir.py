"""The job's run directory on one rank: where it is, its ``checkpoints/``, metrics.jsonl's writer (rank 0), rank 0's
checks before the first write (ours, no planted link or file: hpc_jabas/trust.py) said on every rank by the first
agreement, and rank 0's hold on it for the process's life (a second writer is refused)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.loop import from_rank0
from hpc_jabas.runtime.metrics import MetricsWriter
from hpc_jabas.runtime.persist.dirlock import DirLock, lock_on_rank0, rank_error


class RunDir:
    def __init__(self, path: Any, rank: int):
        self.path, self.rank = Path(str(path)), rank
        self.ckpt_dir = self.path / "checkpoints"
        self.error: str | None = None           # rank 0's refusal, said on every rank by agree()
        try:
            if rank == 0:
                from hpc_jabas.trust import check_run_dir
                check_run_dir(self.path)
            self.metrics = MetricsWriter(self.path / "metrics.jsonl" if rank == 0 else None)
        except ConfigError as e:
            self.metrics, self.error = MetricsWriter(None), str(e)

    def agree(self) -> None:
        """Collective, before any other: what only rank 0 can check (the run directory can be written and no
        other job holds it) is agreed by every rank; refused, every rank raises rank 0's line (quiet elsewhere)."""
        err = self.error
        if self.rank == 0 and err is None:
            try:
                DirLock(self.path, "run directory").acquire()
            except ConfigError as e:
                err = str(e)
        err = from_rank0(err, "hj.run_dir")
        if err:
            raise rank_error(ConfigError, err, self.rank)

    def lock(self, wait_s: float = 0.0) -> None:
        """Collective: rank 0 holds the run directory for the process's life; a second writer is refused."""
        lock_on_rank0(self.path, self.rank, "run directory", wait_s=wait_s)
