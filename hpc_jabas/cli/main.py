"""`hpc-jabas` command line. Bad usage: one line on stderr, exit code 2."""
from __future__ import annotations

import argparse
import importlib
import sys

from hpc_jabas.errors import JabasError, error_line
from hpc_jabas.log import add_verbosity_flags, configure_from_args


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, exit 2
        print(f"hpc-jabas: error: {message}", file=sys.stderr)
        sys.exit(2)


SUBCOMMANDS = ("plan", "report", "status", "profile", "submit", "export", "simulate")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="hpc-jabas", description="Adaptive heterogeneous-GPU training on Horovod and Slurm")
    sub = ap.add_subparsers(dest="cmd", parser_class=_Parser)
    sub.add_parser("doctor", help="check torch, Horovod, MPI, submitit, Slurm, Lmod")
    for name in SUBCOMMANDS:
        importlib.import_module(f"hpc_jabas.cli.{name}").add_parser(sub)
    for p in sub.choices.values():          # every command: -q/--quiet, -v/--verbose (the log level)
        if not any(o in p._option_string_actions for o in ("--quiet", "--verbose")):
            add_verbosity_flags(p)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not args.cmd:
        ap.print_help()
        return 2
    configure_from_args(args)
    try:
        if args.cmd == "doctor":
            from hpc_jabas.cli.doctor import check
            return check()
        func = getattr(args, "func", None)
        if func is None:
            func = importlib.import_module(f"hpc_jabas.cli.{args.cmd}").run
        return int(func(args) or 0)
    except JabasError as e:
        line = error_line(e)                    # None: said already (rank 0, or the other ranks of its error)
        if line:
            print(line, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
