"""Interference benchmark (LB-BSP): static plan vs reactive vs predictive rebalancing, no oracle.

3 ranks (mpirun), fixed B, the slowed rank is rank 0. Two kinds of interference, 3 seeds each, the
order of the modes (off = static plan from the profile, reactive = last measured speed, predictive =
NARX on past speeds and past measured host signals) rotated with the seed:
  markov  emulated GPUs (v100 / p100 / rtx2060, t(b) = (1 ms + 0.5 ms b) / speed, b = 8, B = 384);
          rank 0 is slowed 3x in bursts that follow a seeded two-state Markov chain over iterations
          (P(off->on) = 0.05, P(on->off) = 0.1: random durations, mean 20 iterations off, 10 on). The
          factor reaches the trainer only through the time its micro-batches take.
  hog     real compute, no emulation: every rank trains a real MLP on the CPU (1 thread; rank 0
          pinned to core 0, ranks 1-2 to core 1). A REAL CPU hog subprocess, pinned to rank 0's core,
          burns CPU on a seeded random on/off schedule in wall time (durations uniform in
          0.3..2.0 s); nothing tells the trainer about it. Each rank is profiled (real compute, all
          ranks at once, hog off) and the job plans with those profiles (profile_dir).
The ideal is the fluid optimum under the true speeds at each iteration, no communication:
T_ideal(it) = B / sum_i v_i(it), v_i = b / t_i(b). markov: t_i from the emulation formula and the
chain's state. hog: t_i measured (the profile; rank 0 also profiled with the hog on), rank 0's rate
weighted by the share of the iteration the hog was on (from the hog's own log, read afterwards).
ideal_fraction = sum T_ideal / measured wall time of the whole loop. (hog: the rates are
measurements, so a lucky run could come out slightly above 1.) predictor_error / lastvalue_error:
the predictive run's one-step relative error of NARX and of the last-value baseline, same windows.
This machine has 2 cores shared with other work: the figures carry that noise.

Last line (medians over seeds, both kinds pooled per key): static_ideal_fraction= reactive_ideal_fraction=
predictive_ideal_fraction= predictor_error= lastvalue_error= (+ per-kind keys); the line before: min/max.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _launch import ensure_ranks, load_note  # noqa: E402

ensure_ranks(3)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hpc_jabas.core import gpus  # noqa: E402
from hpc_jabas.core.config import JobConfig  # noqa: E402
from hpc_jabas.core.perfmodel import ComputeProfile, PerfModel  # noqa: E402
from hpc_jabas.runtime import comm  # noqa: E402
from hpc_jabas.runtime.emulate import Emulator  # noqa: E402
from hpc_jabas.runtime.profiling.compute import measure_compute  # noqa: E402
from hpc_jabas.runtime.profiling.load import check_bundle, grad_bytes  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--seeds", type=int, default=3)
ap.add_argument("--iters", type=int, default=240, help="iterations per markov run")
ap.add_argument("--hog-iters", type=int, default=200, help="iterations per hog run")
ap.add_argument("--kinds", default="markov,hog")
args = ap.parse_args()

TYPES = ["v100", "p100", "rtx2060"]
MODES = ["off", "reactive", "predictive"]
B, b = 384, 8
BASE, PER = 0.001, 0.0005
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
    comm.allgather_object(None, name="if.t0")
    t0 = time.perf_counter()
    marks = []
    for _ in range(n):
        marks.append(time.monotonic())
        tr.train_step()
    marks.append(time.monotonic())
    comm.allgather_object(None, name="if.t1")
    return time.perf_counter() - t0, marks


# ---- markov (emulated) ------------------------------------------------------------------------
def run_markov(mode, seed):
    torch.manual_seed(1)
    N = args.iters
    X = torch.randn(B * 4, 16)
    ds = torch.utils.data.TensorDataset(X, (X[:, :3].sum(1) > 0).long())
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    cfg = JobConfig(batch=B, micro_batch=b, planner="optimal", emulate=True, gpu_types=TYPES, emulate_base_s=BASE,
                    emulate_per_sample_s=PER, balance=mode, p_balance=P_BALANCE, checkpoint=False,
                    run_dir=f"/tmp/hj-bench-interference-{rank}/{mode}", epochs=10 ** 6, metrics_period=10 ** 6)
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01), ds, nn.CrossEntropyLoss(), config=cfg)
    mk = Markov(seed, N)
    tr.emulator = Emulator(TYPES[rank], base_s=BASE, per_sample_s=PER, slowdown=mk if rank == 0 else None,
                           rank=rank, log=quiet)
    wall, _ = timed(tr, N)
    err = finish(tr)
    speeds = [gpus.get(t).relative_speed for t in TYPES]
    ideal = 0.0
    for it in range(N):
        t = [(BASE + PER * b) / speeds[i] * (mk.at(it) if i == 0 else 1.0) for i in range(3)]
        ideal += B / sum(b / x for x in t)
    return ideal / wall, err


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


def on_share(a, z, ivs):
    return sum(max(0.0, min(z, e) - max(a, s)) for s, e in ivs) / (z - a) if z > a else 0.0


def real_bundle():
    from _realmodel import dataset, make_model
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
    wall, marks = timed(tr, N)
    err = finish(tr)
    ideal = 0.0
    if rank == 0:
        p.kill()
        p.wait()
        ivs = hog_intervals(log)
        os.unlink(log)
        t_off, t_on = HOG_STATE["t_off"], HOG_STATE["t0_on"]
        rest = sum(b / t for t in t_off[1:])
        for a, z in zip(marks, marks[1:]):
            f = on_share(a, z, ivs)
            ideal += HOG_B / (rest + f * b / t_on + (1 - f) * b / t_off[0])
    return comm.broadcast_object(ideal, name="if.ideal") / wall, err


RUN = {"markov": run_markov, "hog": run_hog}
kinds = args.kinds.split(",")
res = {k: {m: [] for m in MODES} for k in kinds}
errs = {k: [] for k in kinds}
for seed in range(args.seeds):
    order = MODES[seed % 3:] + MODES[:seed % 3]
    for kind in kinds:
        for mode in order:
            frac, err = RUN[kind](mode, seed)
            res[kind][mode].append(frac)
            if mode == "predictive":
                errs[kind].append((err.get("predictor_error", float("nan")), err.get("lastvalue_error", float("nan"))))
            if rank == 0:
                e = f" predictor_error={err['predictor_error']:.3f} lastvalue_error={err['lastvalue_error']:.3f}" \
                    if mode == "predictive" else ""
                print(f"seed {seed} {kind:<6} {mode:<10} ideal_fraction={frac:.3f}{e}", flush=True)
if rank == 0:
    names = {"off": "static", "reactive": "reactive", "predictive": "predictive"}
    last, spread = [], []

    def add(key, vals):
        last.append(f"{key}={statistics.median(vals):.3f}")
        spread.append(f"{key}_min={min(vals):.3f} {key}_max={max(vals):.3f}")
    for mode in MODES:
        add(f"{names[mode]}_ideal_fraction", [x for k in kinds for x in res[k][mode]])
    add("predictor_error", [e[0] for k in kinds for e in errs[k]])
    add("lastvalue_error", [e[1] for k in kinds for e in errs[k]])
    for k in kinds:
        for mode in MODES:
            add(f"{k}_{names[mode]}_ideal_fraction", res[k][mode])
        add(f"{k}_predictor_error", [e[0] for e in errs[k]])
        add(f"{k}_lastvalue_error", [e[1] for e in errs[k]])
        pr = [p / r for p, r in zip(res[k]["predictive"], res[k]["reactive"])]
        add(f"{k}_predictive_over_reactive", pr)
    print(f"seeds={args.seeds} (markov: emulated; hog: real compute + real CPU hog; shared machine, {load_note()}) "
          + " ".join(spread))
    print(" ".join(last))
