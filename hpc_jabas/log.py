"""Logging for hpc-jabas: one logger tree under "hpc_jabas", one line per record, rank-tagged.

Every rank logs to stderr; by default only rank 0's INFO and below are shown and every rank's
WARNING and above (a rank-0 filter), so a 16-rank job does not print each line 16 times.
``--quiet`` shows warnings and errors only, ``--verbose`` shows DEBUG from every rank.
HPC_JABAS_LOG=debug|info|warning overrides the level from the environment (batch scripts).
"""
from __future__ import annotations

import logging
import os
import sys

from hpc_jabas import settings

ROOT = "hpc_jabas"
_state: dict = {"rank": 0, "configured": False, "console": None}


class LineHandler(logging.Handler):
    """Writes each record to (the current) ``sys.stderr`` as whole lines in ONE ``write(2)`` call, so the
    lines of several ranks sharing a pipe (mpirun, srun) never run into each other mid-line; the lines
    after the first of a multi-line record (a traceback) carry the same ``hpc-jabas[rank]`` prefix.
    While a progress bar is on screen, :func:`set_console_writer`'s writer prints the line instead."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            prefix = f"hpc-jabas[{getattr(record, 'rank', _state['rank'])}] "
            lines = text.splitlines() or [""]
            line = "\n".join([lines[0]] + [prefix + "  " + ln for ln in lines[1:]]) + "\n"
            console = _state["console"]
            if console is not None:
                console(line.rstrip("\n"))
                return
            write_line(line, sys.stderr)
        except Exception:
            self.handleError(record)


def write_line(line: str, stream=None) -> None:
    """``line`` (ending in a newline) to ``stream`` (default stderr) in one system call where it has a
    file descriptor (Python's own buffer is flushed first, so the order holds); else one ``write``."""
    stream = stream or sys.stderr
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        stream.write(line)
        stream.flush()
        return
    stream.flush()
    data = line.encode(getattr(stream, "encoding", None) or "utf-8", errors="replace")
    while data:
        data = data[os.write(fd, data):]


def set_console_writer(writer) -> None:
    """Route log lines through ``writer(line)`` (e.g. ``tqdm.write``, which keeps a bar intact); None: back
    to one write per line on stderr."""
    _state["console"] = writer


class RankFilter(logging.Filter):
    """Passes every record from rank 0, and only WARNING and above from the other ranks."""

    def __init__(self, all_ranks: bool = False) -> None:
        super().__init__()
        self.all_ranks = all_ranks

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = _state["rank"]
        return self.all_ranks or _state["rank"] == 0 or record.levelno >= logging.WARNING


def get_logger(name: str) -> logging.Logger:
    """The module's logger (``get_logger(__name__)``); configures the tree on first use."""
    if not _state["configured"]:
        configure()
    return logging.getLogger(name if name.startswith(ROOT) else f"{ROOT}.{name}")


def current_rank() -> int:
    """This process's rank as last set by :func:`set_rank` (0 before the communication backend starts)."""
    return int(_state["rank"])


def set_rank(rank: int) -> None:
    """Called once the communication backend (runtime/comm/seam.py) knows this process's rank."""
    _state["rank"] = int(rank)


def configure(level: str | int | None = None, all_ranks: bool | None = None) -> None:
    """(Re)configure: level 'debug' | 'info' | 'warning' (or a logging constant)."""
    if level is None:
        level = settings.log_level() or "info"
    if isinstance(level, str):
        level = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                 "quiet": logging.WARNING, "error": logging.ERROR}.get(level.lower(), logging.INFO)
    if all_ranks is None:
        all_ranks = level <= logging.DEBUG
    root = logging.getLogger(ROOT)
    for h in list(root.handlers):
        root.removeHandler(h)
    h = LineHandler()
    h.setFormatter(logging.Formatter("hpc-jabas[%(rank)s] %(levelname)s: %(message)s"))
    h.addFilter(RankFilter(all_ranks=all_ranks))
    root.addHandler(h)
    root.setLevel(level)
    root.propagate = False
    _state["configured"] = True


def add_verbosity_flags(parser) -> None:
    """--quiet / --verbose on a CLI parser; apply with ``configure_from_args``."""
    if {"-q", "--quiet", "-v", "--verbose"} & set(getattr(parser, "_option_string_actions", {})):
        return                                  # there already (hpc_jabas.add_arguments adds them)
    g = parser.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    g.add_argument("-v", "--verbose", action="store_true", help="debug output from every rank")


def configure_from_args(args) -> None:
    if getattr(args, "quiet", False):
        configure("warning")
    elif getattr(args, "verbose", False):
        configure("debug", all_ranks=True)
