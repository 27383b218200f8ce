"""Progress of a training run, on rank 0: a tqdm bar on a terminal, and ``progress.json`` for ``hpc-jabas status``.

* :class:`ProgressBar` (a :class:`~hpc_jabas.runtime.hooks.Callback`): one tqdm bar over the run's samples
  (epochs x dataset size), its postfix ``epoch k/E it=.. B=..``, tqdm's own samples/s and ETA. Shown only
  when :func:`bar_wanted`: stdout is a terminal (under mpirun: mpirun's own stdout, see
  :func:`launcher_stdout_is_tty`), not a Slurm batch job, logging not ``--quiet`` (the hpc_jabas logger
  at INFO) and ``HPC_JABAS_PROGRESS`` not ``0`` (``1`` skips the mpirun check).
* :class:`ProgressFile`: ``<run_dir>/progress.json`` (epoch, epochs, iteration, B, samples done, samples/s
  since this job's first iteration, ETA, job id), rewritten atomically at most every ``period_s`` and at
  every epoch end; always on (it is how ``hpc-jabas status`` shows a running chain's progress).
* :func:`iterate`: the same kind of bar over any list of steps (``hpc-jabas profile``'s sizes).
* :func:`finished_already`: a resumed run that already finished its epochs says so in one line and ends.

:func:`default_callbacks` is what the Trainer installs on rank 0.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from hpc_jabas import settings
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger, set_console_writer
from hpc_jabas.runtime.hooks import Callback, TrainerView
from hpc_jabas.runtime.record import StepRecord
from hpc_jabas.slurm.env import SlurmEnv
from hpc_jabas.trust import check_file, write_atomic_nofollow

PROGRESS_FILE = "progress.json"
T = TypeVar("T")
log = get_logger(__name__)


def bar_wanted(stream: IO[str] | None = None, env: dict[str, str] | None = None) -> bool:
    """A bar only for a person watching: ``stream`` (stdout) a TTY, not a Slurm batch job (an
    ``srun --pty`` step counts as a terminal), hpc-jabas logging at INFO or below, HPC_JABAS_PROGRESS != 0."""
    env = dict(os.environ if env is None else env)
    stream = stream or sys.stdout
    forced = settings.progress(env)
    if forced is False:
        return False
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError):
        return False
    if SlurmEnv(env).batch:
        return False
    if forced is None and launcher_stdout_is_tty(env) is False:
        return False
    return logging.getLogger("hpc_jabas").isEnabledFor(logging.INFO)


LAUNCHERS = ("mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "prte")


def launcher_stdout_is_tty(env: dict[str, str], pid: int | None = None, depth: int = 4) -> bool | None:
    """Under Open MPI a rank's stdout is a pseudo-terminal of the launcher even when ``mpirun``'s own
    stdout is a file or a pipe; the answer that counts is the launcher's: is ITS stdout a terminal?
    None when not under an MPI launcher or when /proc does not tell (not Linux, another user)."""
    if not any(k in env for k in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK")):
        return None
    pid = os.getppid() if pid is None else pid
    for _ in range(depth):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            if name in LAUNCHERS:
                out = os.path.realpath(f"/proc/{pid}/fd/1")
                return out.startswith(("/dev/pts/", "/dev/tty")) or out == "/dev/console"
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def _tqdm(file: IO[str], **kw: Any) -> Any:
    from tqdm import tqdm
    size = shutil.get_terminal_size((100, 24))      # a terminal that reports 0 x 0 would hide the bar
    return tqdm(file=file, ncols=size.columns, nrows=size.lines, leave=True, **kw)


def iterate(items: Sequence[T], desc: str, unit: str = "it", rank: int = 0,
            file: IO[str] | None = None) -> Iterator[T]:
    """``items`` one by one, with a tqdm bar on rank 0 when :func:`bar_wanted` (e.g. the micro-batch sizes
    ``hpc-jabas profile`` times); log lines print above the bar meanwhile. Without a bar: ``items`` as is."""
    f = file or sys.stdout
    if rank != 0 or not bar_wanted(f):
        yield from items
        return
    from tqdm import tqdm
    bar = _tqdm(f, total=len(items), desc=desc, unit=unit)
    set_console_writer(lambda line: tqdm.write(line, file=sys.stderr))
    try:
        for x in items:
            yield x
            bar.update(1)
    finally:
        set_console_writer(None)
        bar.close()


def _done(trainer: TrainerView) -> int:
    """Samples of the run done so far (whole epochs by the dataset size, plus the epoch's cursor)."""
    return int(trainer.sampler.epoch) * int(trainer.sampler.num_samples) + int(trainer.sampler.cursor)


class ProgressBar(Callback):
    """A tqdm bar on rank 0 over the run's samples: epoch, iteration, B, samples/s and ETA."""

    def __init__(self, epochs: int, file: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.epochs = int(epochs)
        self.file = file or sys.stdout
        self.enabled = bar_wanted(self.file) if enabled is None else bool(enabled)
        self.bar: Any = None

    def _open(self, trainer: TrainerView) -> None:
        from tqdm import tqdm
        total = self.epochs * int(trainer.sampler.num_samples)
        self.bar = _tqdm(self.file, total=total, initial=min(_done(trainer), total), unit="sample", unit_scale=True,
                         desc="train", smoothing=0.1)
        set_console_writer(lambda line: tqdm.write(line, file=sys.stderr))   # log lines above the bar

    def on_step_end(self, trainer: TrainerView, rec: StepRecord) -> None:
        if not self.enabled or trainer.rank != 0:
            return
        first = self.bar is None
        if first:
            self._open(trainer)
        bar = self.bar
        bar.set_postfix_str(f"epoch {min(trainer.sampler.epoch + 1, self.epochs)}/{self.epochs} "
                            f"it={trainer.iteration} B={trainer.B}", refresh=False)
        bar.update(0 if first else int(rec.samples))

    def on_epoch_end(self, trainer: TrainerView, epoch: int) -> None:
        if self.bar is not None and epoch + 1 >= self.epochs:
            self.bar.n = self.bar.total      # a dropped tail leaves a few samples unused
            self.bar.close()
            self.bar = None
            set_console_writer(None)


class ProgressFile(Callback):
    """``<run_dir>/progress.json`` on rank 0, at most every ``period_s`` and at every epoch end."""

    def __init__(self, run_dir: str | Path, epochs: int, period_s: float = 2.0, job_id: str | None = None) -> None:
        self.path = Path(run_dir) / PROGRESS_FILE
        self.epochs = int(epochs)
        self.period_s = float(period_s)
        self.job_id = job_id if job_id is not None else SlurmEnv().local_job_id()
        self._t0: float | None = None
        self._n0 = 0
        self._last = 0.0
        self._refused = False

    def on_first_step(self, trainer: TrainerView) -> None:
        if trainer.rank == 0:
            self._t0, self._n0 = time.time(), _done(trainer)

    def on_step_end(self, trainer: TrainerView, rec: StepRecord) -> None:
        if trainer.rank == 0 and time.time() - self._last >= self.period_s:
            self.write(trainer)

    def on_epoch_end(self, trainer: TrainerView, epoch: int) -> None:
        if trainer.rank == 0:
            self.write(trainer)

    def snapshot(self, trainer: TrainerView) -> dict[str, Any]:
        now = time.time()
        done, total = _done(trainer), self.epochs * int(trainer.sampler.num_samples)
        rate = None
        if self._t0 is not None and now > self._t0 and done > self._n0:
            rate = (done - self._n0) / (now - self._t0)
        eta = max(total - done, 0) / rate if rate else None
        return {"time": now, "job_id": self.job_id, "epoch": int(trainer.sampler.epoch), "epochs": self.epochs,
                "iteration": int(trainer.iteration), "B": int(trainer.B), "samples_done": done,
                "samples_total": total, "samples_per_s": rate, "eta_s": eta}

    def write(self, trainer: TrainerView) -> None:
        self._last = time.time()
        if self._refused:
            return
        try:       # written beside and renamed into place, never through a link (hpc_jabas/trust.py)
            write_atomic_nofollow(self.path, json.dumps(self.snapshot(trainer)).encode(), "progress record")
        except OSError:
            pass        # progress is informative only; a full disk shows up in the checkpoint instead
        except ConfigError as e:     # a link or another user's file planted after the run directory's check
            self._refused = True
            log.warning("progress not written: %s", e)


def read(run_dir: str | Path) -> dict[str, Any] | None:
    """The last ``progress.json`` of a run directory (None when there is none or it is unreadable; UntrustedFileError
    when others can write it, hpc_jabas/trust.py)."""
    p = Path(run_dir) / PROGRESS_FILE
    check_file(p, "progress record")
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def finished_already(trainer: TrainerView, epochs: int) -> bool:
    """After a resume: True when the checkpoint already finished ``epochs`` (nothing to train). Rank 0 says so
    in one line on stdout, naming how this script's command line asks for more epochs; the run then ends as a
    finished one does (exit code 0). ``resume_finished`` makes it a log line instead."""
    done = trainer.sampler.epoch
    if done < epochs:
        return False
    msg = (f"run_dir {str(trainer.run_dir)!r} already finished at epoch {done} of {epochs}; "
           f"{trainer.cfg.give('epochs', done + 1)} (or more) to go on")
    if trainer.cfg.resume_finished:
        log.info("%s (resume_finished is set)", msg)
    elif trainer.rank == 0:
        print(f"hpc-jabas: {msg}", flush=True)
    return True


def default_callbacks(trainer: TrainerView) -> list[Callback]:
    """What the Trainer adds on rank 0: the bar (shown only when :func:`bar_wanted`) and the progress file."""
    if trainer.rank != 0:
        return []
    epochs = int(trainer.cfg.epochs)
    return [ProgressBar(epochs), ProgressFile(trainer.run_dir, epochs)]


def announce_start(trainer: Any) -> None:
    """Rank 0, when fit() trains: where every rank runs (the job's log) and metrics.jsonl's start record."""
    log = get_logger("hpc_jabas.runtime.trainer")          # the trainer's lines, as before
    wi = trainer.world_info
    for r in range(trainer.world):
        log.info("%s", wi.describe(r))
    trainer.metrics.write({"type": "start", "world": trainer.world, "gpu_types": trainer.gpu_types, "B": trainer.B,
                           "plan": str(trainer.plan), "config": trainer.cfg.to_dict(), "it": trainer.iteration,
                           "gpu_source": wi.source, "ranks": wi.ranks(), "batch_range": trainer.batch_range})
