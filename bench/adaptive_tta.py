"""Adaptive batching benchmark: time to accuracy under a protocol that can separate the methods.

    .venv/bin/python -m bench.adaptive_tta            # full protocol: 5 seeds, two cost regimes (30-40 min here)
    .venv/bin/python -m bench.adaptive_tta --quick    # smoke run: tiny sizes, 1 seed, fewer runs (2-3 min)
    .venv/bin/python -m bench.adaptive_tta --adamw    # only the AdamW section (wd_rule), 5 seeds (about 6 min)
    .venv/bin/python -m bench.adaptive_tta --image    # only the image task: ResNet-18 on JPEG files, 5 seeds
    .venv/bin/python -m bench.adaptive_tta --lm       # only the language-model task: TinyLM, AdamW, 5 seeds (~37 min)
    .venv/bin/python -m bench.adaptive_tta --lm --quick   # its smoke run (under a minute)
    .venv/bin/python -m bench.adaptive_tta --untuned  # only the task added after the defaults were frozen
    .venv/bin/python -m bench.adaptive_tta --untuned-cnn   # only the second one: a 2-D conv net with Adam on shapes
    .venv/bin/python -m bench.adaptive_tta --only 'noise-scale'   # development aid: only the kinds matching
    .venv/bin/python -m bench.adaptive_tta --fair     # THE FAIR PROTOCOL (bench/common/tta_fair.py), 5+5 seeds
    .venv/bin/python -m bench.adaptive_tta --fair --fair-tasks shapes-latency,shapes-compute,digits,lm,untuned,cnn,image
    .venv/bin/python -m bench.adaptive_tta --fair --quick --fair-tasks shapes-latency,digits   # its smoke run (~5 min)

The fair protocol (--fair) is the reference protocol: evaluations every quarter epoch with the clock paused, the
crossing time interpolated between the two that bracket the target, two targets per task (mid-curve, and plateau =
fixed-32's final less two seed standard deviations), the reference fixed configuration (each B with the sqrt and the
linear rule; the fastest ending within 0.5 point of fixed-32's final accuracy) chosen on selection seeds and scored
on fresh ones, the policies run on the fresh seeds at their defaults (batch_max included), a performance profile
over (task, target) pairs with misses infinite. Its last line: regret_geomean= regret_worst= misses= profile_110=
profile_125= one_run_vs_grid= acc_gap_worst_pts= (for goodput; the other policies' with their prefix) seeds=. The
protocol described below is the previous one (epoch-end evaluations, hindsight-best fixed B on the same seeds).

Cluster: 3 Horovod ranks (mpirun, re-exec'd by bench/common/launch.py) EMULATING v100 / p100 / rtx2060
(emulate=True, gpu_types): every micro-batch of b samples takes (base + per_sample * b) / speed. Two cost regimes:
- latency-bound: base 4 ms, 0.05 ms per sample (a b = 256 micro-batch is 24% per-call cost);
- compute-bound: base 2 ms, 0.1 ms per sample (7% at b = 256, as a large CNN on a V100).
Each task's model is profiled once per regime first (`hpc-jabas profile --emulate` over the 3 ranks, outside the
clock); every run plans with that measured profile (`profile_dir`), never with the emulator's formula. The real CPU
compute of these small models is far below the emulated time, so the wall clock is the emulated cluster's; a
"modelled clock" (the profile's time of each iteration's plan) is printed beside it as a check on machine load.

Protocol (fixed before the final run; nothing here is tuned per method):
- Every run of a task trains the same number of epochs with the same lr schedule in epochs (cosine from lr0 to
  0.05 lr0, stepped per epoch by the Trainer) and, within a seed, the same initial weights and sample order.
- Phase 1, fixed small B = 32 on every seed, lr0 picked once from a grid of 3 (shapes: 0.02 / 0.05 / 0.1 gave
  88.8 / 89.5 / 89.5 % at 12 epochs; 0.05 kept; digits keeps its example's 0.05). Its median test accuracy at 60%
  of the epoch budget is the task's TARGET, printed before any other run starts.
- Phase 2, per seed, in an order rotated from seed to seed:
  - fixed B in 64, 128, 256, 512 (= B_max), each with sqrt lr scaling (lr0 sqrt(B/32)) and with linear
    scaling plus a 2-epoch linear warm-up (Goyal et al.);
  - ramp, similarity and noise-scale (goodput), from B = 32 in [32, 512], with the JobConfig defaults only (p,
    gamma, alpha, window, warm-up, ramp_at, ramp_factor, lr rule "auto" with batch_ref = 32).
- Test accuracy at every epoch end with the clock PAUSED on every rank (rank 0 evaluates, the others wait in the
  same broadcast). The clock starts before the Trainer is built and counts the whole fit() otherwise.
- Time to target = the clock at the first evaluation at or above the target; inf if never.
- A ratio is median(method) / median(fixed-32) over the seeds, with a paired bootstrap 90% interval (seeds
  resampled with replacement, 4000 resamples). "beats" only when the interval lies below 1, "loses" when above;
  otherwise "not separated".
- Final accuracy at the full budget; gap = fixed-32's median final accuracy minus the method's, points.
- Main task "shapes" (bench/common/tta_tasks.py; 6,000 training images, 10 epochs): its gradient noise scale is
  probed on the fixed-32 runs (clock paused) at the start and at every epoch end; noise_growth = last epoch's / first's.
- Second task: scikit-learn's digits, latency-bound regime only, the same grid and policies (its best fixed B is
  found by the grid, not assumed).
- Beside time to target: samples and optimizer steps to target; each policy's regret against the hindsight-best
  fixed B and against the median grid point (paired bootstrap intervals); the grid's total training time per seed
  (what finding the best fixed B costs) beside one adaptive run's.
- Variants (VARIANTS, in every section that runs the policies): kind "<policy>+<tag>" is the policy at the
  JobConfig defaults plus exactly the dict's overrides (e.g. goodput with another lr rule, similarity averaged
  over the measurements of its period); each is a row, a trajectory and a regret, and is compared with its
  policy's default, paired.
- --only REGEX runs only the phase-2 kinds whose name matches (fixed-32 always runs: it sets the target). A
  development aid: its figures are not the protocol's.
- Language-model task (--lm, its own run): examples/train_lm.py's TinyLM (width 32, 20K parameters) and its
  lm_forward (token-weighted loss) on 6,144 training sequences in the example's format from a Markov chain of
  order 2 (the example's order-1 chain is learned to its ceiling in the first epoch; see tta_tasks.LM_ORDER),
  8 epochs, AdamW (weight_decay 0.01) with the lr picked from 3 on fixed-32, validation next-token accuracy
  (token-weighted) as the metric, its own regime LM_REGIME; the noise scale probed on fixed-32; see lm_section.
- Untuned task (--untuned, its own run): a 1-D convolutional net with Adam on generated sequences
  (tasks.seq_data), added after the defaults were frozen and never used to choose one; the grid and the three
  policies at their defaults, no variants; see untuned_section. A second one (--untuned-cnn): a 2-D
  convolutional net with Adam on the shapes images, the same protocol.
- Image task (--image, its own run): examples/train_resnet.py's ResNet-18 (BatchNorm) on the example's JPEG files,
  decoded and augmented on every read, compute-bound (IMAGE_REGIME), the same protocol; see image_section.

Last line, per regime R in (latency, compute): R_tta_ratio_similarity, R_tta_ratio_goodput, R_tta_ratio_ramp,
R_best_fixed_tta_ratio (each with _lo and _hi), R_goodput_vs_best_fixed (with _lo, _hi), R_goodput_vs_grid_median,
R_grid_cost_s, R_goodput_cost_s, R_acc_gap_similarity_pts, R_acc_gap_goodput_pts (the worse of the tasks run in
R); per other task T (digits): T_goodput_vs_best_fixed (with _lo, _hi), T_tta_ratio_goodput, T_acc_gap_goodput_pts;
and noise_growth.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common.launch import ensure_ranks, in_mpi_world, profile_emulated

RANKS = 3
TYPES = ["v100", "p100", "rtx2060"]
REGIMES = {"latency": dict(emulate_base_s=0.004, emulate_per_sample_s=0.00005),
           "compute": dict(emulate_base_s=0.002, emulate_per_sample_s=0.0001)}
PROFILES = Path("/tmp/hj-bench-tta-profiles")
BUNDLES = {"shapes": "bench.common.tta_tasks:shapes_bundle", "digits": "bench.common.tta_tasks:digits_bundle"}
#: the image section (--image): the ResNet example on JPEG files, compute-bound (the per-call part, 50 ms, is 12%
#: of a b = 256 micro-batch's 434 ms). Both parts are set well above this host's real CPU compute of the model
#: (about 10 ms per call and 0.15 ms per sample on one core, plus the decoding on the training thread, and
#: 1.5x that with 3 ranks on 2 cores), so that the clock times the emulated GPUs, not this host: at a third of
#: these times the real compute was 0.73 of the compute time (median over a smoke run's runs). The section
#: prints the real share it measured.
IMAGE_REGIME = dict(emulate_base_s=0.05, emulate_per_sample_s=0.0015)
JPEG_ROOT = Path("/tmp/hj-bench-tta-jpeg")
#: the language-model section (--lm): examples/train_lm.py's TinyLM at width 32 (tta_tasks.lm_model), AdamW. Its
#: real CPU compute here is about 1.4 ms + 0.13 ms per sample (31 tokens) on one core, 1.5x that with 3 ranks on
#: 2 cores. The emulated 12 ms + 0.6 ms per sample is set well above it: on a quiet host the real compute was
#: 0.22 of the compute time at B = 32 (the V100 rank's b = 22), 0.34 at B = 512 (its b = 248), median 0.26 over
#: a development run's runs, no micro-batch overran (the section prints what it measured; a busy host raises it).
#: The per-call part is 38% of a b = 32 micro-batch and 7% at b = 256: B = 32 is latency-bound (29 ms an
#: iteration on the 3 GPUs, about 1,100 samples/s; B = 512 166 ms, 3,100/s).
LM_REGIME = dict(emulate_base_s=0.012, emulate_per_sample_s=0.0006)
#: the untuned section (--untuned): the 1-D conv net's real CPU compute here is about 1 ms at b = 32 and 4 ms at
#: b = 256 on one core, 1.5x that with 3 ranks on 2 cores; the emulated 6 ms + 0.15 ms per sample is set above it
#: (the per-call part is 14% of a b = 256 micro-batch; a smoke run at two thirds of these times, beside a test
#: suite, measured a real share of 0.68). The section prints the real share it measured.
UNTUNED_REGIME = dict(emulate_base_s=0.006, emulate_per_sample_s=0.00015)
#: the fair protocol's sections (--fair-tasks); the first three by default
FAIR_TASKS = ("shapes-latency", "shapes-compute", "digits", "lm", "untuned", "cnn", "image")
#: the regimes each task runs in (digits is for accuracy: one regime)
TASK_REGIMES = {"shapes": ("latency", "compute"), "digits": ("latency",)}


def profile_cluster() -> None:
    """Before the MPI world starts: `hpc-jabas profile --emulate` of each task's model on the 3 emulated ranks, per
    regime (as a user profiles once per model and cluster): the emulated compute, the optimizer step and the
    allreduce measured over Horovod here. Outside the benchmark clock. A failure stops the benchmark: planning
    with anything but a measured profile is not this protocol."""
    shutil.rmtree(PROFILES, ignore_errors=True)
    if "--fair" in sys.argv:
        _profile_fair()
        return
    if "--image" in sys.argv:
        profile_emulated("tta_tasks:image_bundle (image)", "bench.common.tta_tasks:image_bundle", TYPES,
                         IMAGE_REGIME["emulate_base_s"], IMAGE_REGIME["emulate_per_sample_s"],
                         PROFILES / "image" / "jpeg")
        return
    if "--lm" in sys.argv:
        profile_emulated("tta_tasks:lm_bundle (lm)", "bench.common.tta_tasks:lm_bundle", TYPES,
                         LM_REGIME["emulate_base_s"], LM_REGIME["emulate_per_sample_s"], PROFILES / "lm" / "lm",
                         "--optimizer", "adam")
        return
    if "--untuned-cnn" in sys.argv:
        profile_emulated("tta_tasks:shapes_cnn_bundle (cnn)", "bench.common.tta_tasks:shapes_cnn_bundle", TYPES,
                         UNTUNED_REGIME["emulate_base_s"], UNTUNED_REGIME["emulate_per_sample_s"],
                         PROFILES / "cnn" / "shapes-cnn", "--optimizer", "adam")
        return
    if "--untuned" in sys.argv:
        profile_emulated("tta_tasks:seq_bundle (untuned)", "bench.common.tta_tasks:seq_bundle", TYPES,
                         UNTUNED_REGIME["emulate_base_s"], UNTUNED_REGIME["emulate_per_sample_s"],
                         PROFILES / "untuned" / "seq", "--optimizer", "adam")
        return
    if "--adamw" in sys.argv:             # the AdamW section: the shapes model with Adam's step, latency-bound
        emu = REGIMES["latency"]
        profile_emulated(f"{BUNDLES['shapes']} (latency, adam)", BUNDLES["shapes"], TYPES, emu["emulate_base_s"],
                         emu["emulate_per_sample_s"], PROFILES / "latency" / "shapes-adam", "--optimizer", "adam")
        return
    for name, bundle in BUNDLES.items():
        for regime in TASK_REGIMES[name]:
            emu = REGIMES[regime]
            profile_emulated(f"{bundle} ({regime})", bundle, TYPES, emu["emulate_base_s"], emu["emulate_per_sample_s"],
                             PROFILES / regime / name)


def _profile_fair() -> None:
    """The profiles of the fair protocol's sections (--fair-tasks, read from the command line before argparse)."""
    argv = sys.argv
    i = argv.index("--fair-tasks") + 1 if "--fair-tasks" in argv else len(argv)
    names = (argv[i] if i < len(argv) else ",".join(FAIR_TASKS[:3])).split(",")
    for name in names:
        if name in ("shapes-latency", "shapes-compute", "digits"):
            regime = "compute" if name == "shapes-compute" else "latency"
            key = name.split("-")[0]
            emu = REGIMES[regime]
            profile_emulated(f"{BUNDLES[key]} ({regime})", BUNDLES[key], TYPES, emu["emulate_base_s"],
                             emu["emulate_per_sample_s"], PROFILES / regime / key)
        elif name in FAIR_PROFILES:
            bundle, emu, out, extra = FAIR_PROFILES[name]
            profile_emulated(f"{bundle} ({name})", bundle, TYPES, emu["emulate_base_s"], emu["emulate_per_sample_s"],
                             PROFILES / out, *extra)


#: the other fair sections' profiles: (bundle, regime, profile folder under PROFILES, extra profile flags)
FAIR_PROFILES = {"lm": ("bench.common.tta_tasks:lm_bundle", LM_REGIME, "lm/lm", ("--optimizer", "adam")),
                 "untuned": ("bench.common.tta_tasks:seq_bundle", UNTUNED_REGIME, "untuned/seq",
                             ("--optimizer", "adam")),
                 "cnn": ("bench.common.tta_tasks:shapes_cnn_bundle", UNTUNED_REGIME, "cnn/shapes-cnn",
                         ("--optimizer", "adam")),
                 "image": ("bench.common.tta_tasks:image_bundle", IMAGE_REGIME, "image/jpeg", ())}


if not in_mpi_world():
    profile_cluster()
ensure_ranks(RANKS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from bench.common import phases  # noqa: E402
from bench.common import tta_tasks as tasks  # noqa: E402
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

SMALL, LARGE = 32, 512
WARMUP_EPOCHS = 2
LR_FLOOR = 0.05
TARGET_AT = 0.6              # the target: fixed-small's median accuracy at this fraction of the epoch budget
BOOT = 4000
ROOT = Path("/tmp/hj-bench-tta")
POLICIES = ("ramp", "similarity", "noise-scale")
#: beside each policy at its defaults: the policy with these JobConfig overrides (kind "<policy>+<tag>"), so the
#: benchmark decides a default (lr rule "auto" for goodput; similarity averaged over the period's measurements)
VARIANTS: dict[str, dict] = {"noise-scale+adascale": {"lr_rule": "adascale"},
                             "similarity+avg": {"measure_every": 5},
                             # the priced noise scale kappa x B_noise (docs/formulas.md, section 3)
                             "noise-scale+kappa2": {"kappa": 2.0}, "noise-scale+kappa4": {"kappa": 4.0},
                             "noise-scale+kappa8": {"kappa": 8.0},
                             # the start at the throughput's knee, lr warmed up (core/planning/space.py throughput_knee)
                             "noise-scale+knee": {"batch_start": "knee"},
                             "noise-scale+knee-kappa4": {"batch_start": "knee", "kappa": 4.0},
                             # the noise scale as measured, not priced ahead along its trend (the default
                             # before; docs/formulas.md, section 3)
                             "noise-scale+measured": {"noise_trend": False},
                             # two mechanisms judged by the fair protocol: the curvature headroom measured
                             # online on a 1,024-sample probe batch, B priced by E_lin and capped at c x h; and
                             # the epoch budget counted in statistical progress (goal = "final")
                             "noise-scale+headroom": {"headroom_probe": 1024, "headroom_every": 1,
                                                      "efficiency": "linear"},
                             "noise-scale+final": {"goal": "final"}}


def variant_key(kind: str) -> str:
    """A variant's name in the last line's keys: "noise-scale+adascale" -> "goodput_adascale"."""
    import re
    policy, tag = kind.split("+", 1)
    return {"noise-scale": "goodput"}.get(policy, policy) + "_" + re.sub(r"\W", "_", tag)

nan = math.nan
ONLY: str | None = None      # --only REGEX: a development aid; its figures are not the protocol's
FAIR = False                 # --fair: the fair protocol (bench/common/tta_fair.py)
EVALS_PER_EPOCH = 4          # the fair protocol's evaluations per epoch (clock paused)


@dataclass
class Task:
    name: str
    data: tuple
    model_fn: object
    lr0: float
    epochs: int
    grid: tuple[int, ...]
    probe_noise: bool
    tensors: tuple = field(default_factory=tuple)
    train_ds: object = None          # a Dataset read on every step (the image task); else the data's arrays
    forward_fn: object = None        # the Trainer's forward_fn (the LM task: token-weighted), else loss_fn
    acc_fn: object = None            # (model, x, y) -> accuracy; None: tasks.accuracy
    optimizer: str = "sgd"           # "sgd" (momentum 0.9), "adamw" (PyTorch's defaults, weight_decay 0.01), "adam"
    variants: bool = True            # False: the grid and the policies at their defaults only (the untuned task)

    def __post_init__(self):
        xtr, ytr, xte, yte = self.data
        if self.train_ds is not None:           # its tensors when it has two (the LM's tokens, lengths: the probe)
            tr = getattr(self.train_ds, "tensors", ())
            self.tensors = (*(tr if len(tr) == 2 else (None, None)), xte, yte)
            return
        self.tensors = (torch.tensor(xtr), torch.tensor(ytr, dtype=torch.long),
                        torch.tensor(xte), torch.tensor(yte, dtype=torch.long))

    @property
    def n_train(self) -> int:
        return len(self.train_ds) if self.train_ds is not None else len(self.tensors[0])

    def phase2(self) -> list[str]:
        import re
        kinds = [*(f"fixed-{b}-{rule}" for b in self.grid for rule in ("sqrt", "linear")), *POLICIES,
                 *(VARIANTS if self.variants else ())]
        return [k for k in kinds if ONLY is None or re.search(ONLY, k)]


def make_tasks(quick: bool) -> list[Task]:
    if quick:
        return [Task("shapes", tasks.shapes_data(n_train=1200, n_test=500), tasks.shapes_model, 0.05, 5, (128,), True),
                Task("digits", tasks.digits_data(), tasks.digits_model, 0.05, 5, (128,), False)]
    # every task runs the fixed grid, so its best fixed B is found, not true by construction
    return [Task("shapes", tasks.shapes_data(), tasks.shapes_model, 0.05, 10, (64, 128, 256, LARGE), True),
            Task("digits", tasks.digits_data(), tasks.digits_model, 0.05, 20, (64, 128, 256, LARGE), False)]


def cosine(epochs: int):
    return lambda e: LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1 + math.cos(math.pi * min(e, epochs) / epochs))


def goyal_warmup(opt: torch.optim.Optimizer, B: int, iters: int) -> None:
    """Linear warm-up of a linearly scaled lr (Goyal et al.): the optimizer holds lr0 * B / 32; each
    step multiplies it by a factor ramping from 32 / B to 1 over ``iters`` steps (then restores it)."""
    state = {"step": 0, "saved": None}
    r0 = SMALL / B

    def pre(o, args, kwargs):
        f = r0 + (1 - r0) * min(1.0, (state["step"] + 1) / iters)
        state["saved"] = [g["lr"] for g in o.param_groups]
        for g in o.param_groups:
            g["lr"] = g["lr"] * f

    def post(o, args, kwargs):
        for g, lr in zip(o.param_groups, state["saved"]):
            g["lr"] = lr
        state["step"] += 1
    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(post)


def read_iterations(run_dir: Path, profile_dir: Path,
                    iters: list[tuple[int, int, float]] | None = None) -> tuple[dict, list[float]]:
    """From the run's metrics.jsonl (rank 0): (costs, modelled) where costs maps (B, plan) of
    the full iterations (not the shrunk epoch tail) to (iterations, measured seconds), and modelled[i]
    is iteration i's time predicted by the profiled perf model for the plan it ran (empty when the
    file, the profile or the format is missing). ``iters``: filled with every iteration's (B, samples, seconds)
    in order (the phase split, bench/common/phases.py)."""
    import json

    from hpc_jabas.core.perf.perfmodel import PerfModel
    from hpc_jabas.core.planning import Plan
    rows: dict[tuple[int, str], list[float]] = {}
    modelled: dict[int, float] = {}
    try:
        model = PerfModel.load(profile_dir) if (profile_dir / "allreduce.json").exists() else None
        memo: dict[str, float] = {}
        with open(run_dir / "metrics.jsonl") as f:
            for line in f:
                r = json.loads(line)
                if r.get("type") != "iteration":
                    continue
                plan = str(r["plan"])
                if model is not None:
                    if plan not in memo:
                        memo[plan] = model.iteration_time(Plan.parse(plan), TYPES)
                    modelled[int(r["it"])] = memo[plan]
                if r.get("samples") == r.get("B"):
                    rows.setdefault((int(r["B"]), plan), []).append(float(r["iter_s"]))
                if iters is not None:
                    iters.append((int(r["B"]), int(r["samples"]), float(r["iter_s"])))
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return {}, []
    n = len(modelled)
    times = [modelled[i] for i in range(n)] if set(modelled) == set(range(n)) else []
    return {k: (len(v), sum(v)) for k, v in rows.items()}, times


def decided_cosines(run_dir: Path) -> list[float]:
    """The cosine each similarity decision read (its period's mean where it averaged), from metrics.jsonl."""
    import json
    out = []
    try:
        with open(run_dir / "metrics.jsonl") as f:
            for line in f:
                r = json.loads(line)
                st = (r.get("stats") or {}) if r.get("type") == "decision" else {}
                v = st.get("similarity_mean", st.get("similarity"))
                if isinstance(v, (int, float)) and math.isfinite(v):
                    out.append(float(v))
    except (OSError, ValueError):
        return []
    return out


def cosine_spread(runs: list[dict]) -> str:
    """Per run: the standard deviation of the decided cosines and the median change between two decisions; the
    medians over the runs with min/max."""
    sds, chg = [], []
    for r in runs:
        v = r.get("cosines") or []
        if len(v) > 2:
            sds.append(statistics.pstdev(v))
            chg.append(statistics.median(abs(a - b) for a, b in zip(v, v[1:])))
    if not sds:
        return "no decided cosines"
    return (f"sd of the decided cosine {med(sds):.3f} [{min(sds):.3f},{max(sds):.3f}], change between decisions "
            f"{med(chg):.3f} [{min(chg):.3f},{max(chg):.3f}] (medians over {len(sds)} runs)")


def _costs_text(costs: dict) -> str:
    """The plans that took most of the run's iteration time, with their measured ms per iteration."""
    if not costs:
        return "(no iteration metrics)"
    total = sum(t for _, t in costs.values())
    top = sorted(costs.items(), key=lambda kv: -kv[1][1])[:5]
    return (f"iteration time {total:.1f}s, most in: "
            + ", ".join(f"B={B} [{plan}] {n}it x {1e3 * t / n:.1f}ms" for (B, plan), (n, t) in top))


def _traj(Bs) -> str:
    """B at each epoch end, runs of equal values collapsed: 32x3,35,38,..."""
    out, i = [], 0
    while i < len(Bs):
        j = i
        while j + 1 < len(Bs) and Bs[j + 1] == Bs[i]:
            j += 1
        out.append(f"{Bs[i]:.0f}" + (f"x{j - i + 1}" if j > i else ""))
        i = j + 1
    return ",".join(out)


def tta(res: dict, target: float, clock: str = "clock") -> float:
    for e in res["evals"]:
        if e["acc"] >= target - 1e-12:
            return e.get(clock, math.nan)
    return math.inf


def med(v):
    return statistics.median(v) if v else math.nan


def noise_trajectory(results: list[dict], epochs: int) -> list[float]:
    """Per epoch e: mean tr(Sigma) / mean |G|^2 over the fixed-small probes at its start (probe e)
    and end (probe e+1), pooled over seeds."""
    out = []
    for e in range(epochs):
        g2 = [r["probes"][k][1] for r in results for k in (e, e + 1)]
        s = [r["probes"][k][2] for r in results for k in (e, e + 1)]
        mg, ms = statistics.mean(g2), statistics.mean(s)
        out.append(ms / mg if mg > 0 else math.inf)
    return out


def run_one(task: Task, kind: str, seed: int, rank: int, regime: str, probe_noise: bool,
            adamw_lr: float | None = None, tag: str = "") -> dict:
    """One run. ``adamw_lr``: AdamW at PyTorch's defaults but this lr (the AdamW section), profiled with Adam's
    step; a kind ending in "+wd" then runs with ``wd_rule = "linear"``. A kind "<policy>+<tag>" in VARIANTS: the
    policy with its overrides. ``tag``: appended to the run's directory (the lr grid's runs of one seed)."""
    x, y, xt, yt = task.tensors
    ds = task.train_ds if task.train_ds is not None else torch.utils.data.TensorDataset(x, y)
    torch.manual_seed(1000 + seed)              # same initial weights for every run of this seed
    model = task.model_fn()
    loss_fn = None if task.forward_fn is not None else nn.CrossEntropyLoss()
    acc_fn = task.acc_fn or tasks.accuracy
    prof = PROFILES / regime / (task.name + ("-adam" if adamw_lr is not None else ""))
    cfg = dict(emulate=True, gpu_types=TYPES, checkpoint=False, epochs=task.epochs, seed=seed,
               run_dir=str(ROOT / (f"{regime}-{task.name}-{kind}-s{seed}" + ("-adamw" if adamw_lr else "") + tag)),
               profile_dir=str(prof), **{"image": IMAGE_REGIME, "lm": LM_REGIME,
                                         "untuned": UNTUNED_REGIME, "cnn": UNTUNED_REGIME}.get(
                                             regime, REGIMES.get(regime, {})))
    if kind.endswith("+wd") and kind not in VARIANTS:       # the AdamW section's kinds
        kind = kind[:-3]
        cfg["wd_rule"] = "linear"
    name = kind
    policy = kind in POLICIES or kind in VARIANTS
    if policy:
        B = SMALL
        base = kind.split("+")[0]
        cfg.update(policy=base, batch=SMALL, batch_min=SMALL)                       # everything else: defaults
        if not FAIR:                    # the fair protocol: batch_max at its default (one epoch) too
            cfg.update(batch_max=LARGE)
        cfg.update(VARIANTS.get(kind, {}))
        lr = task.lr0
    else:
        parts = kind.split("-")
        B = int(parts[1])
        rule = parts[2] if len(parts) > 2 else "none"
        cfg.update(batch=B)
        lr = task.lr0 * {"none": 1.0, "sqrt": math.sqrt(B / SMALL), "linear": B / SMALL}[rule]
    if adamw_lr is not None:
        lr = adamw_lr * (lr / task.lr0)            # the same scaling rules, on the AdamW lr
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=lr)   # weight_decay: its 0.01
    elif task.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    elif task.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if not policy and kind.endswith("-linear"):
        goyal_warmup(opt, B, WARMUP_EPOCHS * math.ceil(task.n_train / B))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine(task.epochs))
    evals: list[dict] = []
    curve: list[dict] = []          # every evaluation in time order, from the one before training (the crossing time)
    probes: list[tuple] = []
    clk = {"t0": 0.0, "paused": 0.0}
    holder: dict = {}
    gen = torch.Generator().manual_seed(seed)

    def probe(m):
        with torch.random.fork_rng():
            return tasks.noise_scale(m, loss_fn, x, y, b_small=32, n_small=128, gen=gen, forward_fn=task.forward_fn)

    def eval_fn(m):
        t = time.perf_counter()
        clock = t - clk["t0"] - clk["paused"]
        out = None
        if rank == 0:
            out = (acc_fn(m, xt, yt), probe(m) if probe_noise else None)
        acc, pr = comm.broadcast_object(out, name="tta.eval")
        tr = holder["trainer"]
        # samples: the evaluations come at epoch ends, so the samples so far are whole epochs; it: optimizer steps
        evals.append({"clock": clock, "acc": acc, "B": tr.B, "it": tr.iteration,
                      "samples": (len(evals) + 1) * task.n_train})
        curve.append(evals[-1])
        if pr is not None:
            probes.append(pr)
        clk["paused"] += time.perf_counter() - t
        return {"test_acc": acc}

    if probe_noise:
        probes.append(comm.broadcast_object(probe(model) if rank == 0 else None, name="tta.probe0"))
    acc0 = comm.broadcast_object(acc_fn(model, xt, yt) if rank == 0 and FAIR else None, name="tta.acc0")
    if FAIR:
        curve.append({"clock": 0.0, "acc": acc0, "B": B, "it": 0, "samples": 0})
    comm.broadcast_object(None, name="tta.sync")
    clk["t0"] = time.perf_counter()
    extra = {"forward_fn": task.forward_fn} if task.forward_fn is not None else {}
    if FAIR:
        extra["callbacks"] = [_quarter_eval(task.n_train, clk, rank, acc_fn, xt, yt, curve, holder)]
    tr = Trainer(model, opt, ds, loss_fn, config=JobConfig(**cfg), scheduler=sched, eval_fn=eval_fn, **extra)
    holder["trainer"] = tr
    slept = {"s": 0.0}
    emu = getattr(tr, "emulator", None)
    if emu is not None:                          # the emulator's sleep, to tell real compute from emulated time
        wait_next = emu.wait_next

        def counted(*a, **k):
            w = wait_next(*a, **k)
            slept["s"] += w
            return w
        emu.wait_next = counted
    tr.fit()
    for closer in (getattr(getattr(tr, "opt", None), "remove_hooks", None),
                   getattr(getattr(tr, "metrics", None), "close", None)):
        if closer is not None:
            closer()
    iters = tr.iteration
    # per rank: micro-batches whose real compute overran the emulated time, and the real share of the compute
    # time (its compute time less the emulator's sleep); the worst rank's share
    total = float(getattr(tr, "compute_local_s", 0.0))
    mine = (int(getattr(emu, "overruns", 0)), (total - slept["s"]) / total if total > 0 else math.nan)
    gathered = comm.allgather_object(mine, name="tta.overruns")
    overruns = sum(o for o, _ in gathered)
    share = max((x for _, x in gathered), default=math.nan)
    rows: list[tuple[int, int, float]] = []
    costs, modelled = read_iterations(Path(cfg["run_dir"]), prof, rows) if rank == 0 else ({}, [])
    cosines = decided_cosines(Path(cfg["run_dir"])) if rank == 0 and name.startswith("similarity") else []
    if modelled:
        for e in curve if FAIR else evals:
            e["model_clock"] = sum(modelled[:e["it"]])
    kind = name + ("+wd" if cfg.get("wd_rule") == "linear" else "")
    res = {"task": task.name, "kind": kind, "seed": seed, "regime": regime, "evals": evals, "probes": probes,
           "iterations": iters, "costs": costs, "mean_B": task.epochs * task.n_train / max(iters, 1),
           "final": evals[-1]["acc"], "train_s": evals[-1]["clock"], "real_share": share, "overruns": overruns,
           "cosines": cosines, "rows": rows, "curve": curve}
    if rank == 0:
        print(f"  [{regime} {task.name} seed {seed}] {kind:<16} final={100 * res['final']:.2f}% "
              f"train={res['train_s']:.1f}s iters={iters} mean_B={res['mean_B']:.0f} "
              f"B@epoch_end={_traj([e['B'] for e in evals])}", flush=True)
    return res


def _quarter_eval(n_train: int, clk: dict, rank: int, acc_fn, xt, yt, curve: list, holder: dict):
    """The fair protocol's evaluations inside an epoch: after the iteration that crosses each of its first
    EVALS_PER_EPOCH - 1 equal shares of the training set (the epoch's end is the eval_fn's), rank 0 evaluates with
    the clock paused on every rank (the others wait in the broadcast); every rank calls it at the same iteration."""
    from hpc_jabas.runtime.hooks import Callback

    class QuarterEval(Callback):
        def __init__(self) -> None:
            self.done, self.k = 0, 1

        def on_step_end(self, trainer, rec) -> None:
            self.done += int(rec["samples"])
            share, hit = n_train / EVALS_PER_EPOCH, False
            while self.k * share <= self.done + 1e-9:
                hit = hit or self.k % EVALS_PER_EPOCH != 0
                self.k += 1
            if not hit:
                return
            t = time.perf_counter()
            clock = t - clk["t0"] - clk["paused"]
            acc = comm.broadcast_object(acc_fn(trainer.model, xt, yt) if rank == 0 else None, name="tta.quarter")
            curve.append({"clock": clock, "acc": acc, "B": trainer.B, "it": trainer.iteration, "samples": self.done})
            clk["paused"] += time.perf_counter() - t
    return QuarterEval()


def boot_ratio(num: list[float], den: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    """median(num) / median(den) over the seeds, and its paired bootstrap 90% interval (inf where a median is)."""
    a, b = np.array(num, dtype=float), np.array(den, dtype=float)

    def ratio(x, y):
        mx, my = float(np.median(x)), float(np.median(y))
        if math.isinf(my):
            return math.nan if math.isinf(mx) else 0.0
        return mx / my

    n = len(a)
    idx = rng.integers(0, n, size=(BOOT, n))
    rs = np.array([ratio(a[i], b[i]) for i in idx])
    rs = rs[~np.isnan(rs)]
    point = ratio(a, b)
    if not len(rs):
        return point, math.nan, math.nan
    return point, float(np.quantile(rs, 0.05, method="lower")), float(np.quantile(rs, 0.95, method="higher"))


def verdict(lo: float, hi: float) -> str:
    if hi < 1:
        return "beats"
    if lo > 1:
        return "loses"
    return "not separated"


def fmt_range(v, nd=1) -> str:
    fin = [x for x in v if math.isfinite(x)]
    miss = f" ({len(v) - len(fin)} miss)" if len(fin) < len(v) else ""
    m = med(v)
    if not math.isfinite(m):
        return f"never{miss}"
    return f"{m:.{nd}f} [{min(fin):.{nd}f},{max(v):.{nd}f}]{miss}"


def target_of(task: Task, base: list[dict]) -> float:
    k = max(1, round(TARGET_AT * task.epochs)) - 1           # the evaluation after that many epochs
    return statistics.median(r["evals"][k]["acc"] for r in base)


def report(task: Task, regime: str, res: list[dict], target: float, rng: np.random.Generator) -> dict:
    kinds = [f"fixed-{SMALL}", *(k for k in task.phase2() if any(r["kind"] == k for r in res))]
    by = {k: sorted((r for r in res if r["kind"] == k), key=lambda r: r["seed"]) for k in kinds}
    seeds = [r["seed"] for r in by[f"fixed-{SMALL}"]]
    tt = {k: [tta(r, target) for r in v] for k, v in by.items()}
    ttm = {k: [tta(r, target, "model_clock") for r in v] for k, v in by.items()}
    base_final = statistics.median(r["final"] for r in by[f"fixed-{SMALL}"])
    out: dict = {"ratio": {}, "lo": {}, "hi": {}, "gap": {}, "target": target}
    print(f"\n== {regime}-bound, task {task.name}: {task.n_train} training samples, {task.epochs} epochs, "
          f"{math.ceil(task.n_train / SMALL) * task.epochs} iterations at B={SMALL}, lr0={task.lr0}, seeds {seeds}; "
          f"target = {100 * target:.2f}% (fixed-{SMALL}'s median at {TARGET_AT:.0%} of the budget)")
    hdr = (f"{'run':<17} {'time to target s: med [min,max]':<32} {'ratio [90% interval]':<22} "
           f"{'vs fixed-32':<14} {'final acc %: med [min,max]':<26} {'gap':>6} {'iters':>6} {'mean B':>6} "
           f"{'model':>6}  B at epoch ends (seed 0)")
    print(hdr)
    print("-" * len(hdr))
    for k, v in by.items():
        if [r["seed"] for r in v] != seeds:
            raise SystemExit(f"adaptive_tta: {k} ran seeds {[r['seed'] for r in v]}, fixed-{SMALL} {seeds}")
        r_, lo, hi = boot_ratio(tt[k], tt[f"fixed-{SMALL}"], rng)
        rm, _, _ = boot_ratio(ttm[k], ttm[f"fixed-{SMALL}"], rng)
        accs = [100 * r["final"] for r in v]
        gap = 100 * base_final - statistics.median(accs)
        out["ratio"][k], out["lo"][k], out["hi"][k], out["gap"][k] = r_, lo, hi, gap
        out.setdefault("model", {})[k] = rm
        print(f"{k:<17} {fmt_range(tt[k]):<32} {r_:>6.3f} [{lo:.3f},{hi:.3f}]{'':<3} "
              f"{'-' if k == f'fixed-{SMALL}' else verdict(lo, hi):<14} "
              f"{statistics.median(accs):.2f} [{min(accs):.2f},{max(accs):.2f}]{'':<6} {gap:>6.2f} "
              f"{med([r['iterations'] for r in v]):>6.0f} {med([r['mean_B'] for r in v]):>6.0f} {rm:>6.3f}  "
              f"{_traj([e['B'] for e in v[0]['evals']])}")
    for k in (k for k in (*POLICIES, *VARIANTS) if k in by):
        for r in by[k]:
            accs = ",".join(f"{100 * e['acc']:.1f}" for e in r["evals"])
            print(f"  {k} seed {r['seed']}: B at epoch ends {_traj([e['B'] for e in r['evals']])}; acc % {accs}")
            print(f"      {_costs_text(r['costs'])}")
    fixed = [k for k in by if k.startswith("fixed-")]
    best = min(fixed, key=lambda k: (out["ratio"][k], k))
    out["best"] = best
    print(f"best fixed B in hindsight: {best} (ratio {out['ratio'][best]:.3f} "
          f"[{out['lo'][best]:.3f},{out['hi'][best]:.3f}])")
    both = phases.both_goals({k: out["ratio"][k] for k in fixed}, out["gap"], best)
    out["both"] = both
    print(f"  its own final accuracy: {out['gap'][best]:.2f} points below fixed-{SMALL}'s; fixed B within 1.10 of its "
          f"time and 0.5 point of fixed-{SMALL}'s accuracy: {', '.join(both) or 'none'}")
    for k in ("noise-scale", "similarity"):
        if k not in by:
            continue
        for other in (best, "ramp"):
            if other == k or other not in by:
                continue
            r_, lo, hi = boot_ratio(tt[k], tt[other], rng)
            out.setdefault("vs", {})[(k, other)] = (r_, lo, hi)
            print(f"  {k} / {other}: {r_:.3f} [{lo:.3f},{hi:.3f}] -> {verdict(lo, hi)}")
    for k in (k for k in VARIANTS if k in by):
        default = k.split("+")[0]
        if default in by:
            r_, lo, hi = boot_ratio(tt[k], tt[default], rng)
            out.setdefault("vs", {})[(k, default)] = (r_, lo, hi)
            accs_k = statistics.median(100 * r["final"] for r in by[k])
            accs_d = statistics.median(100 * r["final"] for r in by[default])
            print(f"  {k} / {default}: {r_:.3f} [{lo:.3f},{hi:.3f}] -> {verdict(lo, hi)}; final accuracy "
                  f"{accs_k:.2f}% against {accs_d:.2f}%")
    for k in (k for k in by if k.startswith("similarity")):
        print(f"  {k}: {cosine_spread(by[k])}")
    print("  ratio: median time to target over fixed-32's (wall clock); model: the same on the modelled clock "
          "(the profiled perf model's time of each iteration's plan; no decision or measurement cost)")
    regrets(by, tt, target, out, rng)
    phase_split(by, target, out)
    if task.probe_noise and by[f"fixed-{SMALL}"][0]["probes"]:
        traj = noise_trajectory(by[f"fixed-{SMALL}"], task.epochs)
        out["noise_growth"] = traj[-1] / traj[0]
        print("B_noise per epoch (fixed-32, start+end probes, seeds pooled): "
              + ", ".join(f"{b:.0f}" for b in traj) + f"; growth last/first = {out['noise_growth']:.1f}x")
    return out


def regrets(by: dict, tt: dict, target: float, out: dict, rng: np.random.Generator) -> None:
    """Samples and optimizer steps to the target; each policy's regret against the hindsight-best fixed B and
    against the median grid point (per seed, the median of the fixed runs' times), with intervals; and what the
    grid costs (per seed, the sum of its runs' whole trainings) beside one adaptive run."""
    print("to target, medians over seeds: " + "; ".join(
        f"{k} {med([tta(r, target, 'samples') for r in v]):.0f} samples, "
        f"{med([tta(r, target, 'it') for r in v]):.0f} steps" for k, v in by.items()))
    fixed = [k for k in by if k.startswith("fixed-")]
    n = len(by[fixed[0]])
    grid_med = [statistics.median(tt[k][i] for k in fixed) for i in range(n)]
    grid_cost = [sum(by[k][i]["train_s"] for k in fixed) for i in range(n)]
    out["grid_cost"] = med(grid_cost)
    print(f"  the grid: {len(fixed)} fixed runs per seed, {out['grid_cost']:.0f} s of training per seed (median)")
    for k in (k for k in (*POLICIES, *VARIANTS) if k in by):
        rb = boot_ratio(tt[k], tt[out["best"]], rng)
        rg = boot_ratio(tt[k], grid_med, rng)
        cost = med([r["train_s"] for r in by[k]])
        out.setdefault("regret", {})[k] = {"best": rb, "grid_median": rg, "cost": cost}
        print(f"  {k}: regret vs best fixed ({out['best']}) {rb[0]:.3f} [{rb[1]:.3f},{rb[2]:.3f}]; vs the median "
              f"grid point {rg[0]:.3f} [{rg[1]:.3f},{rg[2]:.3f}] ({verdict(rg[1], rg[2])}); one run {cost:.0f} s "
              f"= {cost / out['grid_cost']:.3f} of the grid")


def phase_split(by: dict, target: float, out: dict) -> None:
    """Each policy's time to target less the best fixed B's, per seed, split into phases at equal samples
    (bench/common/phases.py): medians over the seeds where both reached the target, seconds and the share of the
    best fixed B's time."""
    best = by[out["best"]]
    print(f"  where the time goes, against {out['best']} at equal samples (seconds lost; positive: lost; start = "
          f"before the first move, climb = until B reaches {phases.CLIMB_END:g} of its value at the target, "
          "samples = more samples to the target, other = time outside iterations):")
    for k in (k for k in (*POLICIES, *VARIANTS) if k in by):
        per: dict[str, list[float]] = {t: [] for t in phases.TERMS}
        tf_all = []
        for a, f in zip(by[k], best):
            ta, tf = tta(a, target), tta(f, target)
            if not (math.isfinite(ta) and math.isfinite(tf) and a["rows"] and f["rows"]):
                continue
            got = phases.split(a["rows"], ta, tta(a, target, "samples"), f["rows"], tf, tta(f, target, "samples"))
            for t in phases.TERMS:
                per[t].append(got[t])
            tf_all.append(tf)
        if not tf_all:
            print(f"    {k}: no seed where both reached the target")
            continue
        m = {t: med(v) for t, v in per.items()}
        out.setdefault("phases", {})[k] = {**m, "best_s": med(tf_all), "seeds": len(tf_all)}
        print(f"    {k} ({len(tf_all)} seeds; {out['best']} {med(tf_all):.1f} s): " + ", ".join(
            f"{t} {m[t]:+.1f} s ({m[t] / med(tf_all):+.0%})" for t in phases.TERMS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, 1 seed, fewer runs")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per run (default 5; 1 with --quick)")
    ap.add_argument("--image", action="store_true",
                    help="only the image section: the ResNet example on JPEG files, compute-bound, the full protocol")
    ap.add_argument("--lm", action="store_true",
                    help="only the language-model section: the tiny transformer example with AdamW, the full protocol")
    ap.add_argument("--untuned", action="store_true",
                    help="only the untuned section: a 1-D conv net with Adam, added after the defaults were frozen")
    ap.add_argument("--untuned-cnn", action="store_true",
                    help="only the second untuned section: a 2-D conv net with Adam on the shapes images")
    ap.add_argument("--adamw", action="store_true",
                    help="only the AdamW section: goodput with and without wd_rule = linear on the shapes task")
    ap.add_argument("--fair", action="store_true",
                    help="the fair protocol (bench/common/tta_fair.py): quarter-epoch evaluations, the reference "
                         "chosen on selection seeds and scored on fresh ones, mid and plateau targets, a profile")
    ap.add_argument("--fair-tasks", default=",".join(FAIR_TASKS[:3]), metavar="LIST",
                    help=f"with --fair: the sections to run, of {','.join(FAIR_TASKS)}")
    ap.add_argument("--only", metavar="REGEX", default=None,
                    help="development aid: run only the phase-2 kinds matching REGEX (fixed-32 always runs: it sets "
                         "the target); the figures are not the protocol's")
    args = ap.parse_args()
    global ONLY, FAIR
    ONLY, FAIR = args.only, args.fair
    bad = [k for k in VARIANTS if "+" not in k or k.split("+", 1)[0] not in POLICIES]
    if bad:
        raise SystemExit(f"adaptive_tta: VARIANTS {bad}: a variant is named <policy>+<tag>, policy one of {POLICIES}")
    torch.set_num_threads(1)
    comm.init()
    rank = comm.rank()
    if comm.size() != RANKS:
        raise SystemExit(f"adaptive_tta needs {RANKS} ranks, got {comm.size()}")
    if rank == 0:
        shutil.rmtree(ROOT, ignore_errors=True)
    comm.broadcast_object(None, name="tta.rm")
    seeds = list(range(args.seeds or (1 if args.quick else 5)))
    ts = make_tasks(args.quick)
    t_start = time.perf_counter()
    if rank == 0:
        shown = ({"image": IMAGE_REGIME} if args.image else {"lm": LM_REGIME} if args.lm
                 else {"untuned": UNTUNED_REGIME} if args.untuned or args.untuned_cnn else REGIMES)
        print(f"adaptive_tta: {RANKS} emulated ranks {TYPES}; regimes "
              + "; ".join(f"{k}: t(b) = ({v['emulate_base_s'] * 1e3:g} ms + {v['emulate_per_sample_s'] * 1e3:g} ms * b)"
                          " / speed" for k, v in shown.items())
              + f"; seeds {seeds}; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    reps: dict[tuple[str, str], dict] = {}
    rng = np.random.default_rng(0)
    if args.fair:
        fair_main(fair_task_list(args.fair_tasks), args.seeds or (1 if args.quick else 5), rank, rng, args.quick)
        return
    if args.adamw:
        adamw_section(ts[0], seeds, rank, rng)
        return
    if args.image:
        image_section(seeds, rank, rng, args.quick)
        return
    if args.lm:
        lm_section(seeds, rank, rng, args.quick)
        return
    if args.untuned or args.untuned_cnn:
        untuned_section(seeds, rank, rng, args.quick, cnn=args.untuned_cnn)
        return
    for regime in REGIMES:
        for t in ts:
            if regime not in TASK_REGIMES[t.name]:
                continue
            probe = t.probe_noise and regime == "latency"       # the math is the same in both regimes: probe once
            base = [run_one(t, f"fixed-{SMALL}", s, rank, regime, probe) for s in seeds]
            target = target_of(t, base) if rank == 0 else 0.0
            target = comm.broadcast_object(target, name="tta.target")
            if rank == 0:
                print(f"  [{regime} {t.name}] target fixed before the other runs: {100 * target:.2f}%", flush=True)
            res = list(base)
            kinds = t.phase2()
            for s in seeds:
                r = s % len(kinds)
                for kind in kinds[r:] + kinds[:r]:
                    res.append(run_one(t, kind, s, rank, regime, False))
            if rank == 0:
                reps[(regime, t.name)] = report(t, regime, res, target, rng)
    if rank != 0:
        return
    print(f"\ntotal benchmark wall time {time.perf_counter() - t_start:.0f} s; load average at the end "
          f"{os.getloadavg()[0]:.1f} (1 min), {os.getloadavg()[2]:.1f} (15 min) on {os.cpu_count()} CPUs")
    main_t = ts[0].name
    growth = reps[("latency", main_t)].get("noise_growth", math.nan)
    fields, goals = [], []
    for regime in REGIMES:
        rm = reps[(regime, main_t)]
        gaps = {k: max(reps[(regime, t.name)]["gap"].get(k, nan) for t in ts if (regime, t.name) in reps)
                for k in ("similarity", "noise-scale")}
        best = rm["best"]
        for k in ("similarity", "noise-scale", "ramp", *VARIANTS):     # a kind --only left out: nan
            for d in ("ratio", "lo", "hi"):
                rm[d].setdefault(k, nan)
        for key, k in (("similarity", "similarity"), ("goodput", "noise-scale"), ("ramp", "ramp"),
                       *((variant_key(v), v) for v in VARIANTS)):
            fields.append(f"{regime}_tta_ratio_{key}={rm['ratio'][k]:.3f} "
                          f"{regime}_tta_ratio_{key}_lo={rm['lo'][k]:.3f} "
                          f"{regime}_tta_ratio_{key}_hi={rm['hi'][k]:.3f}")
            if k in VARIANTS:
                rv = rm.get("regret", {}).get(k, {}).get("best", (nan,) * 3)
                fields.append(f"{regime}_{key}_vs_best_fixed={rv[0]:.3f} {regime}_{key}_vs_best_fixed_lo={rv[1]:.3f} "
                              f"{regime}_{key}_vs_best_fixed_hi={rv[2]:.3f}")
        fields.append(f"{regime}_best_fixed_tta_ratio={rm['ratio'][best]:.3f} "
                      f"{regime}_best_fixed_tta_ratio_lo={rm['lo'][best]:.3f} "
                      f"{regime}_best_fixed_tta_ratio_hi={rm['hi'][best]:.3f}")
        fields.append(f"{regime}_acc_gap_similarity_pts={gaps['similarity']:.2f} "
                      f"{regime}_acc_gap_goodput_pts={gaps['noise-scale']:.2f} "
                      f"{regime}_best_fixed_acc_gap_pts={rm['gap'][best]:.2f} "
                      f"{regime}_fixed_meeting_both={len(rm.get('both', []))}")
        vs = rm.get("vs", {})
        g_best = vs.get(("noise-scale", best), (math.nan, math.nan, math.nan))
        g_ramp = vs.get(("noise-scale", "ramp"), (math.nan, math.nan, math.nan))
        reg = rm.get("regret", {}).get("noise-scale", {})
        rb, rg = reg.get("best", (math.nan,) * 3), reg.get("grid_median", (math.nan,) * 3)
        fields.append(f"{regime}_goodput_vs_best_fixed={rb[0]:.3f} {regime}_goodput_vs_best_fixed_lo={rb[1]:.3f} "
                      f"{regime}_goodput_vs_best_fixed_hi={rb[2]:.3f} {regime}_goodput_vs_grid_median={rg[0]:.3f} "
                      f"{regime}_grid_cost_s={rm.get('grid_cost', math.nan):.0f} "
                      f"{regime}_goodput_cost_s={reg.get('cost', math.nan):.0f}")
        ph = rm.get("phases", {}).get("noise-scale", {})
        fields.append(" ".join(f"{regime}_goodput_lost_{t}_s={ph.get(t, nan):.2f}" for t in phases.TERMS))
        goals += [(f"{regime}: goodput <= 1.10 of the best fixed B in hindsight (median)", rb[0] <= 1.10),
                  (f"{regime}: goodput <= 0.75 of fixed-32, separated", rm["ratio"]["noise-scale"] <= 0.75
                   and rm["hi"]["noise-scale"] < 1),
                  (f"{regime}: goodput <= best fixed ({best}), separated",
                   best == "noise-scale" or (g_best[0] <= 1 and g_best[2] < 1)),
                  (f"{regime}: goodput <= ramp, separated", g_ramp[0] <= 1 and g_ramp[2] < 1),
                  (f"{regime}: similarity <= 0.85 of fixed-32", rm["ratio"]["similarity"] <= 0.85),
                  (f"{regime}: accuracy within 0.5 point (similarity, goodput)",
                   gaps["similarity"] <= 0.5 and gaps["noise-scale"] <= 0.5)]
    for (regime, name), rt in sorted(reps.items()):           # the other tasks: their own line items and goal
        if name == main_t:
            continue
        key = name if sum(1 for (_, n) in reps if n == name) == 1 else f"{regime}_{name}"
        rb = rt.get("regret", {}).get("noise-scale", {}).get("best", (math.nan,) * 3)
        fields.append(f"{key}_goodput_vs_best_fixed={rb[0]:.3f} {key}_goodput_vs_best_fixed_lo={rb[1]:.3f} "
                      f"{key}_goodput_vs_best_fixed_hi={rb[2]:.3f} "
                      f"{key}_tta_ratio_goodput={rt['ratio'].get('noise-scale', nan):.3f} "
                      f"{key}_acc_gap_goodput_pts={rt['gap'].get('noise-scale', nan):.2f}")
        goals.append((f"{key}: goodput <= 1.10 of the best fixed B in hindsight (median)", rb[0] <= 1.10))
    goals.append(("noise_growth >= 3", growth >= 3))
    print("goals: " + "; ".join(f"{g}: {'MET' if ok else 'MISSED'}" for g, ok in goals))
    print(" ".join(fields) + f" noise_growth={growth:.1f}", flush=True)


def fair_task_list(text: str) -> list[str]:
    names = [t for t in text.split(",") if t]
    bad = [t for t in names if t not in FAIR_TASKS]
    if bad or not names:
        raise SystemExit(f"adaptive_tta: --fair-tasks {text!r}: a comma-separated list of {','.join(FAIR_TASKS)}")
    return names


def fair_sections(names: list[str], quick: bool) -> list[tuple[str, Task, str, tuple[float, ...]]]:
    """(label, task, regime, lr grid) of each fair section asked for."""
    ts = {t.name: t for t in make_tasks(quick)}
    epochs = 3 if quick else None
    grid = (128,) if quick else (64, 128, 256, LARGE)
    out = []
    for name in names:
        if name in ("shapes-latency", "shapes-compute"):
            out.append((name, ts["shapes"], name.split("-")[1], (ts["shapes"].lr0,)))
        elif name == "digits":
            out.append((name, ts["digits"], "latency", (ts["digits"].lr0,)))
        elif name == "lm":
            from examples.train_lm import lm_forward
            ds, vt, vl = tasks.lm_data(*((1024, 256) if quick else (tasks.LM_TRAIN, tasks.LM_TEST)))
            out.append((name, Task("lm", (None, None, vt, vl), tasks.lm_model, LM_LRS[1], epochs or LM_EPOCHS, grid,
                                   False, train_ds=ds, forward_fn=lm_forward, acc_fn=tasks.lm_accuracy,
                                   optimizer="adamw"), "lm", (LM_LRS[1],) if quick else LM_LRS))
        elif name == "untuned":
            data = tasks.seq_data(*((800, 400) if quick else (tasks.SEQ_TRAIN, tasks.SEQ_TEST)))
            out.append((name, Task("seq", data, tasks.seq_model, UNTUNED_LRS[1], epochs or UNTUNED_EPOCHS, grid,
                                   False, optimizer="adam", variants=False), "untuned",
                        (UNTUNED_LRS[1],) if quick else UNTUNED_LRS))
        elif name == "cnn":
            out.append((name, Task("shapes-cnn", tasks.shapes_data(*((1200, 500) if quick else ())),
                                   tasks.shapes_cnn_model, UNTUNED_LRS[1], epochs or 8, grid, False,
                                   optimizer="adam", variants=False), "cnn",
                        (UNTUNED_LRS[1],) if quick else UNTUNED_LRS))
        else:                                                   # image
            ds, xt, yt = tasks.image_data(JPEG_ROOT, quick)
            comm.broadcast_object(None, name="tta.image.data")
            out.append((name, Task("jpeg", (None, None, xt, yt), tasks.image_model, 0.05, epochs or IMAGE_EPOCHS, grid,
                                   False, train_ds=ds), "image", (0.05,) if quick else IMAGE_LRS))
    return out


def fair_main(names: list[str], n_seeds: int, rank: int, rng: np.random.Generator, quick: bool) -> None:
    """The fair protocol over the sections ``names``: n_seeds selection seeds (0..n-1) and as many fresh ones
    (n..2n-1); per section the lr picked on fixed-32's first selection seed where the task has an lr grid; the
    sections of bench/common/tta_fair.py; its last line."""
    import dataclasses

    from bench.common import tta_fair
    sel, fresh = list(range(n_seeds)), list(range(n_seeds, 2 * n_seeds))
    pols = ["noise-scale", "noise-scale+headroom", "noise-scale+final", *(() if quick else ("similarity", "ramp"))]
    sections: dict[str, dict] = {}
    for label, task, regime, lrs in fair_sections(names, quick):
        if len(lrs) > 1:
            pick = {lr: run_one(dataclasses.replace(task, lr0=lr), f"fixed-{SMALL}", sel[0], rank, regime, False,
                                tag=f"-lr{lr:g}")["final"] for lr in lrs}
            task = dataclasses.replace(task, lr0=max(lrs, key=lambda k: (pick[k], -k)))
            if rank == 0:
                print(f"  [fair {label}] lr grid on fixed-{SMALL}, seed {sel[0]}: " + ", ".join(
                    f"{k:g}: {100 * v:.2f}%" for k, v in pick.items()) + f"; kept {task.lr0:g}", flush=True)
        fixed = [f"fixed-{b}-{rule}" for b in task.grid for rule in ("sqrt", "linear")]

        def run(kind: str, seed: int, task=task, regime=regime) -> dict:
            return run_one(task, kind, seed, rank, regime, False)

        def bcast(obj, label=label):
            return comm.broadcast_object(obj, name=f"tta.fair.{label}")

        got = tta_fair.fair_section(label, task.epochs, fixed, pols, sel, fresh, run, bcast, rank)
        if got is not None:
            sections[label] = got
    if rank == 0:
        print(f"\nfair protocol: sections {', '.join(names)}; selection seeds {sel}, fresh seeds {fresh}; headline "
              f"policy {pols[0]} (the others with their prefix); clock: the emulated cluster's (the machine is shared)")
        print(tta_fair.last_line(sections, pols, n_seeds, rng), flush=True)


ADAMW_LRS = (0.001, 0.003, 0.01)


def adamw_section(task: Task, seeds: list[int], rank: int, rng: np.random.Generator) -> None:
    """Does ``wd_rule = "linear"`` help goodput on an AdamW task? The shapes task, latency-bound, AdamW at
    PyTorch's defaults (weight_decay 0.01) with its lr picked once from ADAMW_LRS by fixed-32's final accuracy
    on seed 0. Then fixed-32 on every seed (the target: its median at 60% of the budget, fixed first), and
    goodput at its defaults with wd_rule none and linear (weight decay x B / 32), order rotated per seed.
    Last line: adamw_tta_ratio_goodput(_lo/_hi), adamw_tta_ratio_goodput_wd(_lo/_hi) (over fixed-32),
    adamw_wd_over_none(_lo/_hi) (goodput+wd over goodput, paired), adamw_acc_gap_goodput_pts,
    adamw_acc_gap_goodput_wd_pts, adamw_lr."""
    regime = "latency"
    pick = {lr: run_one(task, f"fixed-{SMALL}", 0, rank, regime, False, adamw_lr=lr)["final"] for lr in ADAMW_LRS}
    lr = max(ADAMW_LRS, key=lambda k: (pick[k], -k))
    if rank == 0:
        print(f"  [adamw] lr grid on fixed-{SMALL}, seed 0, final accuracy: "
              + ", ".join(f"{k:g}: {100 * v:.2f}%" for k, v in pick.items()) + f"; kept {lr:g}", flush=True)
    base = [run_one(task, f"fixed-{SMALL}", s, rank, regime, False, adamw_lr=lr) for s in seeds]
    target = comm.broadcast_object(target_of(task, base) if rank == 0 else 0.0, name="tta.adamw.target")
    kinds = ["noise-scale", "noise-scale+wd"]
    res = list(base)
    for s in seeds:
        r = s % len(kinds)
        for kind in kinds[r:] + kinds[:r]:
            res.append(run_one(task, kind, s, rank, regime, False, adamw_lr=lr))
    if rank != 0:
        return
    by = {k: sorted((x for x in res if x["kind"] == k), key=lambda x: x["seed"]) for k in [f"fixed-{SMALL}", *kinds]}
    tt = {k: [tta(x, target) for x in v] for k, v in by.items()}
    base_final = statistics.median(x["final"] for x in by[f"fixed-{SMALL}"])
    print(f"\n== AdamW (lr {lr:g}, weight_decay 0.01), {regime}-bound, task {task.name}, seeds {seeds}; target "
          f"{100 * target:.2f}%")
    out = []
    for k, key in (("noise-scale", "goodput"), ("noise-scale+wd", "goodput_wd")):
        r_, lo, hi = boot_ratio(tt[k], tt[f"fixed-{SMALL}"], rng)
        accs = [100 * x["final"] for x in by[k]]
        gap = 100 * base_final - statistics.median(accs)
        print(f"{k:<16} time to target {fmt_range(tt[k])}  ratio {r_:.3f} [{lo:.3f},{hi:.3f}] {verdict(lo, hi)}; "
              f"final {statistics.median(accs):.2f}% [{min(accs):.2f},{max(accs):.2f}], gap {gap:.2f} pts; "
              f"B at epoch ends (seed 0) {_traj([e['B'] for e in by[k][0]['evals']])}")
        out.append(f"adamw_tta_ratio_{key}={r_:.3f} adamw_tta_ratio_{key}_lo={lo:.3f} "
                   f"adamw_tta_ratio_{key}_hi={hi:.3f}")
        out.append(f"adamw_acc_gap_{key}_pts={gap:.2f}")
    r_, lo, hi = boot_ratio(tt["noise-scale+wd"], tt["noise-scale"], rng)
    print(f"goodput with wd_rule=linear / without: {r_:.3f} [{lo:.3f},{hi:.3f}] -> {verdict(lo, hi)}")
    print(" ".join(out) + f" adamw_wd_over_none={r_:.3f} adamw_wd_over_none_lo={lo:.3f} "
          f"adamw_wd_over_none_hi={hi:.3f} adamw_lr={lr:g}", flush=True)


IMAGE_LRS = (0.02, 0.05, 0.1)
IMAGE_EPOCHS = 8


def image_section(seeds: list[int], rank: int, rng: np.random.Generator, quick: bool) -> None:
    """The image task: examples/train_resnet.py's ResNet-18 (BatchNorm, so one b on every rank) at width
    tta_tasks.IMAGE_WIDTH on the example's JPEG folder (10 classes x 100 files of 24 x 24 pixels, decoded,
    randomly cropped and flipped and normalised on every read, inside the clock), compute-bound (IMAGE_REGIME),
    planned on its `hpc-jabas profile --emulate` profile, lr picked from IMAGE_LRS; the protocol of grid_section.
    Last line: its keys with the prefix image_."""
    ds, xt, yt = tasks.image_data(JPEG_ROOT, quick)
    comm.broadcast_object(None, name="tta.image.data")
    grid = (128,) if quick else (64, 128, 256, LARGE)
    task = Task("jpeg", (None, None, xt, yt), tasks.image_model, 0.05, 3 if quick else IMAGE_EPOCHS, grid, False,
                train_ds=ds)
    grid_section(task, "image", seeds, rank, rng, (0.05,) if quick else IMAGE_LRS)


#: the LM's lr grid (AdamW), picked at run time; a development run (seed 0, fixed-32, 8 epochs): 0.003 42.0%,
#: 0.01 49.4%, 0.03 49.4% (0.01 kept, the target 47.6%)
LM_LRS = (0.003, 0.01, 0.03)
LM_EPOCHS = 8


def lm_section(seeds: list[int], rank: int, rng: np.random.Generator, quick: bool) -> None:
    """The language-model task: examples/train_lm.py's TinyLM at width tta_tasks.LM_WIDTH (20K parameters),
    next-token prediction on sequences in the example's format (tasks.LM_TRAIN training and tasks.LM_TEST validation
    sequences of 8-32 tokens) drawn from a Markov chain of order tasks.LM_ORDER (see there why not the example's
    order 1), AdamW (PyTorch's defaults, weight_decay 0.01 as the example's make_optimizer) with its lr picked
    from LM_LRS, the example's lm_forward as the Trainer's forward_fn (token-weighted: every update is the token
    mean of the whole batch), validation next-token accuracy (token-weighted, tasks.lm_accuracy) as the metric,
    LM_REGIME's emulated times, planned on its `hpc-jabas profile --emulate` profile; the gradient noise scale
    probed on fixed-32 (clock paused). The protocol of grid_section; its last line's keys with the prefix lm_."""
    from examples.train_lm import lm_forward
    ds, vt, vl = tasks.lm_data(*((1024, 256) if quick else (tasks.LM_TRAIN, tasks.LM_TEST)))
    task = Task("lm", (None, None, vt, vl), tasks.lm_model, LM_LRS[1], 3 if quick else LM_EPOCHS,
                (128,) if quick else (64, 128, 256, LARGE), True, train_ds=ds, forward_fn=lm_forward,
                acc_fn=tasks.lm_accuracy, optimizer="adamw")
    grid_section(task, "lm", seeds, rank, rng, (LM_LRS[1],) if quick else LM_LRS)


#: the untuned task's lr grid (Adam), picked at run time on fixed-32 as every task's
UNTUNED_LRS = (0.001, 0.003, 0.01)
UNTUNED_EPOCHS = 10


def untuned_section(seeds: list[int], rank: int, rng: np.random.Generator, quick: bool, cnn: bool = False) -> None:
    """The task the adaptive defaults were never tuned on, added and run once after they were frozen: a 1-D
    convolutional net (tasks.seq_model: two convolutions, max pooling) trained with Adam (no weight decay) on
    tasks.SEQ_TRAIN generated sequences whose class is told by the stronger of two motifs (10% label noise),
    UNTUNED_REGIME's emulated times, planned on its `hpc-jabas profile --emulate` profile (Adam's step), lr
    picked from UNTUNED_LRS, the noise scale probed on fixed-32. The protocol of grid_section with the grid and
    the three policies at their JobConfig defaults (no variants). Last line: its keys with the prefix untuned_.

    ``cnn``: the second untuned task, added after the first one's run showed its target on the plateau (fixed-32's
    accuracy at 60% of the budget within 0.15 point of its final one): the shapes images, whose fixed-32 run gains
    accuracy over its whole budget, through a 2-D convolutional net (tasks.shapes_cnn_model) with Adam, the same
    regime and lr grid, 8 epochs; its keys have the prefix cnn_."""
    if cnn:
        task = Task("shapes-cnn", tasks.shapes_data(*((1200, 500) if quick else ())), tasks.shapes_cnn_model,
                    UNTUNED_LRS[1], 3 if quick else 8, (128,) if quick else (64, 128, 256, LARGE), True,
                    optimizer="adam", variants=False)
        grid_section(task, "cnn", seeds, rank, rng, (UNTUNED_LRS[1],) if quick else UNTUNED_LRS)
        return
    data = tasks.seq_data(*((800, 400) if quick else (tasks.SEQ_TRAIN, tasks.SEQ_TEST)))
    task = Task("seq", data, tasks.seq_model, UNTUNED_LRS[1], 3 if quick else UNTUNED_EPOCHS,
                (128,) if quick else (64, 128, 256, LARGE), True, optimizer="adam", variants=False)
    grid_section(task, "untuned", seeds, rank, rng, (UNTUNED_LRS[1],) if quick else UNTUNED_LRS)


def grid_section(task: Task, regime: str, seeds: list[int], rank: int, rng: np.random.Generator,
                 lrs: tuple[float, ...]) -> None:
    """The main protocol on one task in one regime: fixed-32 with its lr picked once from ``lrs`` by final
    accuracy on the first seed (that run is the seed's fixed-32), the target fixed from fixed-32 before any other
    run, then the fixed grid with both lr rules, the policies at their defaults and the variants, order rotated per
    seed; report()'s table. Last line (prefix p = regime): {p}_tta_ratio_{similarity,goodput,ramp} and each
    variant's {p}_tta_ratio_<variant_key> (each _lo/_hi), {p}_best_fixed_tta_ratio (_lo/_hi),
    {p}_goodput_vs_best_fixed and each variant's {p}_<variant_key>_vs_best_fixed (_lo/_hi),
    {p}_acc_gap_similarity_pts, {p}_acc_gap_goodput_pts, {p}_lr, {p}_real_share_max (the largest share over the
    runs of a rank's compute time that its real CPU compute took, the rest the emulator's sleep: well below 1, the
    clock is the emulated cluster's, not this host's), {p}_overruns (micro-batches whose real compute overran the
    emulated time), and {p}_noise_growth where the task probes its noise scale."""
    import dataclasses
    probe = task.probe_noise
    pick = {lr: run_one(dataclasses.replace(task, lr0=lr), f"fixed-{SMALL}", seeds[0], rank, regime, probe,
                        tag=f"-lr{lr:g}" if len(lrs) > 1 else "") for lr in lrs}
    lr = max(lrs, key=lambda k: (pick[k]["final"], -k))
    task = dataclasses.replace(task, lr0=lr)
    if rank == 0:
        print(f"  [{regime}] lr grid on fixed-{SMALL}, seed {seeds[0]}, final accuracy: "
              + ", ".join(f"{k:g}: {100 * v['final']:.2f}%" for k, v in pick.items()) + f"; kept {lr:g}", flush=True)
    base = [pick[lr]] + [run_one(task, f"fixed-{SMALL}", s, rank, regime, probe) for s in seeds[1:]]
    target = comm.broadcast_object(target_of(task, base) if rank == 0 else 0.0, name=f"tta.{regime}.target")
    if rank == 0:
        print(f"  [{regime}] target fixed before the other runs: {100 * target:.2f}%", flush=True)
    res = list(base)
    kinds = task.phase2()
    for s in seeds:
        r = s % len(kinds)
        for kind in kinds[r:] + kinds[:r]:
            res.append(run_one(task, kind, s, rank, regime, False))
    if rank != 0:
        return
    rep = report(task, regime, res, target, rng)
    shares = [r["real_share"] for r in res if math.isfinite(r["real_share"])]
    over = sum(r["overruns"] for r in res)
    if not shares:
        raise SystemExit("adaptive_tta: no run measured its ranks' compute time (no emulator?)")
    print(f"real CPU compute / emulated compute time, the worst rank of each run: median {med(shares):.2f}, "
          f"max {max(shares):.2f} over {len(shares)} runs; micro-batches whose real compute overran the emulated "
          f"time, all ranks and runs: {over}")
    best = rep["best"]
    variants = VARIANTS if task.variants else {}
    for k in ("similarity", "noise-scale", "ramp", *variants):     # a kind --only left out: nan
        for d in ("ratio", "lo", "hi", "gap"):
            rep[d].setdefault(k, nan)
    out = [f"{regime}_tta_ratio_{key}={rep['ratio'][k]:.3f} {regime}_tta_ratio_{key}_lo={rep['lo'][k]:.3f} "
           f"{regime}_tta_ratio_{key}_hi={rep['hi'][k]:.3f}"
           for key, k in (("similarity", "similarity"), ("goodput", "noise-scale"), ("ramp", "ramp"),
                          *((variant_key(v), v) for v in variants))]
    out.append(f"{regime}_best_fixed_tta_ratio={rep['ratio'][best]:.3f} "
               f"{regime}_best_fixed_tta_ratio_lo={rep['lo'][best]:.3f} "
               f"{regime}_best_fixed_tta_ratio_hi={rep['hi'][best]:.3f}")
    for key, k in (("goodput", "noise-scale"), *((variant_key(v), v) for v in variants)):
        g = rep.get("regret", {}).get(k, {}).get("best", (nan, nan, nan))
        out.append(f"{regime}_{key}_vs_best_fixed={g[0]:.3f} {regime}_{key}_vs_best_fixed_lo={g[1]:.3f} "
                   f"{regime}_{key}_vs_best_fixed_hi={g[2]:.3f}")
    out.append(f"{regime}_best_fixed_acc_gap_pts={rep['gap'][best]:.2f} "
               f"{regime}_fixed_meeting_both={len(rep.get('both', []))}")
    out.append(f"{regime}_acc_gap_similarity_pts={rep['gap']['similarity']:.2f} "
               f"{regime}_acc_gap_goodput_pts={rep['gap']['noise-scale']:.2f} {regime}_lr={lr:g} "
               f"{regime}_real_share_max={max(shares):.2f} {regime}_overruns={over}")
    if "noise_growth" in rep:
        out.append(f"{regime}_noise_growth={rep['noise_growth']:.1f}")
    ph = rep.get("phases", {}).get("noise-scale", {})
    out.append(" ".join(f"{regime}_goodput_lost_{t}_s={ph.get(t, nan):.2f}" for t in phases.TERMS))
    print(" ".join(out), flush=True)


if __name__ == "__main__":
    main()
