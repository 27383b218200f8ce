"""Per-iteration metrics, gathered to rank 0, written as JSONL (rank 0 only).

Each rank keeps its own per-iteration records (a few numbers: compute, wait, micro-batch count,
loss sum, slowdown, ...). At the first safe point agreement boundary after ``metrics_period``
iterations (and before a checkpoint, and at the end) the ranks send those numbers as one fixed-width float64
tensor of shape (iterations, len(PER_RANK)) through one Horovod allgather; rank 0 joins them with its own
records' shared fields (epoch, B, plan, lr scale, statistics) and writes one ``iteration``
record per iteration. All ranks flush at the same points, so they hold the same number of
records when they do.
"""
from __future__ import annotations

import json
import math
import operator
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.record import StepRecord
from hpc_jabas.trust import check_write_dir, open_append_nofollow, open_nofollow, write_all

# per rank, per iteration: what the allgather carries (column order)
PER_RANK = ("rank", "it", "compute_s", "real_compute_s", "emulation_wait_s", "wait_s", "iter_s", "n_local",
            "loss_sum", "slowdown")


_PLAIN = (str, bool, int, type(None))


def json_safe(obj: Any) -> Any:
    """``obj`` as strict JSON values: a NaN or an infinity becomes null (metrics.jsonl stays valid JSON, which
    has neither), tuples become lists, anything else (a tensor, a numpy number) its float. Plain values inside a
    dict or a list are taken in place (no call per value: a record per iteration is written)."""
    t = type(obj)
    if t is float:
        return obj if math.isfinite(obj) else None
    if t in _PLAIN:
        return obj
    if isinstance(obj, dict):
        return {(k if isinstance(k, (str, int, float, bool)) else str(k)):
                (v if type(v) in _PLAIN else (v if math.isfinite(v) else None) if type(v) is float else json_safe(v))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [v if type(v) in _PLAIN else (v if math.isfinite(v) else None) if type(v) is float else json_safe(v)
                for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    try:
        return json_safe(float(obj))
    except (TypeError, ValueError):
        return str(obj)


TORN_SUFFIX = ".torn-"


class MetricsWriter:
    """JSONL in the run directory, written by rank 0 only (``path=None`` elsewhere: writes are dropped).

    The run directory is checked before the first write (hpc_jabas/trust.py: this user's, not writable by
    others, no link where the log goes) and the log is opened without following a link. Each record is one
    whole line written with one ``write``; a write cut short (a full disk) is taken back to the last whole
    line. A torn last line that an earlier run left (a kill, a full disk) is set aside before the first record
    is written (:func:`set_torn_tail_aside`; then the run directory's lock is held, so the tail is not one
    that another live writer is writing), so that no record is glued onto it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fd: int | None = None
        self._tail_checked = False
        if path is not None:
            check_write_dir(path.parent, "run directory")       # ConfigError: one line, nothing written
            try:
                self._fd = open_append_nofollow(path, "metrics record")
            except OSError as e:      # no permission, a full disk, /proc...
                raise ConfigError(f"run_dir {str(path.parent)!r} cannot be written: {e.strerror or e}; "
                                  "give a directory you can write (--run-dir)") from None

    def write(self, rec: dict[str, Any]) -> None:
        if self._fd is None:
            return
        if not self._tail_checked:
            assert self.path is not None
            set_torn_tail_aside(self._fd, self.path)
            self._tail_checked = True
        try:
            append_line(self._fd, (json.dumps(json_safe(rec), allow_nan=False) + "\n").encode())
        except OSError as e:            # a full disk, a quota, a file size limit: the log ends in a whole line
            assert self.path is not None
            free = shutil.disk_usage(self.path.parent).free if self.path.parent.exists() else None
            raise ConfigError(f"cannot write {str(self.path)!r}: {e.strerror or e}"
                              f"{f' ({free} bytes free)' if free is not None else ''}; the records so far and the "
                              "checkpoints are intact: free space (or raise the quota), then run again to "
                              "resume") from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:       # an interpreter shutting down
            pass


def append_line(fd: int, line: bytes) -> None:
    """``line`` (one whole line) appended to ``fd`` (opened O_APPEND by its one writer) in one ``write``; when
    the write fails or is cut short (a full disk), the log is taken back to where it was and the error raised:
    it never ends in a torn line of ours."""
    size = os.fstat(fd).st_size
    try:
        n = os.write(fd, line)
        if n < len(line):
            write_all(fd, line[n:])
    except BaseException:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass
        raise


def _last_newline_end(fd: int, size: int) -> int:
    """The offset just after the last newline in the first ``size`` bytes of ``fd`` (0 when none)."""
    pos, chunk = size, 1 << 16
    while pos > 0:
        lo = max(0, pos - chunk)
        i = os.pread(fd, pos - lo, lo).rfind(b"\n")
        if i >= 0:
            return lo + i + 1
        pos = lo
    return 0


def set_torn_tail_aside(fd: int, path: Path) -> Path | None:
    """When the log open at ``fd`` ends without a newline (a writer killed or stopped by a full disk): a torn
    last record that is whole JSON gets its newline; other torn bytes are moved to ``<path>.torn-<n>`` (a new
    file, never through a link) and the log is cut back to its last whole line, with a warning naming both.
    Returns the file they went to (None when nothing was set aside). When they cannot be saved (a full disk),
    the line is ended in place instead (readers say it and leave it out), so nothing is lost."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return None
    start = _last_newline_end(fd, size)
    torn = os.pread(fd, size - start, start)
    try:
        whole = isinstance(json.loads(torn), dict)
    except ValueError:
        whole = False
    log = get_logger(__name__)
    if whole:
        os.write(fd, b"\n")
        log.warning("%s: its last record had no line end (a writer cut short); ended it", path)
        return None
    n = 1
    while True:
        aside = path.with_name(f"{path.name}{TORN_SUFFIX}{n}")
        try:
            afd = open_nofollow(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "torn metrics bytes")
            break
        except FileExistsError:
            n += 1
    try:
        try:
            write_all(afd, torn)
            os.fsync(afd)
        finally:
            os.close(afd)
    except OSError:
        try:
            os.unlink(aside)
        except OSError:
            pass
        os.write(fd, b"\n")
        log.warning("%s ends in a torn line (%d bytes of a write cut short); they could not be set aside, so "
                    "the line was ended in place (readers leave it out)", path, len(torn))
        return None
    os.ftruncate(fd, start)
    log.warning("%s ended in a torn line (%d bytes of a write cut short: a kill or a full disk); set aside in %s, "
                "new records start on a line of their own", path, len(torn), aside)
    return aside


def _horovod_allgather(t: torch.Tensor, name: str) -> torch.Tensor:
    from hpc_jabas.runtime.comm import seam as comm
    return comm.allgather_tensor(t, name=name)


class IterationMetrics:
    """This rank's pending iteration records; ``flush`` gathers them and rank 0 writes them."""

    def __init__(self, rank: int, world: int, writer: MetricsWriter,
                 allgather: Callable[[torch.Tensor, str], torch.Tensor] | None = None) -> None:
        self.rank, self.world = rank, world
        self.writer = writer
        self._allgather = allgather or _horovod_allgather
        self._pending: list[StepRecord] = []

    def add(self, rec: StepRecord) -> None:
        self._pending.append(rec)

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> list[dict[str, Any]]:
        """Collective (every rank, same point). Rank 0 writes one record per pending iteration and returns them
        (every rank's numbers in each, the loss the mean over all ranks' samples); the other ranks return []."""
        if not self._pending:      # the same on every rank: each appends one record per iteration
            return []
        recs, self._pending = self._pending, []
        rows = torch.tensor([[float(getattr(r, k)) for k in PER_RANK] for r in recs], dtype=torch.float64)
        table = self._allgather(rows, "hj.metrics")
        if self.rank != 0:
            return []
        out: list[dict[str, Any]] = []
        col = {k: i for i, k in enumerate(PER_RANK)}
        by_it: dict[int, list[list[float]]] = {}
        for row in table.tolist():
            by_it.setdefault(int(row[col["it"]]), []).append(row)
        for r0 in recs:
            rows_it = sorted(by_it.get(int(r0.it), []), key=operator.itemgetter(col["rank"]))
            if [int(x[col["rank"]]) for x in rows_it] != list(range(self.world)):
                raise RuntimeError(f"metrics of iteration {r0.it} came from ranks "
                                   f"{[int(x[col['rank']]) for x in rows_it]}, expected 0..{self.world - 1}")
            out.append(self._iteration_record(r0, rows_it, col))
            self.writer.write(out[-1])
        return out

    @staticmethod
    def _iteration_record(r0: StepRecord, rows: list[list[float]], col: dict[str, int]) -> dict[str, Any]:
        cols = list(zip(*rows))                # one column per PER_RANK key, one value per rank (in rank order)
        iter_s = max(cols[col["iter_s"]])
        out = {"type": "iteration", "it": r0.it, "epoch": r0.epoch, "B": r0.B, "samples": r0.samples,
               "plan": r0.plan, "iter_s": iter_s,
               "samples_per_s": r0.samples / iter_s if iter_s > 0 else None, "lr_scale": r0.lr_scale,
               "loss": sum(cols[col["loss_sum"]]) / r0.samples,
               "compute_s": list(cols[col["compute_s"]]), "wait_s": list(cols[col["wait_s"]]),
               "n_local": [int(v) for v in cols[col["n_local"]]], "slowdown": list(cols[col["slowdown"]]),
               "contained_errors": int(r0.contained_errors), "measure": bool(r0.measure)}
        if r0.stats is not None:
            out["stats"] = r0.stats
        if r0.lr_warmup is not None:           # batch_start = "knee": the step's lr is lr_scale x this
            out["lr_warmup"] = r0.lr_warmup
        return out
