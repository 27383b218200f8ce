"""`hpc-jabas` command line. Bad usage: one line on stderr, exit code 2.

An input that cannot be read (missing, a directory, no permission, not UTF-8, not valid TOML or JSON) is one
line naming the file and what was expected, exit code 2: the readers say it (core/config/textfile.py), and what
escapes them (OSError, UnicodeDecodeError, TOML and JSON errors) is turned into such a line here.
``--debug`` (before or after the subcommand) or ``HPC_JABAS_DEBUG=1`` shows the traceback as well.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tomllib
import traceback

from hpc_jabas import settings
from hpc_jabas.errors import JabasError, error_line
from hpc_jabas.log import add_verbosity_flags, configure_from_args


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, exit 2
        print(f"hpc-jabas: error: {message}", file=sys.stderr)
        sys.exit(2)


SUBCOMMANDS = ("plan", "report", "status", "profile", "submit", "cancel", "export", "simulate")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="hpc-jabas",
                 description="Adaptive heterogeneous-GPU training on torch.distributed or Horovod, and Slurm")
    ap.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = ap.add_subparsers(dest="cmd", parser_class=_Parser)
    sub.add_parser("doctor", help="check torch, Horovod, MPI, submitit, Slurm, Lmod")
    for name in SUBCOMMANDS:
        importlib.import_module(f"hpc_jabas.cli.{name}").add_parser(sub)
    for p in sub.choices.values():          # every command: -q/--quiet, -v/--verbose (the log level)
        if not any(o in p._option_string_actions for o in ("--quiet", "--verbose")):
            add_verbosity_flags(p)
        if "--debug" not in p._option_string_actions:
            p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return ap


DEBUG_HELP = "on an error, show its traceback too (also: HPC_JABAS_DEBUG=1)"
#: what a file that cannot be read or parsed raises when no reader turned it into a ConfigError line
INPUT_ERRORS = (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, json.JSONDecodeError)
_LIBRARY_FRAMES = ("/codecs.py", "/pathlib.py", "/json/", "/tomllib/", "<frozen codecs>")


def debug_on(args: argparse.Namespace | None = None) -> bool:
    return bool(getattr(args, "debug", False)) or settings.debug()


def _file_of(e: BaseException) -> str | None:
    """The file an error was met reading: OSError's filename, else the innermost path-like local of a frame of
    ours that names an existing file (a decode error does not carry its file's name)."""
    name = getattr(e, "filename", None)
    if name:
        return os.fspath(name)
    tb = e.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for fr in reversed(frames):
        if any(m in fr.f_code.co_filename for m in _LIBRARY_FRAMES):
            continue
        for v in fr.f_locals.values():
            if isinstance(v, (str, os.PathLike)) and not isinstance(v, bytes):
                s = os.fspath(v)
                if 0 < len(s) < 4096 and "\n" not in s and os.path.isfile(s):
                    return s
    return None


def input_error_line(e: BaseException) -> str:
    """One line for an input error that escaped its reader, naming the file when it can be found."""
    from hpc_jabas.core.config.textfile import unreadable
    f = _file_of(e)
    where = f"{f!r}" if f else "an input file"
    if isinstance(e, (OSError, UnicodeDecodeError)):
        if f:
            return str(unreadable(f, "file", "a readable UTF-8 input file of this command", e))
        return f"{where} cannot be read ({getattr(e, 'strerror', None) or e}); expected a readable UTF-8 input file"
    kind = "TOML" if isinstance(e, tomllib.TOMLDecodeError) else "JSON"
    return f"{where} is not valid {kind} ({' '.join(str(e).split())}); expected a {kind} file"


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not args.cmd:
        ap.print_help()
        return 2
    configure_from_args(args)
    debug = debug_on(args)
    try:
        if args.cmd == "doctor":
            from hpc_jabas.cli.doctor import check
            return check()
        func = getattr(args, "func", None)
        if func is None:
            func = importlib.import_module(f"hpc_jabas.cli.{args.cmd}").run
        return int(func(args) or 0)
    except JabasError as e:
        if debug:
            traceback.print_exc()
        line = error_line(e)                    # None: said already (rank 0, or the other ranks of its error)
        if line:
            print(line, file=sys.stderr)
        return 2
    except INPUT_ERRORS as e:                   # a reader that did not say it: still one line, exit 2
        if debug:
            traceback.print_exc()
        print(f"hpc-jabas: error: {input_error_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
