"""Adaptive batching benchmark: time to accuracy under a protocol a skeptic accepts.

    .venv/bin/python bench/adaptive_tta.py            # full: 2 tasks x 8 runs x 3 seeds (6-12 min here)
    .venv/bin/python bench/adaptive_tta.py --quick    # smoke run: tiny sizes, 1 seed (< 2 min)

Cluster: 3 Horovod ranks (mpirun, re-exec'd by bench/_launch.py) EMULATING v100 / p100 / rtx2060
(emulate=True, gpu_types): every micro-batch of b samples takes (4 ms + 0.05 ms * b) / speed, a
GPU-like cost (a fixed per-call part, so small batches leave the device underused). Each task's
model is profiled once first (`hpc-jabas profile --emulate` over the 3 ranks, outside the clock);
the planner and the policies price B with that profile. The real CPU compute of these small
models is far below the emulated time, so on an idle machine the wall clock is the emulated
cluster's; a "modelled clock" (the profile's time of each iteration's plan) is printed as a
cross-check against machine load. A diagnostic row (goodput with lr_rule=sqrt instead of its default,
linear) is printed but is not in the last line or the goals.

Protocol:
- Every run of a task trains for the same number of epochs, with the same lr schedule in epochs
  (cosine from lr0 to 0.05 * lr0, stepped per epoch by the Trainer) and, within a seed, the same
  initial weights and sample order.
- Runs: fixed small B = 32 (lr0 tuned once for it, see TASKS); fixed B of a grid (64, 128, 256)
  and fixed large B = B_max = 512, each with linear lr scaling and a linear warm-up from lr0 over
  the first 2 epochs (Goyal et al.); similarity (JABAS/SimiGrad) and noise-scale (the goodput
  policy), both from B = 32 in [32, 512] with the JobConfig DEFAULTS (gamma, alpha, lr rule, ...)
  except p, set once per task to ~1/10 of an epoch's iterations at B = 32 and the same for both.
- 3 seeds; the order of the runs rotates from seed to seed.
- Evaluation (test accuracy) at every epoch end, with the clock PAUSED on every rank (rank 0
  evaluates, the others wait in the same broadcast). The clock starts before the Trainer is built
  and counts everything else: measurement iterations, decisions, re-plans, metrics.
- Target = fixed-small's mean final accuracy minus 0.5 point; time to target = the clock at the
  first evaluation at or above it. Ratios use the median over seeds.
- Main task: "shapes" (bench/tta_tasks.py; 6,000 training images, 12 epochs = 2,256 iterations
  at B = 32). Its gradient noise scale is measured on the fixed-small runs (clock paused) at the
  start and at the end of every epoch; an epoch's B_noise = mean tr(Sigma) / mean |G|^2 of its
  two probes over the seeds, and noise_growth = last epoch's / first epoch's.
- Second task: scikit-learn's digits (accuracy gaps only).

Last line: tta_ratio_similarity= tta_ratio_noise_scale= best_fixed_tta_ratio= acc_gap_similarity_pts=
acc_gap_noise_scale_pts= noise_growth= (ratios: main task, median time to target over fixed-small's;
gaps: fixed-small mean final accuracy minus the policy's, points, the worse of the two tasks).
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _launch import ROOT as REPO  # noqa: E402
from _launch import ensure_ranks  # noqa: E402

RANKS = 3
TYPES = ["v100", "p100", "rtx2060"]
EMU = dict(emulate_base_s=0.004, emulate_per_sample_s=0.00005)
PROFILES = Path("/tmp/hj-bench-tta-profiles")
BUNDLES = {"shapes": "tta_tasks:shapes_bundle", "digits": "tta_tasks:digits_bundle"}


def profile_cluster() -> None:
    """Before the MPI world starts: `hpc-jabas profile --emulate` of each task's model on the 3 emulated
    ranks (as a user profiles once per model and cluster): the emulated compute formula, the optimizer
    step and the allreduce measured over Horovod here. Outside the benchmark clock. On failure the
    runs plan with the built-in emulated model (a 100 MB, ResNet-50-sized allreduce), and say so."""
    shutil.rmtree(PROFILES, ignore_errors=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMPI_MCA_mpi_yield_when_idle="1",
               PYTHONPATH=os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]))
    for name, bundle in BUNDLES.items():
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(RANKS), sys.executable, "-m",
               "hpc_jabas.cli", "profile", "--quiet", "--model", bundle, "--emulate", "--gpu-type", ",".join(TYPES),
               "--base-s", str(EMU["emulate_base_s"]), "--per-sample-s", str(EMU["emulate_per_sample_s"]),
               "--out", str(PROFILES / name)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(PROFILES / name, ignore_errors=True)
            print(f"adaptive_tta: profiling {bundle} FAILED (rc={r.returncode}); its runs plan with the built-in "
                  f"emulated model. {r.stderr.strip().splitlines()[-1:] }", flush=True)


if "OMPI_COMM_WORLD_SIZE" not in os.environ and "HOROVOD_RANK" not in os.environ:
    profile_cluster()
ensure_ranks(RANKS)

import torch  # noqa: E402
import tta_tasks as tasks  # noqa: E402
from torch import nn  # noqa: E402

from hpc_jabas.core.config import JobConfig  # noqa: E402
from hpc_jabas.runtime import comm  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

SMALL, LARGE = 32, 512
WARMUP_EPOCHS = 2
LR_FLOOR = 0.05
ROOT = Path("/tmp/hj-bench-tta")
ADAPTIVE = ("similarity", "noise-scale")
# Diagnostic, NOT in the last line or the goals: the goodput policy with the linear lr rule instead of
# the default (sqrt), to tell a bad choice of B from an lr that does not follow B.
# goodput with the sqrt rule (what lr_rule = "auto" gave before goodput was paired with linear scaling):
# printed for comparison, not in the last line or the goals
DIAGNOSTIC = {"ns-sqrt-lr": dict(policy="noise-scale", lr_rule="sqrt")}


@dataclass
class Task:
    name: str
    data: tuple
    model_fn: object
    lr0: float
    epochs: int
    grid: tuple[int, ...]
    probe_noise: bool
    p: int = 0
    tensors: tuple = field(default_factory=tuple)

    def __post_init__(self):
        xtr, ytr, xte, yte = self.data
        self.tensors = (torch.tensor(xtr), torch.tensor(ytr, dtype=torch.long),
                        torch.tensor(xte), torch.tensor(yte, dtype=torch.long))
        ipe = math.ceil(len(xtr) / SMALL)
        self.p = max(1, round(ipe / 10))

    @property
    def n_train(self) -> int:
        return len(self.tensors[0])

    def runs(self) -> list[str]:
        return [f"fixed-{SMALL}", *(f"fixed-{b}" for b in self.grid), f"fixed-{LARGE}", *ADAPTIVE,
                *DIAGNOSTIC]


def make_tasks(quick: bool) -> list[Task]:
    # lr0 tuned ONCE for fixed B = 32 (seed 0, same schedule; shapes: 0.02 -> 88.8%, 0.05 -> 89.5%,
    # 0.1 -> 89.5% final test accuracy, 0.05 kept); digits keeps examples/train_digits.py's 0.05.
    if quick:
        return [Task("shapes", tasks.shapes_data(n_train=1200, n_test=500), tasks.shapes_model, 0.05, 3, (128,), True),
                Task("digits", tasks.digits_data(), tasks.digits_model, 0.05, 3, (), False)]
    return [Task("shapes", tasks.shapes_data(), tasks.shapes_model, 0.05, 12, (64, 128, 256), True),
            Task("digits", tasks.digits_data(), tasks.digits_model, 0.05, 20, (64, 128, 256), False)]


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


def run_one(task: Task, kind: str, seed: int, rank: int) -> dict:
    x, y, xt, yt = task.tensors
    ds = torch.utils.data.TensorDataset(x, y)
    torch.manual_seed(1000 + seed)              # same initial weights for every run of this seed
    model = task.model_fn()
    loss_fn = nn.CrossEntropyLoss()
    cfg = dict(emulate=True, gpu_types=TYPES, planner="optimal", checkpoint=False, epochs=task.epochs, seed=seed,
               run_dir=str(ROOT / f"{task.name}-{kind}-s{seed}"), **EMU)
    if (PROFILES / task.name / "allreduce.json").exists():
        cfg["profile_dir"] = str(PROFILES / task.name)
    adaptive = kind in ADAPTIVE or kind in DIAGNOSTIC
    if adaptive:
        B = SMALL
        cfg.update(policy=kind, batch=SMALL, batch_min=SMALL, batch_max=LARGE, p=task.p)
        cfg.update(DIAGNOSTIC.get(kind, {}))
    else:
        B = int(kind.split("-")[1])
        cfg.update(batch=B)
    lr = task.lr0 * (B / SMALL if not adaptive else 1.0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if not adaptive and B != SMALL:
        goyal_warmup(opt, B, WARMUP_EPOCHS * math.ceil(task.n_train / B))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine(task.epochs))
    evals: list[dict] = []
    probes: list[tuple] = []
    clk = {"t0": 0.0, "paused": 0.0}
    holder: dict = {}
    do_probe = task.probe_noise and kind == f"fixed-{SMALL}"
    gen = torch.Generator().manual_seed(seed)

    def probe(m):
        with torch.random.fork_rng():
            return tasks.noise_scale(m, loss_fn, x, y, b_small=32, n_small=128, gen=gen)

    def eval_fn(m):
        t = time.perf_counter()
        clock = t - clk["t0"] - clk["paused"]
        out = None
        if rank == 0:
            out = (tasks.accuracy(m, xt, yt), probe(m) if do_probe else None)
        acc, pr = comm.broadcast_object(out, name="tta.eval")
        tr = holder["trainer"]
        evals.append({"clock": clock, "acc": acc, "B": tr.B, "it": tr.iteration})
        if pr is not None:
            probes.append(pr)
        clk["paused"] += time.perf_counter() - t
        return {"test_acc": acc}

    if do_probe:
        p0 = comm.broadcast_object(probe(model) if rank == 0 else None, name="tta.probe0")
        probes.append(p0)
    comm.broadcast_object(None, name="tta.sync")
    clk["t0"] = time.perf_counter()
    tr = Trainer(model, opt, ds, loss_fn, config=JobConfig(**cfg), scheduler=sched, eval_fn=eval_fn)
    holder["trainer"] = tr
    tr.fit()
    for closer in (getattr(getattr(tr, "opt", None), "remove_hooks", None),
                   getattr(getattr(tr, "metrics", None), "close", None)):
        if closer is not None:
            closer()
    iters = tr.iteration
    costs, modelled = read_iterations(Path(cfg["run_dir"]), PROFILES / task.name) if rank == 0 else ({}, [])
    if modelled:
        for e in evals:
            e["model_clock"] = sum(modelled[:e["it"]])
    res = {"task": task.name, "kind": kind, "seed": seed, "evals": evals, "probes": probes, "iterations": iters,
           "costs": costs,
           "mean_B": task.epochs * task.n_train / max(iters, 1), "final": evals[-1]["acc"],
           "train_s": evals[-1]["clock"]}
    if rank == 0:
        Bs = [e["B"] for e in evals]
        print(f"  [{task.name} seed {seed}] {kind:<12} final={100 * res['final']:.2f}% train={res['train_s']:.1f}s "
              f"iters={iters} mean_B={res['mean_B']:.0f} B@epoch_end={_traj(Bs)}", flush=True)
    return res


def read_iterations(run_dir: Path, profile_dir: Path) -> tuple[dict, list[float]]:
    """From the run's metrics.jsonl (rank 0): (costs, modelled) where costs maps (B, plan) of
    the full iterations (not the shrunk epoch tail) to (iterations, measured seconds), and modelled[i]
    is iteration i's time predicted by the profiled perf model for the plan it ran (empty when the
    file, the profile or the format is missing)."""
    import json

    from hpc_jabas.core.perfmodel import PerfModel
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
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return {}, []
    n = len(modelled)
    times = [modelled[i] for i in range(n)] if set(modelled) == set(range(n)) else []
    return {k: (len(v), sum(v)) for k, v in rows.items()}, times


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


def fmt_range(v, scale=1.0, nd=1) -> str:
    fin = [x for x in v if math.isfinite(x)]
    if len(fin) < len(v):
        miss = f" ({len(v) - len(fin)} miss)"
    else:
        miss = ""
    m = med(v)
    if not math.isfinite(m):
        return f"never{miss}"
    return f"{m * scale:.{nd}f} [{min(fin) * scale:.{nd}f},{max(v) * scale:.{nd}f}]{miss}"


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


def report(task: Task, res: list[dict]) -> dict:
    by = {k: [r for r in res if r["kind"] == k] for k in task.runs()}
    base = by[f"fixed-{SMALL}"]
    target = statistics.mean(r["final"] for r in base) - 0.005
    tt = {k: [tta(r, target) for r in v] for k, v in by.items()}
    base_tta = med(tt[f"fixed-{SMALL}"])
    base_final = statistics.mean(r["final"] for r in base)
    ratio = {k: med(v) / base_tta for k, v in tt.items()}
    ttm = {k: [tta(r, target, "model_clock") for r in v] for k, v in by.items()}
    ratio_m = {k: med(v) / med(ttm[f"fixed-{SMALL}"]) for k, v in ttm.items()}
    gap = {k: 100 * (base_final - statistics.mean(r["final"] for r in v)) for k, v in by.items()}
    n = len(base)
    print(f"\n== task {task.name}: {task.n_train} training samples, {task.epochs} epochs, "
          f"{math.ceil(task.n_train / SMALL) * task.epochs} iterations at B={SMALL}, p={task.p} for the adaptive runs, "
          f"lr0={task.lr0}, {n} seed(s); target = {100 * target:.2f}% (fixed-{SMALL} mean final "
          f"{100 * base_final:.2f}% - 0.5)")
    hdr = (f"{'run':<13} {'time to target s: med [min,max]':<34} {'ratio':>6} {'train s: med [min,max]':<24} "
           f"{'final acc %: mean [min,max]':<28} {'gap pts':>7} {'iters':>6} {'mean B':>7} {'model':>6}  "
           "B at epoch ends (seed 0)")
    print(hdr)
    print("-" * len(hdr))
    for k, v in by.items():
        accs = [100 * r["final"] for r in v]
        fa = f"{statistics.mean(accs):.2f} [{min(accs):.2f},{max(accs):.2f}]"
        r0 = min(v, key=lambda r: r["seed"])
        label = f"{k}*" if k in DIAGNOSTIC else k
        print(f"{label:<13} {fmt_range(tt[k]):<34} {ratio[k]:>6.3f} {fmt_range([r['train_s'] for r in v]):<24} "
              f"{fa:<28} {gap[k]:>7.2f} {med([r['iterations'] for r in v]):>6.0f} "
              f"{med([r['mean_B'] for r in v]):>7.0f} {ratio_m[k]:>6.3f}  {_traj([e['B'] for e in r0['evals']])}")
    for k in (*ADAPTIVE, *DIAGNOSTIC):
        for r in sorted(by[k], key=lambda r: r["seed"]):
            accs = ",".join(f"{100 * e['acc']:.1f}" for e in r["evals"])
            print(f"  {k} seed {r['seed']}: B at epoch ends {_traj([e['B'] for e in r['evals']])}; acc % {accs}")
            print(f"      {_costs_text(r['costs'])}")
    if DIAGNOSTIC:
        print("  * diagnostic, not in the last line: " + "; ".join(f"{k} = {v}" for k, v in DIAGNOSTIC.items()))
    fixed = [k for k in by if k.startswith("fixed-")]
    best = min(fixed, key=lambda k: (ratio[k], k))
    print(f"best fixed B: {best} (time-to-target ratio {ratio[best]:.3f})")
    print("  ratio: median time to target over fixed-32's, wall clock; model: the same with the modelled clock "
          "(the profiled perf model's time of each iteration's plan; no decision or measurement cost)")
    out = {"ratio": ratio, "ratio_model": ratio_m, "gap": gap, "best": best, "target": target}
    if task.probe_noise:
        traj = noise_trajectory(base, task.epochs)
        out["noise_growth"] = traj[-1] / traj[0]
        print("B_noise per epoch (fixed-32, start+end probes, seeds pooled): "
              + ", ".join(f"{b:.0f}" for b in traj) + f"; growth last/first = {out['noise_growth']:.1f}x")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, 1 seed")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per run (default 3; 1 with --quick)")
    ap.add_argument("--task", choices=("shapes", "digits"), help="run one task only (development; no last line)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    comm.init()
    rank = comm.rank()
    if comm.size() != RANKS:
        raise SystemExit(f"adaptive_tta needs {RANKS} ranks, got {comm.size()}")
    if rank == 0:
        shutil.rmtree(ROOT, ignore_errors=True)
    comm.broadcast_object(None, name="tta.rm")
    seeds = args.seeds or (1 if args.quick else 3)
    ts = [t for t in make_tasks(args.quick) if args.task in (None, t.name)]
    t_start = time.perf_counter()
    if rank == 0:
        print(f"adaptive_tta: {RANKS} emulated ranks {TYPES}, t(b) = ({EMU['emulate_base_s'] * 1e3:g} ms + "
              f"{EMU['emulate_per_sample_s'] * 1e3:g} ms * b) / speed; {seeds} seed(s); "
              f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    allres: dict[str, list[dict]] = {t.name: [] for t in ts}
    for s in range(seeds):
        for t in ts:
            kinds = t.runs()
            r = s % len(kinds)
            for kind in kinds[r:] + kinds[:r]:
                allres[t.name].append(run_one(t, kind, s, rank))
    if rank != 0:
        return
    reps = {t.name: report(t, allres[t.name]) for t in ts}
    if args.task:
        return
    main_t = ts[0].name
    rm = reps[main_t]
    gaps = {k: max(reps[t]["gap"][k] for t in reps) for k in ADAPTIVE}
    rs, rn = rm["ratio"]["similarity"], rm["ratio"]["noise-scale"]
    best = rm["ratio"][rm["best"]]
    print(f"\ntotal benchmark wall time {time.perf_counter() - t_start:.0f} s; load average at the end "
          f"{os.getloadavg()[0]:.1f} (1 min), {os.getloadavg()[2]:.1f} (15 min) on {os.cpu_count()} CPUs")
    goals = [("tta_ratio_similarity <= 0.75", rs <= 0.75), ("tta_ratio_noise_scale <= 0.75", rn <= 0.75),
             ("acc_gap_similarity_pts <= 0.5", gaps["similarity"] <= 0.5),
             ("acc_gap_noise_scale_pts <= 0.5", gaps["noise-scale"] <= 0.5),
             (f"tta_ratio_noise_scale <= best_fixed_tta_ratio ({rm['best']})", rn <= best),
             ("noise_growth >= 3", rm["noise_growth"] >= 3)]
    rmm = rm["ratio_model"]
    best_m = min(rmm[k] for k in rmm if k.startswith("fixed-"))
    print(f"cross-check, modelled clock: tta_ratio_similarity={rmm['similarity']:.3f} "
          f"tta_ratio_noise_scale={rmm['noise-scale']:.3f} best_fixed_tta_ratio={best_m:.3f}")
    print("goals: " + "; ".join(f"{g}: {'MET' if ok else 'MISSED'}" for g, ok in goals))
    print(f"tta_ratio_similarity={rs:.3f} tta_ratio_noise_scale={rn:.3f} best_fixed_tta_ratio={best:.3f} "
          f"acc_gap_similarity_pts={gaps['similarity']:.2f} acc_gap_noise_scale_pts={gaps['noise-scale']:.2f} "
          f"noise_growth={rm['noise_growth']:.1f}", flush=True)


if __name__ == "__main__":
    main()
