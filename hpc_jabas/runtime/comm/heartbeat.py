"""A hung rank found in seconds: a heartbeat through a key-value store, watched by a daemon thread on every rank.

A stopped rank (SIGSTOP, a frozen node, a process the OS no longer schedules) is not a dead one: its TCP
connections stay open, and the others wait in their collective until its timeout (300 s on either backend;
Horovod's stall check only warns before that). Here every rank's daemon thread, every ``interval`` seconds:

1. sets its own key ``hb.<rank>`` to a counter (one store write);
2. reads the key of the rank it watches, the next one in a ring (``(rank + 1) % world``): each rank is watched
   by exactly one other, so the store sees O(world) requests per interval;
3. checks the key ``hung`` (another watcher named a rank: this one ends too, quietly).

A watched counter that has not moved for ``timeout_s`` (``HPC_JABAS_HEARTBEAT_S``, 20 s; 0: off) names that
rank: the watcher says one line (naming it, and what happens next: runtime/comm/launchers.py :func:`what_next`), sets
``hung`` for the others and ends its process (exit code 3: not a bad input, so a Slurm chain resubmits it). The
others end quietly a moment later. A store that does not answer within ``timeout_s`` when its host is one of the
ranks (rank 0 under mpirun and srun, and on Horovod) names that rank the same way; when the store is gone (its
host exited) the thread ends and the collective's own error says who is gone (the torch backend's ``peer_lost``).

The stopped rank never blames a live one: the thread notes when its own loop did not run for a long while (this
process was itself stopped: the monotonic clock runs on while a process is stopped), and then gives the rank it
watches a fresh ``timeout_s`` and, if it was named meanwhile, ends quietly. :func:`stalled` tells the
backend's peer-lost path the same, so a rank that wakes up to find the others gone does not name them.

A rank that ends normally sets its key to ``done`` (at :func:`stop`, also from the exit paths), and its watcher
stops watching it. Nothing here runs in the training loop: no host sync, no per-iteration work.
"""
from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from hpc_jabas.errors import JabasError
from hpc_jabas.log import get_logger

log = get_logger(__name__)

#: the exit code of a rank that stops because another is hung or gone (2 is kept for bad input: never resubmitted)
EXIT_CODE = 3
#: how long a rank that does not speak waits before it ends, so that the speaker's line comes first
QUIET_EXIT_DELAY_S = 2.0


class HungRankError(JabasError, RuntimeError):
    """Another rank stopped answering (stopped, frozen, hung): this rank stops too, in one line. ``now``: said
    at once by the rank that found it (the launcher may end this one any moment)."""

    now = True
    exit_code = EXIT_CODE


def interval_for(timeout_s: float) -> float:
    """Seconds between two beats: a tenth of the timeout, within [0.2, 2]."""
    return min(2.0, max(0.2, timeout_s / 10.0))


class Heartbeat:
    """One rank's beat and watch (module docstring). ``store``: a torch.distributed Store client of this thread's
    own (set/get/check; its timeout bounds every call); ``host_rank``: the rank whose process hosts the store
    (None: a process of its own, torchrun's agent); ``what_next``: the line's last words; ``on_hung``: what ends
    the process (hpc_jabas.runtime.comm.exits.exit_on_error in use)."""

    def __init__(self, store: Any, rank: int, size: int, timeout_s: float, host_rank: int | None,
                 what_next: Callable[[], str], on_hung: Callable[[JabasError], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.rank, self.size = store, int(rank), int(size)
        self.timeout_s, self.interval = float(timeout_s), interval_for(float(timeout_s))
        self.host_rank = host_rank
        self.what_next, self.on_hung, self.clock = what_next, on_hung, clock
        self.watch: int | None = (self.rank + 1) % self.size if self.size > 1 else None
        self._seen: bytes | None = None
        self._seen_t = clock()
        self._last_tick = clock()
        self.stalled_at: float | None = None       # when this process found it had not run for a while
        self.count = 0
        self._busy_since: float | None = None     # when the beat thread's store call now in progress began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the thread ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._beat()
        self._thread = threading.Thread(target=self._run, name="hpc-jabas-heartbeat", daemon=True)
        self._thread.start()
        threading.Thread(target=self._guard, name="hpc-jabas-heartbeat-guard", daemon=True).start()

    def stop(self, done: bool = True) -> None:
        """Stop beating; ``done``: say so in the store (the watcher stops watching this rank)."""
        self._stop.set()
        # a call in progress holds the client's lock (and a stopped store host keeps it): no second call then
        if done and self._busy_since is None:
            try:
                self.store.set(f"hb.{self.rank}", "done")
            except Exception:          # the store is gone (its host ended first): nobody watches any more
                pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.tick() is False:
                    return
            except Exception as e:     # never let the watchdog end the process by an error of its own
                log.debug("heartbeat: %s", e)
                return

    def _guard(self) -> None:
        """The store's calls have no timeout of their own against a host that is stopped (they wait for ever):
        this second thread names the store's host when a call of the beat thread is older than ``timeout_s``.
        Its own wait overslept (this process was stopped): one round skipped, the call gets to finish."""
        last = self.clock()
        while not self._stop.wait(self.interval):
            now = self.clock()
            if now - last > self.interval + self._stall_gap():
                self.stalled_at = now
            last = now
            since = self._busy_since
            if since is not None and now - since > self.timeout_s and self.stalled_s() > self.timeout_s:
                self._store_failed(TimeoutError(f"a store call timed out after {now - since:.0f} s"))
                return

    def stalled_s(self) -> float:
        """How long ago this process last found itself stopped (inf: never); a thread overdue right now (not
        inside a store call, where a frozen store host keeps it) counts as stopped now."""
        now = self.clock()
        if self._busy_since is None and now - self._last_tick > self.interval + self._stall_gap():
            return 0.0
        return now - self.stalled_at if self.stalled_at is not None else float("inf")

    def _stall_gap(self) -> float:
        return max(4 * self.interval, self.timeout_s / 2)

    def _beat(self) -> None:
        self.count += 1
        self.store.set(f"hb.{self.rank}", str(self.count))

    def tick(self) -> bool:
        """One round (module docstring); False: the thread ends (the store is gone, or this rank stops)."""
        now = self.clock()
        if now - self._last_tick > self.interval + self._stall_gap():   # the thread did not run: this process
            self.stalled_at = now                                       # was stopped itself
            self._seen_t = now                                          # the watched rank gets a fresh timeout
        self._busy_since = now
        try:
            self._beat()
            if self.store.check(["hung"]):
                self._end_quietly()
                return False
            if self.watch is None:
                return True
            key = f"hb.{self.watch}"
            v = self.store.get(key) if self.store.check([key]) else None
        except Exception as e:
            return self._store_failed(e)
        finally:
            self._busy_since = None
            self._last_tick = self.clock()
        if v == b"done":
            self.watch = None
            return True
        if v != self._seen:
            self._seen, self._seen_t = v, now
            return True
        if now - self._seen_t > self.timeout_s and self.stalled_s() > self.timeout_s:
            self._name(self.watch, f"no heartbeat for {now - self._seen_t:.0f} s")
            return False
        return True

    def _store_failed(self, e: Exception) -> bool:
        """A store call failed: a timeout while the host is a rank names that rank; else the store is gone."""
        text = str(e)
        timed_out = isinstance(e, TimeoutError) or "imeout" in text or "imed out" in text
        if (timed_out and self.host_rank is not None and self.host_rank != self.rank
                and self.stalled_s() > self.timeout_s):
            self._name(self.host_rank, f"the store it hosts did not answer for {self.timeout_s:.0f} s",
                       speaker=min(r for r in range(self.size) if r != self.host_rank), tell=False)
        log.debug("heartbeat: the store is gone (%s): the collective's error says who is gone", text)
        return False

    def _name(self, hung: int, why: str, speaker: int | None = None, tell: bool = True) -> None:
        """End this process naming rank ``hung``; ``tell``: set ``hung`` in the store for the others first (not
        when the store is what does not answer)."""
        me = self.rank
        quiet = speaker is not None and speaker != me
        if tell:
            try:
                self.store.set("hung", str(hung))
            except Exception:
                pass
        err = HungRankError(f"rank {hung} of {self.size} hung: {why} (stopped, stuck, or its node frozen; "
                            f"HPC_JABAS_HEARTBEAT_S={self.timeout_s:g}); rank {me} stops too: {self.what_next()}",
                            quiet=quiet)
        if quiet:
            time.sleep(QUIET_EXIT_DELAY_S)
        self.on_hung(err)

    def _end_quietly(self) -> None:
        time.sleep(QUIET_EXIT_DELAY_S)
        self.on_hung(HungRankError("another rank was named hung", quiet=True))


# ---- this process's heartbeat ---------------------------------------------------------------------------------
_current: Heartbeat | None = None
_at_exit_registered = False


def _set_registered() -> None:
    global _at_exit_registered
    _at_exit_registered = True


def start(store: Any, rank: int, size: int, timeout_s: float, host_rank: int | None) -> Heartbeat | None:
    """Start this process's heartbeat (once; None for a world of one or ``timeout_s`` 0)."""
    global _current
    if _current is not None or size < 2 or timeout_s <= 0:
        return _current
    from hpc_jabas.runtime.comm.exits import exit_on_error
    from hpc_jabas.runtime.comm.launchers import what_next
    hb = Heartbeat(store, rank, size, timeout_s, host_rank, what_next, exit_on_error)
    hb.start()
    _current = hb
    if not _at_exit_registered:         # a rank that ends first (normally) says "done": its watcher lets it go
        atexit.register(stop)
        _set_registered()
    log.debug("heartbeat: rank %d watches rank %s every %.1f s (timeout %g s, pid %d)", rank, hb.watch,
              hb.interval, timeout_s, os.getpid())
    return hb


def stop(done: bool = True) -> None:
    """Stop this process's heartbeat (at shutdown and on the exit paths); a later :func:`start` starts anew."""
    global _current
    if _current is not None:
        _current.stop(done)
        _current = None


def stalled() -> bool:
    """Whether this process was itself stopped recently (within the timeout), or has not run its watchdog for a
    long while right now: then it must not name another rank as gone."""
    hb = _current
    return hb is not None and hb.stalled_s() <= hb.timeout_s
