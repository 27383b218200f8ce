"""Every ``HPC_JABAS_*`` environment variable the package reads, in one place: one getter per variable.

Each getter takes an optional environment mapping (``os.environ`` when None), returns the variable's value
converted, or its default when it is unset or empty, and refuses anything else with one line::

    <NAME>=<the value> in the environment is invalid; it must be <what is valid>

(a :class:`~hpc_jabas.errors.ConfigError`: exit code 2 through ``hpc_jabas.runtime.comm.exits``). No module of the
package
but this one reads an ``HPC_JABAS_`` variable (tests/test_settings.py checks the source). A leaf: it imports
nothing of the package but ``hpc_jabas.errors``, so ``hpc_jabas.trust`` and ``core/`` may use it.

:data:`VARIABLES` lists them all with their defaults and what they do; :func:`check` reads every one (the
backends call it at start-up, so a bad value is said before the first collective, not in the middle of one).
``HPC_JABAS_CACHE`` and ``HPC_JABAS_VENV`` are read by scripts/setup.sh and the Makefile, not by Python.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hpc_jabas.errors import ConfigError

BACKEND = "HPC_JABAS_BACKEND"
TORCH_TIMEOUT_S = "HPC_JABAS_TORCH_TIMEOUT_S"
ERROR_GRACE_S = "HPC_JABAS_ERROR_GRACE_S"
HEARTBEAT_S = "HPC_JABAS_HEARTBEAT_S"
PROGRESS = "HPC_JABAS_PROGRESS"
DEBUG = "HPC_JABAS_DEBUG"
LOG = "HPC_JABAS_LOG"
TRUST_GROUP = "HPC_JABAS_TRUST_GROUP"
SHARED_TMP = "HPC_JABAS_SHARED_TMP"
CACHE = "HPC_JABAS_CACHE"
VENV = "HPC_JABAS_VENV"

#: the backend choices (core/config/defaults.py's BACKENDS; tests/test_settings.py keeps the two equal)
BACKENDS = ("horovod", "torch", "auto")
#: HPC_JABAS_LOG's levels (``quiet`` is ``warning``)
LOG_LEVELS = ("debug", "info", "warning", "quiet", "error")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Variable:
    """One variable: its name, its default (as text; "" for none) and what it does."""

    name: str
    default: str
    doc: str


VARIABLES = (
    Variable(BACKEND, "auto", "the communication backend when the job's config says auto: horovod | torch | auto"),
    Variable(TORCH_TIMEOUT_S, "300", "seconds a rank of the torch backend waits at the rendezvous and in a "
                                     "collective before it fails (a rank that died or hangs)"),
    Variable(HEARTBEAT_S, "20", "seconds without a rank's heartbeat before the others name it hung and stop "
                                "(a stopped process, a frozen node); 0: off (runtime/comm/heartbeat.py)"),
    Variable(ERROR_GRACE_S, "10", "seconds a rank other than 0 waits before saying an error rank 0 may say too"),
    Variable(PROGRESS, "auto", "the progress bar: 0 never, 1 always on a terminal (skips the mpirun check), auto"),
    Variable(DEBUG, "0", "1: the CLI shows an error's traceback after its line"),
    Variable(LOG, "info", "the log level when no --quiet/--verbose says: debug | info | warning | quiet | error"),
    Variable(TRUST_GROUP, "0", "1: group-writable files and directories are trusted (the job scripts of a job "
                               "with trust_group = true set it)"),
    Variable(SHARED_TMP, "", "colon-separated absolute paths under /tmp, /var/tmp or /dev/shm that this site "
                             "shares between nodes"),
    Variable(CACHE, "~/.cache/hpc-jabas", "where scripts/setup.sh builds the shared environment (shell only)"),
    Variable(VENV, ".venv", "the virtual environment scripts/setup.sh makes (shell only)"),
)


def _raw(name: str, env: Mapping[str, str] | None) -> str:
    return ((os.environ if env is None else env).get(name) or "").strip()


def _bad(name: str, value: str, rule: str) -> ConfigError:
    shown = value if len(value) <= 40 else value[:36] + "..."
    return ConfigError(f"{name}={shown!r} in the environment is invalid; it must be {rule}")


def _seconds(name: str, env: Mapping[str, str] | None, default: float, *, zero_ok: bool) -> float:
    text = _raw(name, env)
    if not text:
        return default
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise _bad(name, text, f"a finite number of seconds {'>= 0' if zero_ok else '> 0'}")
    return v


def _flag(name: str, env: Mapping[str, str] | None, *, auto: bool = False) -> bool | None:
    text = _raw(name, env).lower()
    if text in _TRUE:
        return True
    if text in _FALSE or (text == "" and not auto):
        return False
    if auto and text in ("", "auto"):
        return None
    raise _bad(name, text, "one of " + ", ".join(_TRUE + _FALSE + (("auto",) if auto else ())))


def _choice(name: str, env: Mapping[str, str] | None, choices: tuple[str, ...]) -> str | None:
    text = _raw(name, env).lower()
    if not text:
        return None
    if text not in choices:
        raise _bad(name, text, "one of " + ", ".join(choices))
    return text


# ---- the getters, one per variable ------------------------------------------------------------------------
def backend(env: Mapping[str, str] | None = None) -> str | None:
    """HPC_JABAS_BACKEND: horovod | torch | auto, None when unset (the job's config decides)."""
    return _choice(BACKEND, env, BACKENDS)


def torch_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """HPC_JABAS_TORCH_TIMEOUT_S: the torch backend's rendezvous and collective timeout, seconds > 0 (300)."""
    return _seconds(TORCH_TIMEOUT_S, env, 300.0, zero_ok=False)


def heartbeat_s(env: Mapping[str, str] | None = None) -> float:
    """HPC_JABAS_HEARTBEAT_S: seconds >= 0 without a rank's heartbeat before it is named hung (20; 0: off)."""
    return _seconds(HEARTBEAT_S, env, 20.0, zero_ok=True)


def error_grace_s(env: Mapping[str, str] | None = None) -> float:
    """HPC_JABAS_ERROR_GRACE_S: seconds >= 0 a rank other than 0 waits before saying an error (10)."""
    return _seconds(ERROR_GRACE_S, env, 10.0, zero_ok=True)


def progress(env: Mapping[str, str] | None = None) -> bool | None:
    """HPC_JABAS_PROGRESS: False (0, off...) never a bar, True (1, on...) a bar on any terminal, None (unset,
    auto): the bar's own rules (runtime/progress.py)."""
    return _flag(PROGRESS, env, auto=True)


def debug(env: Mapping[str, str] | None = None) -> bool:
    """HPC_JABAS_DEBUG: whether the CLI shows an error's traceback (off)."""
    return bool(_flag(DEBUG, env))


def log_level(env: Mapping[str, str] | None = None) -> str | None:
    """HPC_JABAS_LOG: debug | info | warning | quiet | error, None when unset (info)."""
    return _choice(LOG, env, LOG_LEVELS)


def trust_group(env: Mapping[str, str] | None = None) -> bool:
    """HPC_JABAS_TRUST_GROUP: whether group-writable files are trusted (off)."""
    return bool(_flag(TRUST_GROUP, env))


def shared_tmp(env: Mapping[str, str] | None = None) -> list[str]:
    """HPC_JABAS_SHARED_TMP: the absolute paths it lists (colon-separated; empty entries skipped)."""
    text = _raw(SHARED_TMP, env)
    parts = [p.strip() for p in text.split(":") if p.strip()]
    if any(not p.startswith("/") for p in parts):
        raise _bad(SHARED_TMP, text, "colon-separated absolute paths (e.g. /var/tmp:/scratch/tmp)")
    return parts


GETTERS: dict[str, Callable[[Mapping[str, str] | None], object]] = {
    BACKEND: backend, TORCH_TIMEOUT_S: torch_timeout_s, HEARTBEAT_S: heartbeat_s, ERROR_GRACE_S: error_grace_s,
    PROGRESS: progress, DEBUG: debug, LOG: log_level, TRUST_GROUP: trust_group, SHARED_TMP: shared_tmp,
}


def check(env: Mapping[str, str] | None = None) -> None:
    """Read every variable the package reads: the first bad one raises its one line."""
    for get in GETTERS.values():
        get(env)
