"""`hpc-jabas profile`: measure a model on this device and write a perf-model directory.

    hpc-jabas profile --model examples.models:digits_mlp --out profiles/            # on a GPU
    hpc-jabas profile --model examples.models:digits_mlp --gpu-type v100 --memory-gb 8 --out p/  # CPU
    hpc-jabas profile --model examples.models:digits_mlp --emulate --gpu-type rtx2060 --out p/
    mpirun -np 2 hpc-jabas profile --model ... --out p/      # + the allreduce fit over 2 ranks

Writes ``<gpu>.json`` (one per GPU type) and ``allreduce.json`` via ``PerfModel.save``; the
directory is what ``hpc-jabas plan --profile DIR`` and ``profile_dir`` in a job config read.
See hpc_jabas/runtime/profiling/ for what is measured and how; progress lines go to the log
(``--quiet``: none).
"""
from __future__ import annotations

import argparse
import sys

from hpc_jabas.core.config.validate import parse_ints
from hpc_jabas.core.perf.perfmodel import EMU_BASE_S, EMU_PER_SAMPLE_S
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.profiling.defaults import DEFAULT_B_LIMIT, DEFAULT_B_LIST, OPTIMIZERS  # no torch


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "profile", help="measure a model's micro-batch times, memory cap and allreduce; write a perf model",
        description="Profile MODULE:CALLABLE (returning model, loss_fn, sample_batch) on this device and write "
                    "<gpu>.json + allreduce.json into --out. Under mpirun with >= 2 ranks the allreduce is "
                    "measured and fitted too.")
    p.add_argument("--model", required=True, metavar="MODULE:CALLABLE",
                   help="e.g. examples.models:digits_mlp (the current directory is importable)")
    p.add_argument("--out", required=True, metavar="DIR", help="perf-model directory to write (kept: other types)")
    p.add_argument("--gpu-type", metavar="TYPE[,TYPE...]",
                   help="GPU type to store the measurement under (default on CUDA: the device's name); "
                        "with --emulate the emulated type(s); under mpirun one per rank")
    p.add_argument("--emulate", action="store_true",
                   help="profile emulated GPU types: t(b) = (base_s + per_sample_s*b) / speed, checked on the CPU")
    p.add_argument("--b-list", metavar="LIST", default=",".join(map(str, DEFAULT_B_LIST)),
                   help="micro-batch sizes to time (default %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per size (default %(default)s)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per size; the median is kept "
                                                           "(default %(default)s)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help="optimizer whose step is timed")
    p.add_argument("--memory-gb", type=float, metavar="GB",
                   help="memory limit for the cap max_b (CPU: default the catalog memory of the type; "
                        "CUDA: further limits the probed cap)")
    p.add_argument("--b-limit", type=int, default=DEFAULT_B_LIMIT,
                   help="largest max_b reported / probed (default %(default)s)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--base-s", type=float, default=EMU_BASE_S,
                   help="emulation: seconds per micro-batch on a V100 (default %(default)s)")
    p.add_argument("--per-sample-s", type=float, default=EMU_PER_SAMPLE_S,
                   help="emulation: seconds per sample on a V100 (default %(default)s)")
    p.add_argument("--emulation-overhead", action="store_true",
                   help="emulation: also run the emulator here and add its measured per-micro-batch excess "
                        "(sleep overshoot, loop work) to the profiles")
    p.add_argument("--speed", type=float, help="emulation: speed vs a V100 (default: catalog FP32 ratio)")
    p.add_argument("--allreduce-sizes", metavar="LIST",
                   help="message sizes, e.g. 4K,64K,1M,8M (default those; the gradient size is always added)")
    p.add_argument("--allreduce-repeats", type=int, default=10, help="timed allreduces per size")
    p.add_argument("--overlap", type=float, help="share of the allreduce hidden behind backward (0..1)")
    p.set_defaults(func=run)
    return p


def _ints(text: str, what: str) -> list[int]:
    return parse_ints(text, what, lo=1, hint="e.g. 1,2,4,8")


def parse_size(text: str) -> int:
    """'4K' -> 4096, '1M' -> 1048576, '512' -> 512 (bytes)."""
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "KMG" and t[-1:] else t
    try:
        v = float(num) * mult
    except ValueError:
        raise ConfigError(f"allreduce size {text!r} is not a size; e.g. 4K, 1M, 65536") from None
    if not v >= 4:
        raise ConfigError(f"allreduce size {text!r} must be >= 4 bytes")
    return int(v)


def check_profile_out(out: str) -> None:
    """--out is a new or empty directory, or a perf-model directory (only <gpu>.json / allreduce.json files):
    never a run or chain directory, or any other directory with files of its own."""
    from pathlib import Path
    d = Path(out)
    if not d.is_dir():
        return
    other = sorted(p.name for p in d.iterdir() if not (p.is_file() and p.suffix == ".json"))
    if other:
        raise ConfigError(f"--out {out!r} is a directory with other files ({', '.join(other[:3])}"
                          f"{', ...' if len(other) > 3 else ''}), not a perf-model directory; give a new or empty "
                          "directory, or one that hpc-jabas profile wrote")


def run(args, out=None) -> int:
    from hpc_jabas.runtime.profiling.run import ProfileSettings, run_profile
    out = out or sys.stdout
    sizes = [parse_size(s) for s in args.allreduce_sizes.split(",") if s.strip()] if args.allreduce_sizes else None
    if args.warmup < 0 or args.repeats < 1 or args.allreduce_repeats < 1:
        raise ConfigError("--warmup must be >= 0, --repeats and --allreduce-repeats >= 1")
    from hpc_jabas.cli.paths import probe_dir
    probe_dir(args.out, "--out")       # a bad --out fails now, not after the measurements
    check_profile_out(args.out)
    res = run_profile(args.model, args.out, ProfileSettings(
        gpu_types=args.gpu_type, emulate=args.emulate, b_list=_ints(args.b_list, "--b-list"), warmup=args.warmup,
        repeats=args.repeats, optimizer=args.optimizer, memory_gb=args.memory_gb, b_limit=args.b_limit,
        device=args.device, base_s=args.base_s, per_sample_s=args.per_sample_s, speed=args.speed,
        allreduce_sizes=sizes, allreduce_repeats=args.allreduce_repeats, overlap=args.overlap,
        emulation_overhead=args.emulation_overhead))
    if res.rank != 0:
        return 0
    m = res.model
    for g, p in sorted(m.profiles.items()):
        pts = " ".join(f"{b}:{t * 1e3:.3g}ms" for b, t in zip(p.b, p.t))
        kind = "emulated" if p.emulated else "measured"
        print(f"{g}: {kind}, max_b={p.max_b}, update {p.update_s * 1e3:.3g} ms, t(b) {pts}", file=out)
        print(f"  source: {p.source}", file=out)
    for nb, n, s in res.allreduce_samples:
        print(f"allreduce {nb} B over {n} ranks: {s * 1e3:.3f} ms", file=out)
    a = m.allreduce
    print(f"allreduce model: a={a.a:.4g} c={a.c * 1e3:.4g} ms bandwidth={a.bandwidth / 1e9:.4g} GB/s; "
          f"grad_bytes={m.grad_bytes:.0f}", file=out)
    for note in res.notes:
        print(f"note: {note}", file=out)
    print(f"wrote {', '.join(res.written)}", file=out)
    return 0
