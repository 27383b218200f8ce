"""Safe points (docs/invariants.md, invariant 9): a signal only sets a flag; the ranks agree at an iteration boundary.

Slurm asks a job to stop with a signal: ``USR1`` (``sbatch --signal=B:USR1@<lead>`` of hpc-jabas's job
scripts, forwarded to the ranks by the batch shell), ``USR2`` (submitit's ``--signal=USR2@<lead>``) or
``TERM`` (preemption, ``scancel``). :class:`StopSignals` installs one handler for the three that records
the first signal and returns: no collective, no file write, no logging inside a handler (Lightning's
checkpoint-in-the-handler hangs and corrupts checkpoints).

At agreement boundaries (iteration boundaries about ``safe_point_s`` apart, below) the ranks agree through ONE
allreduce of a small vector (the stop signals each rank saw, a programmatic stop request, whether rank 0's clock
says a periodic checkpoint is due, and whether a rank's loss of each iteration since the last one was not finite):
every rank gets the same answer, so all ranks checkpoint (and stop) at the same iteration, even when only one
rank got the signal.

That allreduce does not block the loop (:class:`SafePoints`, mode ``"overlap"``, the default): it is started
asynchronously at one agreement boundary and read at the next, so it travels while the iterations between
compute and reduce their gradients; the ranks act on it then, all at the same iteration. Agreement boundaries
come about every ``safe_point_s`` seconds (``[output] safe_point_s``, 0.5 s; 0: every boundary): rank 0 puts the
number of iterations that make that interval at its measured pace (1 to MAX_EVERY) in the vector, and every rank
takes the agreed number for the next interval, so the ranks' agreement boundaries stay the same. Each rank's
non-finite losses of the iterations between are kept, one flag per iteration, and sent with the next agreement.
A boundary that writes a checkpoint anyway (a stop agreed, a periodic checkpoint due, the epoch's end) agrees
blocking on the current flags instead, so that nothing is written from an iteration whose loss was not finite
and a stop that reaches such a boundary is not put off. A stop signal therefore stops the job at the next
boundary that checkpoints anyway, or at the second agreement boundary after it arrived (about 2 x safe_point_s
later, at least one iteration). Mode ``"blocking"`` is the earlier one (a blocking allreduce at every boundary,
a stop at the boundary right after the signal); ``"off"`` agrees nothing (no stop, no clock-driven checkpoint:
for measuring the cost only, ``bench/overhead.py``).

Numbers that make no sense stop the run: a non-finite loss (the host float the trainer reads once per
iteration anyway) rides in the same vector, so no extra host sync (the iterations between two agreements are each
flagged; the first non-finite one is named); every rank then raises
:class:`NonFiniteError` (one line, exit 2, never resubmitted) without checkpointing: the last
checkpoint on disk is the last finite one. An fp16 step that the loss scaler skipped is not an error
(the scaler backs off). A checkpoint is never written from non-finite weights either
(the Checkpointer, runtime/resume.py, checks the parameters before writing).
"""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from hpc_jabas.errors import JabasError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.slurm.env import SlurmEnv

if TYPE_CHECKING:
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.planning.plan import Plan
    from hpc_jabas.core.planning.sampler import HeterogeneousSampler
    from hpc_jabas.runtime.metrics import MetricsWriter

log = get_logger(__name__)

#: the signals that ask a job to stop at the next safe point, in the order of the agreement vector
STOP_SIGNALS: tuple[signal.Signals, ...] = SlurmEnv.STOP_SIGNALS      # USR1, USR2, TERM (slurm/env.py)


class NonFiniteError(JabasError, ArithmeticError):
    """The loss or the weights stopped being finite numbers: the run stops, the last finite checkpoint stays."""


class StopSignals:
    """One per process (:func:`stop_signals`): handlers that only record the first stop signal."""

    def __init__(self) -> None:
        self.signum: int = 0                  # the first stop signal received (0: none)
        self.received_at: float | None = None
        self.count = 0
        self.installed = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any = None) -> None:     # a flag, nothing else
        self.count += 1
        if not self.signum:
            self.signum = signum
            self.received_at = time.time()

    def install(self) -> bool:
        """Install the handlers (main thread only; idempotent). Keeps the handlers they replace
        (:meth:`previous`: submitit's USR2 handler requeues the job)."""
        if self.installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        for s in STOP_SIGNALS:
            self._previous[int(s)] = signal.getsignal(s)
            signal.signal(s, self._handle)
        self.installed = True
        return True

    def uninstall(self) -> None:
        if not self.installed:
            return
        for s in STOP_SIGNALS:
            prev = self._previous.get(int(s))
            signal.signal(s, prev if prev is not None else signal.SIG_DFL)
        self.installed = False

    def previous(self, signum: int) -> Any:
        """The handler that was installed for ``signum`` before ours (None when unknown)."""
        return self._previous.get(int(signum))

    def clear(self) -> None:
        self.signum, self.received_at, self.count = 0, None, 0

    def vector(self) -> list[float]:
        """One entry per stop signal: 1 for the one received, else 0."""
        return [1.0 if self.signum == int(s) else 0.0 for s in STOP_SIGNALS]


_STOP = StopSignals()


def stop_signals() -> StopSignals:
    """The process's stop-signal flag."""
    return _STOP


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name.removeprefix("SIG")
    except ValueError:
        return str(signum)


@dataclass(frozen=True)
class Agreement:
    """What every rank agreed at one safe point."""
    stop: bool                  # some rank got a stop signal (or asked to stop)
    signal: str | None          # which one ("USR1", "USR2", "TERM", "request"), the first in STOP_SIGNALS order
    checkpoint_due: bool        # rank 0's clock says a periodic checkpoint is due
    nonfinite: int = 0          # ranks whose loss of the first flagged iteration was not finite (0: none)
    nonfinite_offset: int = 0   # that iteration, counted from the first iteration the flags are about
    every: int = 1              # rank 0's proposal: iterations to the next agreement boundary


NOTHING = Agreement(stop=False, signal=None, checkpoint_due=False)
SAFEPOINT_NAME = "hj.safepoint"
MODES = ("overlap", "blocking", "off")
#: the most iterations between two agreement boundaries (bounds the flag vector and a stop's delay in iterations)
MAX_EVERY = 256
_HEAD = 7                       # [USR1, USR2, TERM, request, due, any non-finite, every], then one flag an iteration


def local_vector(local_signal: int, local_request: bool, due_on_rank0: bool, rank: int,
                 nonfinite: bool | Sequence[bool] = False, every: int = 1) -> torch.Tensor:
    """This rank's [USR1, USR2, TERM, request, due, any non-finite, every, non-finite of each iteration...] (``due``
    and ``every`` count only rank 0's). ``nonfinite``: one flag, or one per iteration since the last agreement."""
    flags = [bool(nonfinite)] if isinstance(nonfinite, bool) else [bool(x) for x in nonfinite]
    v = [1.0 if local_signal == int(s) else 0.0 for s in STOP_SIGNALS]
    v += [1.0 if local_request else 0.0, 1.0 if (due_on_rank0 and rank == 0) else 0.0, 1.0 if any(flags) else 0.0,
          float(every) if rank == 0 else 0.0]
    v += [1.0 if f else 0.0 for f in flags]
    return torch.tensor(v, dtype=torch.float64)


def decode(reduced: torch.Tensor) -> Agreement:
    """The Agreement of a summed flag vector (local_vector's layout)."""
    vals = reduced.tolist()
    got = [float(x) > 0 for x in vals]
    sig = next((signal_name(int(s)) for s, on in zip(STOP_SIGNALS, got[:3]) if on), None)
    if sig is None and got[3]:
        sig = "request"
    per_it = vals[_HEAD:]
    off = next((i for i, x in enumerate(per_it) if x > 0), None)
    nonfinite = int(round(per_it[off])) if off is not None else int(round(vals[5]))
    every = min(MAX_EVERY, max(1, int(round(vals[6]))))
    return Agreement(stop=sig is not None, signal=sig, checkpoint_due=got[4], nonfinite=nonfinite,
                     nonfinite_offset=off or 0, every=every)


def agree(local_signal: int, local_request: bool, due_on_rank0: bool, rank: int,
          allreduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
          nonfinite: bool = False) -> Agreement:
    """Collective (every rank, same iteration), blocking: one allreduce-sum of the flag vector."""
    v = local_vector(local_signal, local_request, due_on_rank0, rank, nonfinite)
    return decode((allreduce or comm.allreduce_sum)(v, SAFEPOINT_NAME))


def merge(earlier: Agreement, now: Agreement) -> Agreement:
    """An agreement read late (``earlier``) together with the one of this boundary: stop and due when either
    says so, the earlier stop's signal first; ``nonfinite`` and ``every`` are this boundary's (the earlier
    non-finite is acted on before a blocking agreement is made)."""
    return Agreement(stop=earlier.stop or now.stop, signal=earlier.signal or now.signal,
                     checkpoint_due=earlier.checkpoint_due or now.checkpoint_due, nonfinite=now.nonfinite,
                     nonfinite_offset=now.nonfinite_offset, every=now.every)


class SafePoints:
    """The trainer's agreement channel (one per Trainer): ``mode`` is one of :data:`MODES`. In ``"overlap"`` mode
    at most one allreduce is in flight (name ``hj.safepoint``): :meth:`launch` starts it, :meth:`collect` reads
    it at the next agreement boundary (every rank, in the same order: the ranks' agreement boundaries are the same,
    ``every`` iterations apart as the last agreement said)."""

    def __init__(self, mode: str = "overlap",
                 allreduce: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
                 allreduce_async: Callable[[torch.Tensor, str], Any] | None = None,
                 synchronize: Callable[[Any], torch.Tensor] | None = None,
                 interval_s: float = 0.0, clock: Callable[[], float] = time.perf_counter):
        if mode not in MODES:
            raise ValueError(f"safe point mode {mode!r}: use one of {', '.join(MODES)}")
        self.mode = mode
        self._allreduce = allreduce
        self._async = allreduce_async
        self._sync = synchronize
        self._handle: Any = None
        self._from: int | None = None        # the first iteration whose flags are in flight
        self.blocking_count = 0               # blocking agreements made (the overlap mode's checkpoint boundaries)
        self.interval_s = float(interval_s)   # about this many seconds between agreement boundaries (0: every one)
        self._clock = clock
        self.every = 1                        # agreed: iterations from one agreement boundary to the next
        self._due = 0                         # the iteration count of the next agreement boundary
        self._first: int | None = None        # the first iteration of the flags not sent yet
        self._flags: list[bool] = []          # this rank's non-finite loss of each of those iterations
        self._paced: tuple[float, int] | None = None     # rank 0: (clock, iteration count) at the last proposal
        self.agreements = 0                   # agreement boundaries so far (launched or blocking)
        self._noted = 0                       # the iteration count noted up to

    @property
    def in_flight(self) -> bool:
        return self._handle is not None

    def agrees_at(self, done: int) -> bool:
        """Whether the boundary after ``done`` iterations is an agreement boundary (every one but in the overlap
        mode's intervals; a boundary that checkpoints agrees anyway)."""
        return self.mode != "overlap" or done >= self._due

    def note(self, iteration: int, nonfinite: bool) -> None:
        """This rank's flag of the iteration just done (counted from 0), sent with the next agreement."""
        if self._first is None:
            self._first = iteration
        self._flags.append(bool(nonfinite))
        self._noted = iteration + 1

    def pending(self) -> bool:
        return bool(self._flags)

    def noted_upto(self) -> int:
        """The iteration count the flags noted so far reach (every noted iteration is one done)."""
        return self._noted

    def _proposal(self, done: int) -> int:
        """Rank 0: the iterations that make about ``interval_s`` at the pace since its last proposal."""
        if self.interval_s <= 0:
            return 1
        now = self._clock()
        last, self._paced = self._paced, (now, done)
        if last is None or done <= last[1] or now <= last[0]:
            return 1
        per = (now - last[0]) / (done - last[1])
        return min(MAX_EVERY, max(1, int(self.interval_s / per + 1e-9)))

    def vector(self, local_signal: int, local_request: bool, due_on_rank0: bool, rank: int,
               done: int) -> tuple[torch.Tensor, int]:
        """This rank's flag vector for the boundary after ``done`` iterations, and the first iteration its
        per-iteration flags are about; the flags are sent with it."""
        flags, first = self._flags or [False], self._first if self._first is not None else done - 1
        self._flags, self._first = [], None
        every = self._proposal(done) if rank == 0 else 0
        return local_vector(local_signal, local_request, due_on_rank0, rank, flags, every), first

    def _agreed(self, a: Agreement) -> Agreement:
        self.every = a.every
        return a

    def blocking(self, v: torch.Tensor) -> Agreement:
        self.blocking_count += 1
        return self._agreed(decode((self._allreduce or comm.allreduce_sum)(v, SAFEPOINT_NAME)))

    def launch(self, v: torch.Tensor, iteration: int) -> None:
        """Start the allreduce of ``v`` (the flags from ``iteration`` on); read by the next :meth:`collect`."""
        self.collect()                        # never two in flight under one name
        start = self._async or (lambda t, name: comm.allreduce_sum_async_(t, name=name))
        self._handle, self._from = start(v, SAFEPOINT_NAME), iteration

    def collect(self) -> tuple[Agreement | None, int | None]:
        """(the agreement in flight, the first iteration of its flags), or (None, None) when none is."""
        if self._handle is None:
            return None, None
        h, it = self._handle, self._from
        self._handle, self._from = None, None
        return self._agreed(decode((self._sync or comm.synchronize)(h))), it

    def schedule(self, done: int) -> None:
        """An agreement boundary was made after ``done`` iterations: the next one comes ``every`` later."""
        self.agreements += 1
        self._due = done + (self.every if self.mode == "overlap" else 1)


class PeriodicCheckpoint:
    """Every ``every`` iterations and/or every ``minutes`` of rank 0's wall clock since the last checkpoint."""

    def __init__(self, every: int | None, minutes: float | None, clock: Callable[[], float] = time.time):
        self.every, self.minutes, self.clock = every, minutes, clock
        self.last_iteration = 0
        self.last_time = clock()

    def mark(self, iteration: int) -> None:
        self.last_iteration, self.last_time = iteration, self.clock()

    def due_by_iterations(self, iteration: int) -> bool:
        return bool(self.every) and iteration - self.last_iteration >= int(self.every or 0)

    def due_by_clock(self) -> bool:
        return self.minutes is not None and self.clock() - self.last_time >= 60.0 * float(self.minutes)


class SafePointHost(Protocol):
    """What a safe point reads of the trainer (it writes nothing there: the stop comes back as a StopReason)."""

    iteration: int                      # iterations done
    plan: Plan
    stop_requested: bool                # a programmatic stop, agreed here
    nonfinite_loss: bool                # this rank's last loss was not finite
    safe_points: SafePoints
    metrics: MetricsWriter
    @property
    def cfg(self) -> JobConfig: ...            # the Trainer's resolved, frozen configuration
    ckpt_dir: Path

    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int:             # the rank count
        ...

    @property
    def sampler(self) -> HeterogeneousSampler: ...

    def save_checkpoint(self) -> str | None: ...

    def flush_metrics(self) -> None: ...


#: why and where a job stopped at a safe point: {"signal", "iteration", "epoch", "checkpoint", "time"}
StopReason = dict[str, Any]


def boundary(host: SafePointHost, periodic: PeriodicCheckpoint) -> StopReason | None:
    """Every rank of ``host``, at an iteration boundary: agree (``host.safe_points``, a SafePoints) on stop signals
    (USR1, USR2, TERM, ``host.stop_requested``), rank 0's periodic-checkpoint clock and non-finite losses. On a
    stop every rank checkpoints and the StopReason is returned (None: go on); a due periodic checkpoint is
    written (not at an epoch's last iteration: the epoch end checkpoints anyway)."""
    ch = host.safe_points
    if ch.mode == "off":
        return None
    done = host.iteration
    ch.note(done - 1, host.nonfinite_loss)
    checkpoints = periodic.due_by_iterations(done) or host.sampler.epoch_done(host.plan.B)
    if not checkpoints and not ch.agrees_at(done):
        return None                                        # between agreement boundaries: the flags are kept
    v, first = ch.vector(stop_signals().signum, host.stop_requested, periodic.due_by_clock(), host.rank, done)
    if ch.mode == "blocking":
        a = ch.blocking(v)
    else:
        late, late_first = ch.collect()                    # started at the previous agreement boundary
        if late is not None and late.nonfinite:
            stop_nonfinite(host, late.nonfinite, (late_first or 0) + late.nonfinite_offset)
        late = late or NOTHING
        if not (late.stop or late.checkpoint_due or checkpoints):
            ch.launch(v, first)                            # read at the next agreement boundary
            ch.schedule(done)
            return None
        a = merge(late, ch.blocking(v))                    # a checkpoint follows: agree on this iteration too
    ch.schedule(done)
    if a.nonfinite:
        stop_nonfinite(host, a.nonfinite, first + a.nonfinite_offset)
    if a.stop:
        path = host.save_checkpoint()
        reason = {"signal": a.signal, "iteration": host.iteration, "epoch": host.sampler.epoch,
                  "checkpoint": path, "time": time.time()}
        if host.rank == 0:
            log.info("stopping at the safe point after iteration %d (%s): checkpoint %s", host.iteration,
                     a.signal, path)
            host.metrics.write({"type": "safe_point_stop", "it": host.iteration, "signal": a.signal,
                                "checkpoint": path})
        return reason
    if (a.checkpoint_due or periodic.due_by_iterations(host.iteration)) \
            and not host.sampler.epoch_done(host.plan.B):
        host.save_checkpoint()
    return None


def finish(trainer: SafePointHost) -> None:
    """Every rank, when fit's loop ends: the agreement still in flight (overlap mode) is read, and the flags of the
    iterations since the last agreement are agreed blocking (a loop that ended between agreement boundaries, or
    before its last boundary); a non-finite loss either reports stops the run as at a safe point (a stop signal is
    not acted on: the job ends anyway)."""
    ch = trainer.safe_points
    late, late_first = ch.collect()
    if late is not None and late.nonfinite:
        stop_nonfinite(trainer, late.nonfinite, (late_first or 0) + late.nonfinite_offset)
    if ch.mode == "off":
        return
    if trainer.iteration > 0 and ch.noted_upto() < trainer.iteration:       # fit stopped before its boundary
        ch.note(trainer.iteration - 1, trainer.nonfinite_loss)
    if ch.pending():                       # the flags of the iterations since the last agreement: one more
        v, first = ch.vector(0, False, False, trainer.rank, trainer.iteration)
        a = ch.blocking(v)
        if a.nonfinite:
            stop_nonfinite(trainer, a.nonfinite, first + a.nonfinite_offset)


def last_checkpoint_name(ckpt_dir: Path, enabled: bool) -> str:
    """What a stop without checkpointing leaves on disk, for its message."""
    from hpc_jabas.runtime.persist import checkpoint as ckpt
    found = ckpt.latest_good(ckpt_dir) if enabled else None
    return f"the last checkpoint {str(found)!r} is kept" if found else "no checkpoint was written"


def stop_nonfinite(trainer: SafePointHost, ranks: int, iteration: int | None = None) -> None:
    """Every rank (agreed at a safe point): the loss of ``iteration`` (default: the last one) was not finite on
    ``ranks`` ranks. The metrics so far are written (the loss as null), nothing is checkpointed, NonFiniteError
    is raised."""
    it = trainer.iteration - 1 if iteration is None else iteration
    trainer.flush_metrics()
    kept = last_checkpoint_name(trainer.ckpt_dir, trainer.cfg.checkpoint)
    msg = (f"training diverged: the loss of iteration {it} is not a finite number on {ranks} of {trainer.world} "
           f"rank(s); stopped without checkpointing ({kept}); lower the learning rate, "
           "check the data, or use clip_grad_norm")
    if trainer.rank == 0:
        trainer.metrics.write({"type": "nonfinite_stop", "it": it, "ranks": ranks})
    from hpc_jabas.runtime.persist.dirlock import rank_error
    raise rank_error(NonFiniteError, msg, trainer.rank)
