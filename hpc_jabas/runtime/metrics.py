"""Per-iteration metrics, gathered to rank 0, written as JSONL (rank 0 only).

Each rank keeps its own per-iteration records (a few numbers: compute, wait, micro-batch count,
loss sum, slowdown, ...). Every ``metrics_period`` iterations (and before a checkpoint, and at
the end) the ranks send those numbers as one fixed-width float64 tensor of shape
(iterations, len(PER_RANK)) through one Horovod allgather; rank 0 joins them with its own
records' shared fields (epoch, B, plan, lr scale, statistics) and writes one ``iteration``
record per iteration. All ranks flush at the same points, so they hold the same number of
records when they do.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

# per rank, per iteration: what the allgather carries (column order)
PER_RANK = ("rank", "it", "compute_s", "real_compute_s", "emulation_wait_s", "wait_s", "iter_s", "n_local",
            "loss_sum", "slowdown")


def json_safe(obj: Any) -> Any:
    """``obj`` as strict JSON values: a NaN or an infinity becomes null (metrics.jsonl stays valid JSON, which
    has neither), tuples become lists, anything else (a tensor, a numpy number) its float."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, (str, int, float, bool)) else k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    try:
        return json_safe(float(obj))
    except (TypeError, ValueError):
        return str(obj)


class MetricsWriter:
    """JSONL in the run directory, written by rank 0 only (``path=None`` elsewhere: writes are dropped)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._f: IO[str] | None = None
        if path is not None:
            try:
                from hpc_jabas.trust import make_private, private_dir
                private_dir(path.parent)
                self._f = open(path, "a", buffering=1)
                make_private(path)              # read back (lost iterations, the next mix): hpc_jabas/trust.py
            except OSError as e:      # a file where the run directory should be, no permission, /proc...
                from hpc_jabas.errors import ConfigError
                raise ConfigError(f"run_dir {str(path.parent)!r} cannot be written: {e.strerror or e}; "
                                  "give a directory you can write (--run-dir)") from None

    def write(self, rec: dict[str, Any]) -> None:
        if self._f is not None:
            self._f.write(json.dumps(json_safe(rec), allow_nan=False) + "\n")

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _horovod_allgather(t: torch.Tensor, name: str) -> torch.Tensor:
    from hpc_jabas.runtime import comm
    return comm.allgather_tensor(t, name=name)


class IterationMetrics:
    """This rank's pending iteration records; ``flush`` gathers them and rank 0 writes them."""

    def __init__(self, rank: int, world: int, writer: MetricsWriter,
                 allgather: Callable[[torch.Tensor, str], torch.Tensor] | None = None) -> None:
        self.rank, self.world = rank, world
        self.writer = writer
        self._allgather = allgather or _horovod_allgather
        self._pending: list[dict[str, Any]] = []

    def add(self, rec: dict[str, Any]) -> None:
        self._pending.append(rec)

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Collective (every rank, same point). Rank 0 writes one record per pending iteration."""
        if not self._pending:      # the same on every rank: each appends one record per iteration
            return
        recs, self._pending = self._pending, []
        rows = torch.tensor([[float(r[k]) for k in PER_RANK] for r in recs], dtype=torch.float64)
        table = self._allgather(rows, "hj.metrics")
        if self.rank != 0:
            return
        col = {k: i for i, k in enumerate(PER_RANK)}
        by_it: dict[int, list[list[float]]] = {}
        for row in table.tolist():
            by_it.setdefault(int(row[col["it"]]), []).append(row)
        for r0 in recs:
            rows_it = sorted(by_it.get(int(r0["it"]), []), key=lambda x: x[col["rank"]])
            if [int(x[col["rank"]]) for x in rows_it] != list(range(self.world)):
                raise RuntimeError(f"metrics of iteration {r0['it']} came from ranks "
                                   f"{[int(x[col['rank']]) for x in rows_it]}, expected 0..{self.world - 1}")
            self.writer.write(self._iteration_record(r0, rows_it, col))

    @staticmethod
    def _iteration_record(r0: dict[str, Any], rows: list[list[float]], col: dict[str, int]) -> dict[str, Any]:
        def per_rank(k: str) -> list[float]:
            return [x[col[k]] for x in rows]
        iter_s = max(per_rank("iter_s"))
        out = {"type": "iteration", "it": r0["it"], "epoch": r0["epoch"], "B": r0["B"], "samples": r0["samples"],
               "plan": r0["plan"], "iter_s": iter_s,
               "samples_per_s": r0["samples"] / iter_s if iter_s > 0 else None, "lr_scale": r0["lr_scale"],
               "loss": sum(per_rank("loss_sum")) / r0["samples"],
               "compute_s": per_rank("compute_s"), "wait_s": per_rank("wait_s"),
               "n_local": [int(v) for v in per_rank("n_local")], "slowdown": per_rank("slowdown"),
               "contained_errors": int(r0.get("contained_errors", 0)), "measure": bool(r0.get("measure", False))}
        if "stats" in r0:
            out["stats"] = r0["stats"]
        return out
