"""Interference benchmark (LB-BSP): static plan vs reactive vs predictive rebalancing, no oracle.

    .venv/bin/python -m bench.interference [--seeds 3] [--iters 400] [--hog-iters 300] [--kinds markov,hog]

3 ranks (mpirun), fixed B, the slowed rank is rank 0. Two kinds of interference, ``--seeds`` seeds each
(default 3), the order of the modes (off = static plan from the profile, reactive = last measured speed,
predictive = NARX on past speeds and past measured host signals) rotated with the seed:
  markov  emulated GPUs (v100 / p100 / rtx2060, t(b) = (1 ms + 0.5 ms b) / speed, b = 8, B = 384,
          ``--iters`` iterations, default 400); rank 0 is slowed 3x in bursts that follow a seeded two-state
          Markov chain over iterations (P(off->on) = 0.05, P(on->off) = 0.1: random durations, mean 20
          iterations off, 10 on). The factor reaches the trainer only through the time its micro-batches take.
          The job plans with a profile written by ``hpc-jabas profile --emulate`` before the MPI world starts,
          never with the emulator's formula.
  hog     real compute, no emulation (B = 192, b = 8, ``--hog-iters`` iterations, default 300): every rank
          trains a real MLP on the CPU (1 thread; rank 0 pinned to core 0, ranks 1-2 to core 1). A REAL CPU hog
          subprocess, pinned to rank 0's core, burns CPU on a seeded random on/off schedule in wall time
          (durations uniform in 0.3..2.0 s); nothing tells the trainer about it. Each rank is profiled (real
          compute, all ranks at once, hog off) and the job plans with those profiles (profile_dir).

The reference is a bound that no run can beat, computed from each run's own measurements: in every window of
P_BALANCE = 5 iterations (the rebalancer's window), rank i computed n_i samples in c_i seconds (its measured
compute time, emulated GPU time included); redistributing the window's samples with hindsight in proportion
to those measured rates n_i / c_i takes T_ref(w) = sum_i n_i / sum_i (n_i / c_i). Since
max_i c_i >= sum_i n_i / sum_i (n_i / c_i) (the mediant inequality) and the window's wall time is at least
max_i c_i, T_ref(w) never exceeds the run's own time for that window: ``hindsight_fraction`` = sum T_ref /
the loop's wall time is at most 1 for every run, and says what share of the time was balanced compute (the
rest: imbalance inside windows and across them, communication, the trainer's own work). It assumes a rank's
rate does not depend on how many samples it gets (per-call costs make small shares dearer). Beside it, the
wall-time speedups over the static plan of the same seed, and the predictive run's one-step relative error
of NARX and of the last-value baseline (``predictor_error``, ``lastvalue_error``, same windows).
This machine has 2 cores shared with other work: the figures carry that noise.

Last line, one group of keys per kind (medians over the seeds; min/max on the line before):
KIND_static_hindsight_fraction= KIND_reactive_hindsight_fraction= KIND_predictive_hindsight_fraction=
KIND_reactive_speedup= KIND_predictive_speedup= KIND_predictor_error= KIND_lastvalue_error=.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common.launch import ensure_ranks, in_mpi_world, load_note, profile_emulated

TYPES = ["v100", "p100", "rtx2060"]
BASE, PER = 0.001, 0.0005
MARKOV_PROFILE = Path("/tmp/hj-bench-interference-profile")
if not in_mpi_world():
    # the markov case plans on a measured profile, as a user profiles once (never on the emulator's formula)
    import shutil
    shutil.rmtree(MARKOV_PROFILE, ignore_errors=True)
    profile_emulated("the markov case", "bench.common.straggler_model:bundle", TYPES, BASE, PER, MARKOV_PROFILE,
                     "--b-list", "1,2,4,8,16,32")
ensure_ranks(3)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from bench.common import straggler_model  # noqa: E402
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.core.perf.perfmodel import ComputeProfile, PerfModel  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.emulate import Emulator  # noqa: E402
from hpc_jabas.runtime.profiling.compute import measure_compute  # noqa: E402
from hpc_jabas.runtime.profiling.load import check_bundle, grad_bytes  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--seeds", type=int, default=3)
ap.add_argument("--iters", type=int, default=400, help="iterations per markov run")
ap.add_argument("--hog-iters", type=int, default=300, help="iterations per hog run")
ap.add_argument("--kinds", default="markov,hog")
args = ap.parse_args()

MODES = ["off", "reactive", "predictive"]
B, b = 384, 8
P_BALANCE = 5
HOG_B = 192
torch.set_num_threads(1)
comm.init()
rank = comm.rank()
quiet = lambda m: None  # noqa: E731
NCPU = os.cpu_count() or 1


class Markov:
    """Seeded two-state chain over iterations: factor 3 while on."""

    def __init__(self, seed: int, n: int, p_on: float = 0.05, p_off: float = 0.1, factor: float = 3.0):
        rng = np.random.default_rng(seed)
        s, self.states = 0, []
        for _ in range(n + 100):
            self.states.append(s)
            s = int(rng.random() < p_on) if s == 0 else int(rng.random() >= p_off)
        self.factor = factor

    def at(self, it: int) -> float:
        return self.factor if self.states[min(it, len(self.states) - 1)] else 1.0

    def __str__(self) -> str:
        return f"markov on/off x{self.factor:g} ({sum(self.states)} of {len(self.states)} iterations on)"


def finish(tr):
    tr._pending = []
    tr.opt.remove_hooks()
    rep = tr.controller.predictors.error_report() if tr.controller and tr.controller.predictors else {}
    return rep


def timed(tr, n):
    """n iterations; returns the loop's wall time, the iteration start marks, and every rank's (samples,
    compute seconds) per iteration (gathered to every rank after the loop: nothing extra inside it)."""
    comm.allgather_object(None, name="if.t0")
    t0 = time.perf_counter()
    marks, mine = [], []
    for _ in range(n):
        marks.append(time.monotonic())
        rec = tr.train_step()
        mine.append((int(rec["x"]), float(rec["compute_s"])))
    marks.append(time.monotonic())
    comm.allgather_object(None, name="if.t1")
    wall = time.perf_counter() - t0
    return wall, marks, comm.allgather_object(mine, name="if.work")


def hindsight_s(work, window=None):
    """Sum over windows of sum_i n_i / sum_i (n_i / c_i): each window's samples redistributed with hindsight in
    proportion to the rates the ranks measured in it (module docstring). ``work[rank][it] = (n, c)``."""
    w = window or P_BALANCE
    total = 0.0
    for a in range(0, len(work[0]), w):
        n = [sum(x for x, _ in r[a:a + w]) for r in work]
        c = [sum(t for _, t in r[a:a + w]) for r in work]
        rates = sum(ni / ci for ni, ci in zip(n, c) if ni > 0 and ci > 0)
        if rates > 0:
            total += sum(n) / rates
    return total


# ---- markov (emulated) ------------------------------------------------------------------------
def run_markov(mode, seed):
    torch.manual_seed(1)
    N = args.iters
    X = torch.randn(B * 4, 32)
    ds = torch.utils.data.TensorDataset(X, (X[:, :4].sum(1) > 0).long())
    m = straggler_model.model()
    cfg = JobConfig(batch=B, micro_batch=b, planner="optimal", emulate=True, gpu_types=TYPES, emulate_base_s=BASE,
                    emulate_per_sample_s=PER, balance=mode, p_balance=P_BALANCE, checkpoint=False,
                    profile_dir=str(MARKOV_PROFILE),
                    run_dir=f"/tmp/hj-bench-interference-{rank}/{mode}", epochs=10 ** 6, metrics_period=10 ** 6)
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01), ds, nn.CrossEntropyLoss(), config=cfg)
    mk = Markov(seed, N)
    tr.emulator = Emulator(TYPES[rank], base_s=BASE, per_sample_s=PER, slowdown=mk if rank == 0 else None,
                           rank=rank, log=quiet)
    wall, _, work = timed(tr, N)
    err = finish(tr)
    return wall, hindsight_s(work), err


# ---- hog (real compute) -----------------------------------------------------------------------
HOG = r"""
import json, os, sys, time
sched, log = json.loads(sys.argv[1]), sys.argv[2]
os.sched_setaffinity(0, {int(sys.argv[3])})
with open(log, "w") as f:
    for on, off in sched:
        f.write(f"on {time.monotonic()}\n"); f.flush()
        end = time.monotonic() + on
        x = 0
        while time.monotonic() < end:
            for _ in range(2000):
                x += 1
        f.write(f"off {time.monotonic()}\n"); f.flush()
        time.sleep(off)
"""


def hog_start(sched, log):
    return subprocess.Popen([sys.executable, "-c", HOG, json.dumps(sched), log, "0"])


def hog_intervals(log):
    ev = [ln.split() for ln in Path(log).read_text().splitlines() if ln.strip()]
    out, t_on = [], None
    for kind, t in ev:
        if kind == "on":
            t_on = float(t)
        elif t_on is not None:
            out.append((t_on, float(t)))
            t_on = None
    if t_on is not None:
        out.append((t_on, float("inf")))
    return out


def real_bundle():
    from bench.common.realmodel import dataset, make_model
    m = make_model()
    ds = dataset()
    return m, nn.CrossEntropyLoss(), (ds.tensors[0][:256], ds.tensors[1][:256]), ds


HOG_STATE = {}


def hog_setup():
    """Pin, profile every rank (hog off), then rank 0 again with the hog on. Saved as the job's profiles."""
    os.sched_setaffinity(0, {0} if rank == 0 else {min(1, NCPU - 1)})
    m, loss, sample, _ = real_bundle()
    off = measure_compute(check_bundle((m, loss, sample)), [4, 8, 16], warmup=3, repeats=15)
    log = tempfile.mktemp(prefix="hj-hog-cal-")
    p = hog_start([[30.0, 0.0]], log) if rank == 0 else None
    time.sleep(0.3)
    on = measure_compute(check_bundle(real_bundle()[:3]), [b], warmup=3, repeats=15)
    if p is not None:
        p.kill()
        p.wait()
        os.unlink(log)
    every = comm.allgather_object((off.b, off.t, off.update_s, on.t[0]), name="if.prof")
    d = tempfile.mkdtemp(prefix="hj-hog-prof-") if rank == 0 else None
    d = comm.broadcast_object(d, name="if.dir")
    if rank == 0:
        profs = {TYPES[i]: ComputeProfile(gpu=TYPES[i], b=e[0], t=e[1], update_s=e[2], max_b=1024, emulated=False,
                                          source=f"measured: real CPU compute of rank {i}")
                 for i, e in enumerate(every)}
        PerfModel(profs, grad_bytes=grad_bytes(m)).save(d)
    comm.allgather_object(None, name="if.saved")
    k = every[0][0].index(b)
    HOG_STATE.update(dir=d, t_off=[e[1][k] for e in every], t0_on=every[0][3])
    if rank == 0:
        print(f"hog profile (ms at b={b}): off={[round(t * 1e3, 3) for t in HOG_STATE['t_off']]} "
              f"rank0 with hog on={HOG_STATE['t0_on'] * 1e3:.3f}", flush=True)


def run_hog(mode, seed):
    if not HOG_STATE:
        hog_setup()
    N = args.hog_iters
    m, _, _, ds = real_bundle()
    cfg = JobConfig(batch=HOG_B, micro_batch=b, planner="optimal", gpu_types=TYPES, profile_dir=HOG_STATE["dir"],
                    balance=mode, p_balance=P_BALANCE, checkpoint=False, run_dir=f"/tmp/hj-bench-hog-{rank}/{mode}",
                    epochs=10 ** 6, metrics_period=10 ** 6)
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01), ds, nn.CrossEntropyLoss(), config=cfg)
    rng = np.random.default_rng(1000 + seed)
    sched = [[float(rng.uniform(0.3, 2.0)), float(rng.uniform(0.3, 2.0))] for _ in range(200)]
    if rng.random() < 0.5:
        sched[0][0] = 0.0                     # starts off half of the time
    log = tempfile.mktemp(prefix="hj-hog-")
    comm.allgather_object(None, name="if.hog")
    p = hog_start(sched, log) if rank == 0 else None
    wall, marks, work = timed(tr, N)
    err = finish(tr)
    if rank == 0:
        p.kill()
        p.wait()
        m0, m1 = marks[0], marks[-1]
        on = sum(max(0.0, min(z, m1) - max(a, m0)) for a, z in hog_intervals(log))
        os.unlink(log)
        print(f"  hog on {on:.1f} s of the {m1 - m0:.1f} s loop", flush=True)
    return wall, hindsight_s(work), err


RUN = {"markov": run_markov, "hog": run_hog}
kinds = args.kinds.split(",")
bad = [k for k in kinds if k not in RUN]
if bad or args.seeds < 1 or args.iters < P_BALANCE or args.hog_iters < P_BALANCE:
    if rank == 0:
        print(f"interference: --kinds {args.kinds!r} (valid: markov, hog), --seeds >= 1 and --iters/--hog-iters "
              f">= {P_BALANCE} are needed", file=sys.stderr)
    sys.exit(2)
walls = {k: {m: [] for m in MODES} for k in kinds}
fracs = {k: {m: [] for m in MODES} for k in kinds}
errs = {k: [] for k in kinds}
for seed in range(args.seeds):
    order = MODES[seed % 3:] + MODES[:seed % 3]
    for kind in kinds:
        for mode in order:
            wall, ref, err = RUN[kind](mode, seed)
            walls[kind][mode].append(wall)
            fracs[kind][mode].append(ref / wall)
            if ref > wall * (1 + 1e-9):
                raise SystemExit(f"interference: {kind} {mode} seed {seed}: the hindsight time {ref:.3f} s exceeds "
                                 f"the run's {wall:.3f} s, which the bound rules out (a bug)")
            if mode == "predictive":
                errs[kind].append((err.get("predictor_error", float("nan")), err.get("lastvalue_error", float("nan"))))
            if rank == 0:
                e = f" predictor_error={err['predictor_error']:.3f} lastvalue_error={err['lastvalue_error']:.3f}" \
                    if mode == "predictive" else ""
                print(f"seed {seed} {kind:<6} {mode:<10} wall={wall:.2f}s hindsight={ref:.2f}s "
                      f"hindsight_fraction={ref / wall:.3f}{e}", flush=True)
if rank == 0:
    names = {"off": "static", "reactive": "reactive", "predictive": "predictive"}
    last, spread = [], []

    def add(key, vals):
        last.append(f"{key}={statistics.median(vals):.3f}")
        spread.append(f"{key}_min={min(vals):.3f} {key}_max={max(vals):.3f}")
    for k in kinds:
        for mode in MODES:
            add(f"{k}_{names[mode]}_hindsight_fraction", fracs[k][mode])
        for mode in ("reactive", "predictive"):     # paired by seed: the static run of the same seed
            add(f"{k}_{mode}_speedup", [s / w for s, w in zip(walls[k]["off"], walls[k][mode])])
        add(f"{k}_predictor_error", [e[0] for e in errs[k]])
        add(f"{k}_lastvalue_error", [e[1] for e in errs[k]])
    print(f"seeds={args.seeds} iters={args.iters} hog_iters={args.hog_iters} (markov: emulated, planned on a "
          f"measured profile; hog: real compute + real CPU hog; shared machine, {load_note()}) " + " ".join(spread))
    print(" ".join(last))
