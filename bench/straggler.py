"""Straggler benchmark: 3 ranks emulating speeds 1 : 0.5 : 0.25, fixed B, one process run.

What a user could do instead, side by side (order rotated every round):
  equal      plain Horovod, equal local batches B/3, one forward/backward per rank;
  lbbsp      plain Horovod, LB-BSP: local batch in proportion to the (declared) speeds, one
             forward/backward per rank, the loss scaled by R * x_i / B so Horovod's average is the
             exact big-batch mean (about three lines of user code);
  fastest    the fastest GPU alone: rank 0 runs all of B (micro-batches of its memory cap if B does
             not fit), the others idle;
  lbbsp_real LB-BSP as its paper runs it on GPUs (bench/common/lbbsp.py), by hand on plain Horovod, knowing no
             speed: it starts from the equal split; every iteration each rank reports its measured compute
             time (one small allgather), and the local batches move toward the split in proportion to the
             measured speeds x_i / t_i, the step halved whenever a rank's batch reverses direction; a local
             batch over the memory cap runs as accumulated micro-batches of at most cap (so it runs in mem_cap);
  hpc_jabas_reactive  the Trainer knowing no speed either (every rank declared alike) with balance = reactive
             at its defaults (p_balance = 10, threshold 0.05): it re-plans from the measured speeds;
  hpc_jabas  the Trainer with the exact planner (plan_batch(per_rank=True): each rank its own
             micro-batch size; speeds declared as speed factors) on the case's measured profile
             (`hpc-jabas profile --emulate` before the MPI world starts, its memory cap as --b-limit);
             --identical-b plans with one micro-batch size for all ranks (IIDP's rule) instead.
The ideal is the fluid optimum: B / T*, T* the smallest makespan at which the ranks, each at its
best allowed micro-batch size (at most its memory cap; fractional micro-batch counts allowed) and
with no communication, hold B. No run can beat it: in time T a rank processes at most one call of
(T s - c) / p samples, or calls of at most cap samples at the rate cap / t(cap) (b / t(b) grows with
b), and integer counts and an allreduce only cost more.

Cases: main (t = (0.2 ms + 0.5 ms x) / speed, B = 512, no memory cap that binds), per_call
(t = (5 ms + 0.1 ms x) / speed: a per-call cost makes the speed-proportional split uneven, the
exact planner should be ahead), mem_cap (every rank's cap is 64 samples: plain LB-BSP and plain
equal split cannot run at all; fastest runs with accumulation). Throughput = B * iterations / wall
time of the whole loop (data slicing, step, synchronisation), after a barrier, on rank 0.
Emulated GPUs on a shared 2-core machine: the figures carry that machine's noise.

The two measuring sides (lbbsp_real, hpc_jabas_reactive) get MEASURE_WARM warm-up iterations before the clock
starts, to converge; the others WARM. The timed window is the steady state of each.

Last line (medians over rounds, main case): speedup_vs_equal_split= speedup_vs_lbbsp_plain=
speedup_vs_lbbsp_measured= speedup_vs_fastest= ideal_fraction= reactive_vs_lbbsp_measured= reactive_ideal_fraction=
(+ per_call_* and mem_cap_*); the line before: min/max.
"""
import argparse
import shutil
import statistics
import time
from pathlib import Path

from bench.common.launch import ensure_ranks, in_mpi_world, load_note, profile_emulated
from bench.common.lbbsp import LBBSP

# case -> (B, base_s, per_sample_s, cap)
CASES = {"main": (512, 0.0002, 0.0005, 512), "per_call": (512, 0.005, 0.0001, 512),
         "mem_cap": (512, 0.0002, 0.0005, 64)}
PROFILES = Path("/tmp/hj-bench-straggler-profiles")


def profile_cases() -> None:
    """Before the MPI world starts: `hpc-jabas profile --emulate` of the model on the 3 ranks for each case (its
    emulated cost, its memory cap as --b-limit, the allreduce over Horovod), as a user profiles once. hpc-jabas's
    sides plan with these measured profiles, not with the emulator's formula. A failure stops the benchmark."""
    shutil.rmtree(PROFILES, ignore_errors=True)
    for case, (_, base, per, cap) in CASES.items():
        bl = ",".join(str(b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b <= cap)
        profile_emulated(f"case {case}", "bench.common.straggler_model:bundle", ["v100"] * 3, base, per,
                         PROFILES / case, "--b-list", bl, "--b-limit", str(cap))


if not in_mpi_world():
    profile_cases()
ensure_ranks(3)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from bench.common import straggler_model  # noqa: E402
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.core.perf.perfmodel import PerfModel  # noqa: E402
from hpc_jabas.core.planning import plan_batch, split_proportional  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.emulate import Emulator  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--iters", type=int, default=8)
ap.add_argument("--identical-b", action="store_true", help="plan with one micro-batch size for all ranks (IIDP)")
args = ap.parse_args()
PER_RANK = not args.identical_b

SPEEDS = [1.0, 0.5, 0.25]
R = 3
WARM = 3
MEASURE_WARM = 30
torch.set_num_threads(1)
comm.init()
rank = comm.rank()
torch.manual_seed(0)
X = torch.randn(8192, 32)
y = (X[:, :4].sum(1) > 0).long()
ds = torch.utils.data.TensorDataset(X, y)
quiet = lambda m: None  # noqa: E731
loss_fn = nn.CrossEntropyLoss()


model = straggler_model.model


def t_of(b, base, per, s):
    return (base + per * b) / s


def perf_model(case):
    """The case's measured profile (profile_cases): one type, the three ranks differ by declared speed factors."""
    return PerfModel.load(PROFILES / case)


def timed_loop(step, B, warm=WARM):
    """B * iterations / wall time of the whole loop on rank 0, after warm-up and a barrier."""
    for it in range(warm):
        step(it)
    comm.allgather_object(None, name="t0")
    t0 = time.perf_counter()
    for it in range(warm, warm + args.iters):
        step(it)
    comm.allgather_object(None, name="t1")
    return B * args.iters / (time.perf_counter() - t0)


def plain(case, local):
    """Plain Horovod, one forward/backward per rank of local[rank] samples, loss scaled to the big-batch mean."""
    B, base, per, cap = CASES[case]
    if max(local) > cap:
        return None                                  # it does not fit in memory: it cannot run at all
    m = model()
    opt = comm.distributed_optimizer(torch.optim.SGD(m.parameters(), lr=0.01), m.named_parameters())
    comm.broadcast_parameters(m.state_dict())
    emu = Emulator("v100", speed=SPEEDS[rank], base_s=base, per_sample_s=per, rank=rank, log=quiet)
    off, x = sum(local[:rank]), local[rank]

    def step(it):
        start = (it * B) % (len(ds) - B)
        t0 = time.perf_counter()
        opt.zero_grad()
        if x > 0:
            (loss_fn(m(X[start + off:start + off + x]), y[start + off:start + off + x]) * (R * x / B)).backward()
            emu.wait_until(t0, x)
        opt.step()
    return timed_loop(step, B)


def lbbsp_real(case):
    """LB-BSP on measured times (bench/common/lbbsp.py): equal start, a re-split toward x_i / t_i after every iteration,
    the step halved on a reversal; micro-batches of at most cap accumulated (so no headroom rule binds);
    gradients summed by hand after the backward, since the number of micro-batches changes."""
    B, base, per, cap = CASES[case]
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    comm.broadcast_parameters(m.state_dict())
    emu = Emulator("v100", speed=SPEEDS[rank], base_s=base, per_sample_s=per, rank=rank, log=quiet)
    lb = LBBSP(B, R)
    params = list(m.parameters())

    def step(it):
        x = lb.x
        start = (it * B) % (len(ds) - B)
        o, left = start + sum(x[:rank]), x[rank]
        opt.zero_grad()
        t0 = time.perf_counter()
        emu.start()
        while left > 0:
            b = min(cap, left)
            (loss_fn(m(X[o:o + b]), y[o:o + b]) * (b / B)).backward()
            emu.wait_next(b)
            o, left = o + b, left - b
        tc = time.perf_counter() - t0
        hs = [comm.allreduce_sum_async_(p.grad if p.grad is not None else torch.zeros_like(p), name=f"lb.g{i}")
              for i, p in enumerate(params)]
        for p, h in zip(params, hs):
            p.grad = comm.synchronize(h)
        opt.step()
        lb.update(comm.allgather_object(tc, name="lb.t"))     # the monitoring: every rank's compute time
    rate = timed_loop(step, B, warm=MEASURE_WARM)
    PLANS[f"{case}/lbbsp_real"] = ",".join(map(str, lb.x)) + f" halvings={lb.halvings}"
    return rate


def fastest(case):
    """Rank 0 alone runs all of B in micro-batches of min(cap, B) (accumulated); the others idle."""
    B, base, per, cap = CASES[case]
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    emu = Emulator("v100", speed=SPEEDS[0], base_s=base, per_sample_s=per, rank=rank, log=quiet)
    bs = [min(cap, B - k) for k in range(0, B, cap)]

    def step(it):
        if rank != 0:
            return
        start = (it * B) % (len(ds) - B)
        opt.zero_grad()
        emu.start()
        o = start
        for b in bs:
            (loss_fn(m(X[o:o + b]), y[o:o + b]) * (b / B)).backward()
            emu.wait_next(b)
            o += b
        opt.step()
    return timed_loop(step, B)


PLANS = {}


def hpc_jabas(case):
    B, base, per, cap = CASES[case]
    pm = perf_model(case)
    types = ["v100"] * R

    def planner(Bq, factors=None):
        f = [s * (factors[i] if factors else 1.0) for i, s in enumerate(SPEEDS)]
        return plan_batch(Bq, types, pm, speed_factors=f, per_rank=PER_RANK)
    m = model()
    cfg = JobConfig(batch=B, planner="optimal", emulate=True, gpu_types=types, emulate_base_s=base,
                    emulate_per_sample_s=per, checkpoint=False, run_dir=f"/tmp/hj-bench-straggler-{rank}",
                    metrics_period=100000, epochs=1000, profile_dir=str(PROFILES / case))
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01), ds, nn.CrossEntropyLoss(), config=cfg,
                 planner_fn=planner, gpu_types=types)
    tr.emulator = Emulator("v100", speed=SPEEDS[rank], base_s=base, per_sample_s=per, rank=rank, log=quiet)
    PLANS[case] = str(tr.plan)
    rate = timed_loop(lambda it: tr.train_step(), B)
    tr._pending = []
    tr.opt.remove_hooks()
    return rate


def hpc_jabas_reactive(case):
    """The Trainer told nothing of the speeds (every rank alike), balance = reactive at its defaults."""
    B, base, per, cap = CASES[case]
    pm = perf_model(case)
    types = ["v100"] * R

    def planner(Bq, factors=None):
        return plan_batch(Bq, types, pm, speed_factors=list(factors) if factors else None, per_rank=PER_RANK)
    m = model()
    cfg = JobConfig(batch=B, planner="optimal", emulate=True, gpu_types=types, emulate_base_s=base,
                    emulate_per_sample_s=per, checkpoint=False, run_dir=f"/tmp/hj-bench-straggler-r{rank}",
                    metrics_period=100000, epochs=1000, balance="reactive", profile_dir=str(PROFILES / case))
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01), ds, nn.CrossEntropyLoss(), config=cfg,
                 planner_fn=planner, gpu_types=types)
    tr.emulator = Emulator("v100", speed=SPEEDS[rank], base_s=base, per_sample_s=per, rank=rank, log=quiet)
    rate = timed_loop(lambda it: tr.train_step(), B, warm=MEASURE_WARM)
    PLANS[f"{case}/reactive"] = str(tr.plan)
    tr._pending = []
    tr.opt.remove_hooks()
    return rate


def fluid_capacity(T, base, per, s, cap):
    """Most samples a rank can process within T at its best allowed micro-batch size, fractional calls allowed."""
    if T <= t_of(0, base, per, s):
        return 0.0
    one = (T * s - base) / per                      # one call of the size that ends exactly at T
    return one if one <= cap else cap * T / t_of(cap, base, per, s)


def ideal(case):
    """B / T*, T* the smallest makespan at which the ranks' fluid capacities hold B (bisection)."""
    B, base, per, cap = CASES[case]
    lo, hi = 0.0, t_of(B, base, per, min(SPEEDS)) * B
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if sum(fluid_capacity(mid, base, per, s, cap) for s in SPEEDS) >= B else (mid, hi)
    return B / hi


SIDES = {"equal": lambda c: plain(c, [CASES[c][0] // R + (1 if i < CASES[c][0] % R else 0) for i in range(R)]),
         "lbbsp": lambda c: plain(c, split_proportional(CASES[c][0], SPEEDS)),
         "lbbsp_real": lbbsp_real, "fastest": fastest, "hpc_jabas": hpc_jabas,
         "hpc_jabas_reactive": hpc_jabas_reactive}
res = {c: {s: [] for s in SIDES} for c in CASES}
for rnd in range(args.rounds):
    names = list(SIDES)
    order = names[rnd % len(names):] + names[:rnd % len(names)]
    for case in CASES:
        for side in order:
            res[case][side].append(SIDES[side](case))
        if rank == 0:
            r = res[case]
            print(f"round {rnd} {case:<8} order={','.join(order)} " + " ".join(
                f"{s}={r[s][-1]:.0f}" if r[s][-1] is not None else f"{s}=cannot_run" for s in SIDES)
                + f" ideal={ideal(case):.0f} samples/s  plan={PLANS.get(case)} "
                f"lbbsp_real={PLANS.get(case + '/lbbsp_real')} reactive={PLANS.get(case + '/reactive')}", flush=True)


def ratios(case, den, side="hpc_jabas"):
    ours = res[case][side]
    if den == "ideal":
        return [o / ideal(case) for o in ours]
    d = res[case][den]
    if any(x is None for x in d):
        return None
    return [o / x for o, x in zip(ours, d)]       # per round: both sides of the same round


if rank == 0:
    keys = {"main": "", "per_call": "per_call_", "mem_cap": "mem_cap_"}
    last, spread = [], []
    for case, pre in keys.items():
        for side, den, name in (("hpc_jabas", "equal", "speedup_vs_equal_split"),
                                ("hpc_jabas", "lbbsp", "speedup_vs_lbbsp_plain"),
                                ("hpc_jabas", "lbbsp_real", "speedup_vs_lbbsp_measured"),
                                ("hpc_jabas", "fastest", "speedup_vs_fastest"),
                                ("hpc_jabas", "ideal", "ideal_fraction"),
                                ("hpc_jabas_reactive", "lbbsp_real", "reactive_vs_lbbsp_measured"),
                                ("hpc_jabas_reactive", "ideal", "reactive_ideal_fraction")):
            r = ratios(case, den, side)
            if r is None:
                last.append(f"{pre}{name}=cannot_run")
                continue
            last.append(f"{pre}{name}={statistics.median(r):.3f}")
            spread.append(f"{pre}{name}_min={min(r):.3f} {pre}{name}_max={max(r):.3f}")
    print(f"rounds={args.rounds} iters={args.iters} (emulated GPUs, shared machine, {load_note()}) " + " ".join(spread))
    print(" ".join(last))
