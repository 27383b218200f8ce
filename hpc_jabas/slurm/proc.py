"""The one way hpc-jabas runs a Slurm client command (sbatch, sacct, scontrol, sinfo).

``run(args)`` returns the command's stdout, or raises :class:`SlurmError` with one line that names
the command and the first line of its stderr: missing command, no answer within the timeout,
controller unreachable, or refused. ``require(commands)`` fails fast, before any call, when a
command is not on PATH or SLURM_CONF points nowhere (Slurm itself would retry for a minute).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence

from hpc_jabas.errors import SlurmError
from hpc_jabas.slurm.env import SlurmEnv

TIMEOUT_S = 20.0
LOCAL_HINT = "slurm/local/up.sh && source slurm/local/env.sh"
_UNREACHABLE = re.compile(r"contact slurm controller|connect failure|Connection refused|timed out|"
                          r"Could not establish a configuration source|Unable to establish", re.I)


def first_line(text: str | None) -> str:
    """The first non-blank line, stripped ('' when none)."""
    return next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")


def _no_slurm(cmd: str) -> SlurmError:
    return SlurmError(f"no Slurm here: {cmd} not found on PATH; install the Slurm client commands "
                      "(apt-get install slurm-client, or `module load slurm`), or start the local cluster: "
                      + LOCAL_HINT)


def require(commands: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    """SlurmError unless every command is on env's PATH and env's SLURM_CONF (if set) exists."""
    env = os.environ if env is None else env
    for cmd in commands:
        if shutil.which(cmd, path=env.get("PATH")) is None:
            raise _no_slurm(cmd)
    conf = SlurmEnv(env).conf
    if conf and not os.path.exists(conf):
        raise SlurmError(f"Slurm controller unreachable: SLURM_CONF={conf} does not exist "
                         f"(local cluster: {LOCAL_HINT})")


def run(args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = TIMEOUT_S,
        refused: str | None = None) -> str:
    """Run a Slurm command; its stdout. ``env``: its environment (default os.environ); ``refused``:
    the message head when it exits non-zero (default "`<command>` failed")."""
    args = [str(a) for a in args]
    cmd = shlex.join(args)
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                           env=dict(env) if env is not None else None)
    except FileNotFoundError:
        raise _no_slurm(args[0]) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"Slurm controller unreachable: `{cmd}` gave no answer in {timeout:g} s") from None
    if r.returncode != 0:
        msg = first_line(r.stderr) or first_line(r.stdout) or f"exit {r.returncode}"
        if _UNREACHABLE.search(msg):
            conf = SlurmEnv(env).conf or "/etc/slurm/slurm.conf"
            raise SlurmError(f"Slurm controller unreachable: `{cmd}` said: {msg} "
                             f"(SLURM_CONF={conf}; local cluster: slurm/local/up.sh)")
        raise SlurmError(f"{refused or f'`{cmd}` failed'}: {msg}")
    return r.stdout


def run_status(args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = TIMEOUT_S,
               stdin: str | None = None) -> tuple[int, str, str]:
    """Run a Slurm command that reports on stderr (``sbatch --test-only``): (exit status, stdout, stderr).
    A missing command, no answer in time or an unreachable controller: SlurmError, as :func:`run`."""
    args = [str(a) for a in args]
    cmd = shlex.join(args)
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=stdin,
                           env=dict(env) if env is not None else None)
    except FileNotFoundError:
        raise _no_slurm(args[0]) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"Slurm controller unreachable: `{cmd}` gave no answer in {timeout:g} s") from None
    msg = first_line(r.stderr)
    if r.returncode != 0 and _UNREACHABLE.search(msg):
        raise SlurmError(f"Slurm controller unreachable: `{cmd}` said: {msg} (local cluster: slurm/local/up.sh)")
    return r.returncode, r.stdout, r.stderr
