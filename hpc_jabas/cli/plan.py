"""`hpc-jabas plan`: print the best plan for a global batch (or a range of them) on a GPU mix.

    hpc-jabas plan --batch 2048 --gpus v100:4,p100:4,rtx2060:8 [--profile DIR | --emulated]
    hpc-jabas plan --batch-range 256:32768 --gpus v100:4,p100:4

Without --profile the model is ``PerfModel.emulated`` with its defaults (perfmodel.py, the
emulator's too): t(b) = (EMU_BASE_S + EMU_PER_SAMPLE_S * b) / speed, speed = FP32 TFLOPS relative
to a V100, micro-batch sizes 1, 2, 4, ..., 512 up to the memory cap int(memory_gb * 16), gradients
of 100 MB (--grad-mb), an allreduce of 2 (N-1)/N * bytes / 10 GB/s, no overlap. Bad input raises ConfigError; the
``hpc-jabas`` entry point (or :func:`main` here) prints it as one line and exits 2.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hpc_jabas.core.config import gpus as _gpus
from hpc_jabas.core.config.validate import parse_int
from hpc_jabas.core.perf.perfmodel import EMU_GRAD_BYTES, PerfModel
from hpc_jabas.core.planning import Plan, plan_batch, plan_range
from hpc_jabas.errors import ConfigError, InfeasibleError, JabasError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan", help="best micro-batch plan for a global batch on a GPU mix",
        description="Print the plan (micro-batch b, micro-batches per rank) that minimises the predicted "
                    "iteration time, per GPU type, and the predicted throughput.")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--batch", type=str, metavar="B", help="global batch size")
    what.add_argument("--batch-range", type=str, metavar="LO:HI",
                      help="print the best plan for every feasible B in LO..HI, one line each")
    p.add_argument("--gpus", required=True, metavar="SPEC",
                   help="GPU mix, TYPE:COUNT comma-separated in rank order, e.g. v100:4,p100:4,rtx2060:8")
    p.add_argument("--profile", metavar="DIR", help="perf-model directory (<gpu>.json + allreduce.json)")
    p.add_argument("--calibration", metavar="FILE",
                   help="a run's calibration.json: plan with the profile corrected by the run's measured times")
    p.add_argument("--emulated", action="store_true",
                   help="use the emulated model (the default when --profile is not given)")
    p.add_argument("--b-candidates", metavar="LIST", help="micro-batch sizes to try, e.g. 8,16,32")
    p.add_argument("--allow-drop", action="store_true", help="ranks may get no micro-batch at all")
    p.add_argument("--per-rank", action="store_true",
                   help="each rank its own micro-batch size (the last micro-batch may be partial); the default "
                        "is one size b on every rank (IIDP), what models with BatchNorm need")
    p.add_argument("--grad-mb", type=str, metavar="MB",
                   help=f"gradient size in MB for the emulated model (default {EMU_GRAD_BYTES / 1e6:g})")
    p.set_defaults(func=run)
    return p


# -- parsing ------------------------------------------------------------------------------------

def parse_gpus(spec: str) -> list[str]:
    """'v100:4,p100:2' -> ['v100'] * 4 + ['p100'] * 2 (catalog keys, rank order)."""
    out: list[str] = []
    for part in (spec or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, count = part.partition(":")
        key = _gpus.normalize(name)
        k = 1 if count.strip() == "" else parse_int(count, f"GPU count in {part!r}", lo=1,
                                                     hint="write TYPE:COUNT, e.g. v100:4")
        out += [key] * k
    if not out:
        raise ConfigError(f"--gpus {spec!r} names no GPU; write TYPE:COUNT,..., e.g. v100:4,p100:4")
    return out


MAX_BATCH = 10_000_000     # a global batch above this is a typo (the largest published ones are ~10^6 samples)


def _int(text: str, what: str) -> int:
    return parse_int(text, what, lo=1, hi=MAX_BATCH, hint=f"a batch of at most {MAX_BATCH} (a larger one is a typo)")


def _range(text: str) -> tuple[int, int]:
    lo, sep, hi = str(text).partition(":")
    if not sep:
        raise ConfigError(f"--batch-range {text!r} must be LO:HI, e.g. 256:32768")
    a, b = _int(lo, "--batch-range lower bound"), _int(hi, "--batch-range upper bound")
    if a > b:
        raise ConfigError(f"--batch-range {text!r} is empty; LO must be <= HI")
    return a, b


def _model(args, gpu_list: list[str]) -> tuple[PerfModel, str]:
    model, what = _base_model(args, gpu_list)
    if getattr(args, "calibration", None):          # a run's calibration.json (core/perf/calibration.py)
        from hpc_jabas.core.perf.calibration import Calibration
        from hpc_jabas.core.perf.perfmodel import calibrate_model
        from hpc_jabas.trust import check_file
        check_file(args.calibration, "calibration")
        calibrate_model(model, Calibration.load(args.calibration))
        what += f", calibrated by {args.calibration}"
    return model, what


def _base_model(args, gpu_list: list[str]) -> tuple[PerfModel, str]:
    if args.profile and args.emulated:
        raise ConfigError("--profile and --emulated exclude each other; give one")
    if args.profile:
        if args.grad_mb is not None:
            raise ConfigError("--grad-mb applies to the emulated model only; the profile has its own")
        if Path(args.profile).exists() and not Path(args.profile).is_dir():
            raise ConfigError(f"--profile {args.profile!r} is not a directory; give the directory that "
                              "hpc-jabas profile --out wrote (<gpu>.json + allreduce.json)")
        from hpc_jabas.trust import check_profile_dir
        check_profile_dir(args.profile)             # its files steer the plans: refused when others can write them
        return PerfModel.load(args.profile), f"profile {args.profile}"
    grad = EMU_GRAD_BYTES
    if args.grad_mb is not None:
        try:
            grad = float(args.grad_mb) * 1e6
        except ValueError:
            raise ConfigError(f"--grad-mb {args.grad_mb!r} is not a number") from None
        if not grad >= 0:
            raise ConfigError(f"--grad-mb {args.grad_mb!r} must be >= 0")
    return PerfModel.emulated(sorted(set(gpu_list)), grad_bytes=grad), "emulated (PerfModel.emulated defaults)"


# -- output -------------------------------------------------------------------------------------

def _span(vals: Sequence[int]) -> str:
    lo, hi = min(vals), max(vals)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _types(gpu_list: list[str]) -> list[str]:
    seen: list[str] = []
    for g in gpu_list:
        if g not in seen:
            seen.append(g)
    return seen


def _mix(gpu_list: list[str]) -> str:
    return ", ".join(f"{g} x{gpu_list.count(g)}" for g in _types(gpu_list))


def _print_plan(B: int, plan, gpu_list: list[str], model: PerfModel, out) -> None:
    fin = model.rank_finish(plan, gpu_list)
    comp = max(fin)
    n_part = sum(1 for n in plan.n if n > 0)
    tail = model.allreduce_tail(n_part)
    it = comp + tail
    kind = f"micro-batch b={plan.b}" if plan.identical_b else f"per-rank micro-batches b={_span(plan.bs)}"
    print(f"B={B}: {kind}, M={plan.M} micro-batches on {n_part} of {len(gpu_list)} GPUs", file=out)
    print(f"{'type':<12}{'ranks':>6}{'b':>6}{'n/rank':>9}{'samples':>9}{'compute ms':>12}{'idle':>8}", file=out)
    for g in _types(gpu_list):
        idx = [i for i, x in enumerate(gpu_list) if x == g]
        ns = [plan.n[i] for i in idx]
        f = [fin[i] for i in idx]
        idle = sum((comp - x) / comp for x in f) / len(f) if comp > 0 else 0.0
        bs = _span([plan.bs[i] for i in idx])
        print(f"{g:<12}{len(idx):>6}{bs:>6}{_span(ns):>9}{sum(plan.xs[i] for i in idx):>9}"
              f"{max(f) * 1e3:>12.2f}{idle * 100:>7.1f}%", file=out)
    print(f"iteration: compute {comp * 1e3:.2f} ms + allreduce tail {tail * 1e3:.2f} ms = {it * 1e3:.2f} ms "
          "(idle: share of the compute phase a rank waits for the slowest)", file=out)
    print(f"predicted throughput: {B / it:.1f} samples/s", file=out)


def _summary(plan, gpu_list: list[str]) -> str:
    return " ".join(f"{g}:{_span([plan.n[i] for i, x in enumerate(gpu_list) if x == g])}"
                    for g in _types(gpu_list))


def _note_extrapolation(model: PerfModel, used: dict[str, set[int]], out) -> None:
    notes = [f"{g} b={','.join(map(str, sorted(bs)))}" for g, bs in sorted(used.items())
             if any(model.profile(g).extrapolated(b) for b in bs)]
    if notes:
        print(f"note: times extrapolated beyond the measured range for {'; '.join(notes)}", file=out)


def run(args, out=None) -> int:
    out = out or sys.stdout
    gpu_list = parse_gpus(args.gpus)
    model, desc = _model(args, gpu_list)
    cands = None
    if args.b_candidates:
        cands = [_int(x, "--b-candidates value") for x in args.b_candidates.split(",") if x.strip()]
        if not cands:
            raise ConfigError(f"--b-candidates {args.b_candidates!r} lists no size; e.g. 8,16,32")
    header = f"GPUs: {_mix(gpu_list)} ({len(gpu_list)} ranks); model: {desc}"
    used: dict[str, set[int]] = {}
    if args.batch is not None:
        B = _int(args.batch, "--batch")
        try:
            plan = plan_batch(B, gpu_list, model, b_candidates=cands, allow_drop=args.allow_drop,
                              per_rank=args.per_rank)
        except InfeasibleError as e:       # the planner's hint names what any caller has; this command has more
            if args.allow_drop:
                raise
            raise InfeasibleError(f"{e}; or --allow-drop (a rank may get no micro-batch)") from None
        print(header, file=out)
        _print_plan(B, plan, gpu_list, model, out)
        rows: list[tuple[int, Plan, float | None]] = [(B, plan, None)]
    else:
        lo, hi = _range(args.batch_range)
        if args.per_rank:
            raise ConfigError("--per-rank plans one --batch at a time; give --batch B")
        table = plan_range(lo, hi, gpu_list, model, b_candidates=cands, allow_drop=args.allow_drop)
        if not table:
            raise ConfigError(f"no feasible global batch in {lo}:{hi} for {len(gpu_list)} GPUs; "
                              "widen the range" + ("" if args.allow_drop else " or pass --allow-drop (a rank may get "
                                                   "no micro-batch)"))
        print(header, file=out)
        print(f"{'B':>7} {'b':>5} {'M':>6} {'iter ms':>9} {'samples/s':>11}  n per rank by type", file=out)
        for B, plan, sec in table:
            print(f"{B:>7} {plan.b:>5} {plan.M:>6} {sec * 1e3:>9.2f} {B / sec:>11.1f}  {_summary(plan, gpu_list)}",
                  file=out)
        print(f"{len(table)} feasible global batch sizes in {lo}:{hi}", file=out)
        rows = [(B, plan, sec) for B, plan, sec in table]
    for _, plan, _ in rows:
        for i, (g, n) in enumerate(zip(gpu_list, plan.n)):
            if n:
                used.setdefault(g, set()).update(plan.micro_sizes(i))
    _note_extrapolation(model, used, out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (python -m hpc_jabas.cli.plan ...): errors become one line, exit 2."""
    parser = argparse.ArgumentParser(prog="hpc-jabas")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except JabasError as e:
        print(f"hpc-jabas: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
