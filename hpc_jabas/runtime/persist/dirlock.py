"""One writer per run directory and per chain directory.

``DirLock(dir).acquire()`` takes an exclusive ``flock`` on ``<dir>/.hpc-jabas.lock`` and writes the holder
into it (host, pid, Slurm job id, since when). The kernel drops the lock when the holder's process ends,
``kill -9`` included, so there is nothing stale to clean. A second writer is refused with one line that
names the holder (ConfigError: two jobs given the same directory is a mistake in the input).
``wait_s`` waits that long for the holder to go (a chain's next job may start while the job that submitted
it is still writing its last lines).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from hpc_jabas.errors import ConfigError, JabasError
from hpc_jabas.slurm.env import SlurmEnv
from hpc_jabas.trust import check_write_dir, open_nofollow

LOCK_NAME = ".hpc-jabas.lock"
_HELD: dict[str, DirLock] = {}      # lock file -> the DirLock of this process that holds it


def _me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "job_id": SlurmEnv().job_id, "since": time.time()}


def holder_text(h: dict[str, Any] | None) -> str:
    if not h:
        return "another process"
    job = f"Slurm job {h['job_id']}, " if h.get("job_id") else ""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(h.get("since") or 0)))
    return f"{job}pid {h.get('pid')} on {h.get('host')} since {since}"


class DirLock:
    def __init__(self, directory: str | os.PathLike, what: str = "run directory"):
        self.dir = Path(directory)
        self.path = self.dir / LOCK_NAME
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> dict[str, Any] | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                text = os.read(fd, 1 << 16).decode()
            finally:
                os.close(fd)
            return dict(json.loads(text or "null") or {}) or None
        except (OSError, ValueError, TypeError):
            return None

    def locked_by_other(self) -> dict[str, Any] | None:
        """The holder when another process holds the lock now (a probe: takes nothing)."""
        if self.held or str(self.path.resolve()) in _HELD or not self.path.exists():
            return None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return self.holder() or {}
        finally:
            os.close(fd)      # closing drops a lock taken here
        return None

    def acquire(self, wait_s: float = 0.0, poll_s: float = 0.5) -> DirLock:
        if self.held:
            return self
        mine = _HELD.get(str(self.path.resolve()))
        if mine is not None and mine.held:        # this process holds it already (another DirLock object)
            return mine
        check_write_dir(self.dir, self.what)      # this user's, not writable by others (hpc_jabas/trust.py)
        try:
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT, f"{self.what} lock")    # never through a link
        except OSError as e:
            raise ConfigError(f"{self.what} {str(self.dir)!r} cannot be written: {e.strerror}") from None
        deadline = time.time() + max(0.0, wait_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() >= deadline:
                    os.close(fd)
                    raise ConfigError(f"{self.what} {str(self.dir)!r} is in use by {holder_text(self.holder())}; "
                                      "give this job its own directory, or wait for that one to end") from None
                time.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_me()).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        _HELD[str(self.path.resolve())] = self
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        _HELD.pop(str(self.path.resolve()), None)
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_on_rank0(directory: str | os.PathLike, rank: int, what: str = "run directory", wait_s: float = 0.0) -> None:
    """Collective: rank 0 takes (or already holds) the lock; refused, every rank raises rank 0's one line
    (marked ``quiet`` on the other ranks, which need not repeat it)."""
    from hpc_jabas.runtime.comm import seam as comm
    err = None
    if rank == 0:
        try:
            DirLock(directory, what).acquire(wait_s=wait_s)
        except ConfigError as e:
            err = str(e)
    err = comm.broadcast_object(err, name="hj.dirlock")
    if err:
        raise rank_error(ConfigError, err, rank)


def rank_error(cls: type[JabasError], msg: str, rank: int) -> JabasError:
    """``cls(msg)`` raised on every rank; marked ``quiet`` except on rank 0 (which says it; launch.main)."""
    return cls(msg, quiet=rank != 0)
