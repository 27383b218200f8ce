"""One line and exit code 2 for an hpc-jabas error, on every rank, with or without ``run_main``.

``install()`` (done by ``import hpc_jabas`` and again by the Trainer) puts a ``sys.excepthook`` in front of the
one in force: an uncaught :class:`~hpc_jabas.errors.JabasError` ends the process with exit code 2 after one
line on stderr; any other exception goes to the previous hook, untouched. ``run_main`` ends the same way.

Who says the line: an error every rank raised together is said by rank 0 only. The Trainer's collective checks
(the run directory, the checkpoint) raise on every rank, ``quiet`` on all but rank 0 (runtime/persist/dirlock.py
``rank_error``). An error that is not ``quiet`` on another rank (a configuration every rank checks alike, or
one that concerns that rank alone) waits ``HPC_JABAS_ERROR_GRACE_S`` seconds (10) first: when rank 0 failed as
well, the launcher (mpirun, horovodrun, srun --kill-on-bad-exit) ends this rank before it repeats rank 0's line;
when it did not, this rank's line comes, prefixed with its rank. From the hook the process ends with
``os._exit(2)``: no exit handler runs, so none can wait in a collective (MPI_Finalize, Horovod's shutdown) for
ranks that are gone. ``run_main`` does the same in a run of several ranks; in one process it raises
``SystemExit(2)`` instead (what it always did), which its caller may catch.
"""
from __future__ import annotations

import inspect
import io
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from hpc_jabas import settings
from hpc_jabas.errors import ConfigError, JabasError, error_line


def process_rank() -> int:
    """This process's rank: the one the logger was told (comm.init), else the launcher's, else 0."""
    from hpc_jabas.log import current_rank
    r = current_rank()
    if r:
        return r
    from hpc_jabas.runtime.comm import launchers  # not at import: ``import hpc_jabas`` stays light
    try:
        return launchers.detect().rank
    except JabasError:                  # not an integer: no rank to tell
        return 0


def _grace_s() -> float:
    """HPC_JABAS_ERROR_GRACE_S; a bad value (the backends refuse it at start-up) is not allowed to hide the
    error being said: the default then."""
    try:
        return settings.error_grace_s()
    except ConfigError:
        return 10.0


def say(e: JabasError) -> None:
    """The error's one line on stderr, by the rule of the module docstring (nothing for a ``quiet`` one)."""
    line = error_line(e)
    if line is None:
        return
    rank = process_rank()
    if rank != 0 and not getattr(e, "now", False):
        sys.stderr.flush()
        time.sleep(_grace_s())             # the launcher ends this rank when rank 0 failed too
        line = line.replace(": error: ", f": error: rank {rank}: ", 1)
    # one write of line and newline: print() writes them apart, and a launcher that forwards the ranks' stderr
    # (mpirun) may put its own lines between the two
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def record_for_torchrun(e: JabasError) -> None:
    """Under torchrun (``TORCHELASTIC_ERROR_FILE`` set): the error's line as this rank's error file, in the
    format of torch.distributed.elastic's ``record``, so that torchrun's failure report names it as the root
    cause instead of "To enable traceback see ..."."""
    from hpc_jabas.runtime.comm import launchers
    ln = launchers.detect()
    path = ln.error_file if isinstance(ln, launchers.Torchrun) else None
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump({"message": f"hpc-jabas: error: {e}", "timestamp": str(int(time.time()))}, f)
    except OSError:                 # the report falls back to torchrun's own words
        pass


def exit_on_error(e: JabasError) -> None:
    """Say ``e`` (once per job) and end this process with exit code 2, no exit handlers run."""
    if isinstance(sys.stderr, io.StringIO) and sys.__stderr__ is not None:
        # a hook in front of ours captures stderr to print it after ours returns (torch.distributed's, which
        # prefixes the rank): ours does not return, so the line goes to the real stderr
        sys.stderr = sys.__stderr__
    _heartbeat_done()
    record_for_torchrun(e)
    say(e)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(getattr(e, "exit_code", 2)))


def _heartbeat_done() -> None:
    """This rank ends on purpose: its watcher must not name it hung (runtime/comm/heartbeat.py, when it runs here)."""
    mod = sys.modules.get("hpc_jabas.runtime.comm.heartbeat")
    if mod is not None:
        try:
            mod.stop(done=True)
        except Exception:              # the store is gone: nobody watches
            pass


def _hook(tp: type[BaseException], value: BaseException, tb: Any) -> None:
    if not isinstance(value, JabasError) and not _interactive():
        lost = _peer_lost(value)
        if lost is not None:            # a rank is gone: one line naming it, not the collective's traceback
            exit_on_error(lost)
    if isinstance(value, JabasError) and not _interactive():
        exit_on_error(value)
    if isinstance(value, JabasError) and getattr(value, "quiet", False):
        return                                 # an interactive session: rank 0 said it
    _previous(tp, value, tb)


def _peer_lost(value: BaseException) -> JabasError | None:
    """The backend's line for a collective that failed because another rank is gone (the torch backend's, when it
    runs in this process: the seam is not imported for the question)."""
    mod = sys.modules.get("hpc_jabas.runtime.comm.seam")
    if mod is None:
        return None
    try:
        return mod.peer_lost(value)
    except Exception:                  # the question must not hide the original error
        return None


def _interactive() -> bool:
    """A Python prompt (python -i, the REPL): an error there ends the statement, not the session."""
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


_previous: Callable[..., Any] = sys.excepthook


def install() -> None:
    """Put the hook in front of ``sys.excepthook`` (once; a hook set later by the user stays in front)."""
    global _previous
    if sys.excepthook is not _hook:
        _previous = sys.excepthook
        sys.excepthook = _hook


def run_main(fn: Callable[..., Any], argv: list[str] | None = None) -> None:
    """Run ``fn(argv)`` (a CLI-style main) or ``fn()`` (a plain main that takes no argument): an hpc-jabas error
    becomes one line and exit code 2 (module docstring); otherwise the process exits with fn's return code."""
    try:
        takes_argv = _takes_argument(fn)
        rc = fn(argv) if takes_argv else fn()
    except JabasError as e:
        _heartbeat_done()
        record_for_torchrun(e)
        say(e)
        code = int(getattr(e, "exit_code", 2))
        if _several_ranks():
            # the other ranks end now too, and a launcher (srun --kill-on-bad-exit, mpirun) ends a rank still in
            # its exit handlers (a process group's shutdown) with SIGTERM: exit code 143, not 2. As from the hook:
            # no exit handler runs
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        sys.exit(code)          # one process: SystemExit, as before: a caller (a test...) may catch it
    sys.exit(rc or 0)


def _several_ranks() -> bool:
    """Whether a launcher started this process as one of several ranks."""
    from hpc_jabas.runtime.comm import launchers  # not at import: ``import hpc_jabas`` stays light
    try:
        return launchers.detect().world_size > 1
    except JabasError:
        return False


def _takes_argument(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
