"""Perf-model error on real compute: predicted vs measured iteration time, no emulation.

For each world size R in 1, 2, 3 (one `mpirun -np R` each), CPU ranks run a real MLP
(bench/common/realmodel.py, ~8 MFLOP per sample, 1 thread per rank) through the real Trainer:
  1. profile, as `hpc-jabas profile` does on the job's own allocation: every rank times the real
     forward+backward at b in PROFILED (all ranks at once, so the measurement carries the same CPU
     sharing as the run), the profiles are pooled (median per b over the ranks), the update is
     timed, the allreduce is measured over the R ranks and fitted. -> PerfModel (overlap 0).
  2. predict: plans whose b is NOT among the profiled sizes (piecewise-linear interpolation or
     extrapolation of the profile) and whose counts n were never run, 4-5 per R, >= 12 in all;
     each plan is run for real; measured = wall time of the whole loop of ITERS iterations (after
     warm-up, between barriers) / ITERS; error = |predicted - measured| / measured.
  3. repeats: the plans of each R run REPEATS times, the order rotated every repeat.
The labelled emulated variant (circular: its profiles are the formula the emulator sleeps to) is
bench/perfmodel_error_emulated.py, a sanity check only. This machine has 2 cores shared with other
work: 3 ranks oversubscribe it, and the figures carry that noise.

  4. calibration (the issue's before/after): once per repeat, before its plans, the Trainer with
     ``calibrate=True`` on the saved profile runs CAL_ITERS iterations of CAL_PLAN (a profiled b, other
     counts); its calibrated model (runtime/calibrate.py: per-type factor and offset, the allreduce tail's
     scale) then predicts every test plan too. Both predictions are compared with the same measurement.
  5. plans: identical-b plans (PLANS) and per-rank plans (PER_RANK: one b per rank, what the optimal
     planner makes by default; worlds 2 and 3).

Last line: mean_abs_error_before=<median over repeats of the mean over all plans, the profile alone>
mean_abs_error_after=<the same, the calibrated model> max_abs_error=<median of the max, before>; the line
before: min/max over repeats, each world's and each plan kind's median error before and after.
3 ranks on a 2-core machine oversubscribe it: the profile (each micro-batch timed alone, median of
7) then catches the ranks' time slices, while a training iteration waits for the slowest rank, so
world 3 is under-predicted; the per-world figures show it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common.launch import ROOT, load_note, self_command

PROFILED = [8, 32, 128]
PLANS = {1: ["b=16 n=5", "b=48 n=3", "b=96 n=2", "b=24 n=7"],
         2: ["b=12 n=6,4", "b=64 n=2,3", "b=48 n=3,3", "b=96 n=1,2"],
         3: ["b=16 n=4,3,2", "b=24 n=3,3,3", "b=64 n=2,1,1", "b=48 n=1,2,3", "b=96 n=2,2,1"]}
#: per-rank plans (one b per rank, what the optimal planner makes by default), never profiled either
PER_RANK = {1: [],
            2: ["b=12,40 n=4,2", "b=72,20 n=1,3"],
            3: ["b=12,40,20 n=4,1,2", "b=56,24,16 n=1,2,3"]}
#: the calibration phase: the Trainer with calibrate=True runs this plan (profiled b, counts that differ from
#: the test plans' shares) for CAL_ITERS iterations, then its calibrated model predicts every test plan
CAL_PLAN = {1: "b=32 n=4", 2: "b=32 n=3,2", 3: "b=32 n=2,1,3"}
CAL_ITERS = 40

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--iters", type=int, default=10)
ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
args = ap.parse_args()


def driver() -> None:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", HPC_JABAS_PROGRESS="0", OMPI_MCA_mpi_yield_when_idle="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    errs: dict[int, list[float]] = {k: [] for k in range(args.repeats)}
    errs_after: dict[int, list[float]] = {k: [] for k in range(args.repeats)}
    by_kind: dict[str, dict[int, list[float]]] = {f"{k}_{w}": {r: [] for r in range(args.repeats)}
                                                  for k in ("identical", "per_rank") for w in ("before", "after")}
    per_world: dict[int, list[float]] = {}
    per_world_after: dict[int, list[float]] = {}
    t0 = time.perf_counter()
    for R in (1, 2, 3):
        out = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(R), sys.executable,
                              *self_command(), "--child", str(R), "--repeats", str(args.repeats), "--iters",
                              str(args.iters)], env=env, capture_output=True, text=True)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if out.returncode or not lines:
            sys.exit(f"world {R} failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        for ln in out.stdout.splitlines():
            if ln.startswith("  "):
                print(ln, flush=True)
        res = json.loads(lines[-1][len("RESULT "):])
        for rep, e in res["err"].items():
            errs[int(rep)] += e
            ea = res["err_after"][rep]
            errs_after[int(rep)] += ea
            for kind, b, a in zip(res["kinds"][rep], e, ea):
                by_kind[f"{kind}_before"][int(rep)].append(b)
                by_kind[f"{kind}_after"][int(rep)].append(a)
        per_world[R] = [statistics.mean(e) for e in res["err"].values()]
        per_world_after[R] = [statistics.mean(e) for e in res["err_after"].values()]
    means = [statistics.mean(e) for e in errs.values()]
    means_after = [statistics.mean(e) for e in errs_after.values()]
    maxes = [max(e) for e in errs.values()]
    n = len(errs[0])
    kind_med = {k: statistics.median(statistics.mean(e) for e in v.values() if e) for k, v in by_kind.items()}
    print(f"repeats={args.repeats} plans={n} (real compute, 1-3 CPU ranks on a shared machine, {load_note()}) "
          f"mean_abs_error_before_min={min(means):.4f} mean_abs_error_before_max={max(means):.4f} "
          f"mean_abs_error_after_min={min(means_after):.4f} mean_abs_error_after_max={max(means_after):.4f} "
          f"max_abs_error_min={min(maxes):.4f} max_abs_error_max={max(maxes):.4f} "
          f"wall_s={time.perf_counter() - t0:.0f} "
          + " ".join(f"world{R}_mean_abs_error_before={statistics.median(v):.4f} "
                     f"world{R}_mean_abs_error_after={statistics.median(per_world_after[R]):.4f}"
                     for R, v in per_world.items())
          + " " + " ".join(f"{k}_mean_abs_error={v:.4f}" for k, v in kind_med.items()))
    print(f"mean_abs_error_before={statistics.median(means):.4f} "
          f"mean_abs_error_after={statistics.median(means_after):.4f} max_abs_error={statistics.median(maxes):.4f}")


def child(R: int) -> None:
    import torch
    from torch import nn

    from bench.common.realmodel import dataset, make_model, profile_bundle
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.perf.perfmodel import ComputeProfile, PerfModel
    from hpc_jabas.core.planning import Plan
    from hpc_jabas.runtime.comm import seam as comm
    from hpc_jabas.runtime.profiling.allreduce import fit_allreduce, measure_allreduce
    from hpc_jabas.runtime.profiling.compute import measure_compute
    from hpc_jabas.runtime.profiling.load import check_bundle, grad_bytes
    from hpc_jabas.runtime.trainer import Trainer

    torch.set_num_threads(1)
    comm.init()
    rank = comm.rank()
    assert comm.size() == R
    types = ["v100"] * R          # a label only: the profile below is this CPU's real compute

    def say(msg: str) -> None:
        if rank == 0:
            print(msg, flush=True)

    # 1. profile: every rank at once, pooled
    meas = measure_compute(check_bundle(profile_bundle()), PROFILED, warmup=2, repeats=7)
    every = comm.allgather_object((meas.t, meas.update_s), name="pm.prof")
    t_pool = [statistics.median(e[0][k] for e in every) for k in range(len(PROFILED))]
    upd = statistics.median(e[1] for e in every)
    grad = grad_bytes(make_model())
    if R > 1:
        ar = fit_allreduce(measure_allreduce([64 << 10, 1 << 20, 4 << 20, grad], repeats=10))
    else:
        from hpc_jabas.core.perf.perfmodel import AllreduceModel
        ar = AllreduceModel()
    prof = ComputeProfile(gpu="v100", b=PROFILED, t=t_pool, update_s=upd, max_b=1024, emulated=False,
                          source="measured: real CPU compute, pooled over the ranks")
    model = PerfModel({"v100": prof}, ar, grad, 0.0)
    prof_dir = comm.broadcast_object(tempfile.mkdtemp(prefix="hj-bench-pm-profile-") if rank == 0 else None,
                                     name="pm.pdir")
    if rank == 0:
        model.save(prof_dir)
    comm.allgather_object(None, name="pm.saved")
    say(f"  world {R}: profile b={PROFILED} t_ms={[round(t * 1e3, 2) for t in t_pool]} update_ms={upd * 1e3:.2f} "
        f"allreduce(grad)={model.allreduce_tail(R) * 1e3:.2f} ms")

    ds = dataset()
    run_dir = tempfile.mkdtemp(prefix=f"hj-bench-pm-{rank}-")

    def trainer(text: str, calibrate: bool = False) -> Trainer:
        plan = Plan.parse(text)
        m = make_model()
        cfg = JobConfig(batch=plan.B, planner="fixed", plan=text, gpu_types=types, checkpoint=False,
                        run_dir=run_dir, metrics_period=10 ** 6, epochs=10 ** 6, tail="drop",
                        calibrate=calibrate, profile_dir=prof_dir if calibrate else None)
        return Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01), ds, nn.CrossEntropyLoss(), config=cfg,
                       gpu_types=types)

    def close(tr: Trainer) -> None:
        tr._pending = []
        tr.opt.remove_hooks()

    def measure(text: str) -> float:
        tr = trainer(text)
        for _ in range(3):
            tr.train_step()
        comm.allgather_object(None, name="pm.t0")
        t0 = time.perf_counter()
        for _ in range(args.iters):
            tr.train_step()
        comm.allgather_object(None, name="pm.t1")
        dt = (time.perf_counter() - t0) / args.iters
        close(tr)
        return comm.broadcast_object(dt, name="pm.dt")

    def calibrated() -> PerfModel:
        """The job's online calibration (runtime/calibrate.py) after CAL_ITERS iterations of CAL_PLAN: the model
        the planner, balancing and pricing would use from then on."""
        tr = trainer(CAL_PLAN[R], calibrate=True)
        for _ in range(CAL_ITERS):
            tr.train_step()
        tr.calib.sync()
        view = tr.perf_model()
        close(tr)
        return view

    plans = PLANS[R] + PER_RANK[R]
    err: dict[int, list[float]] = {}
    err_after: dict[int, list[float]] = {}
    kinds: dict[int, list[str]] = {}
    for rep in range(args.repeats):
        order = plans[rep % len(plans):] + plans[:rep % len(plans)]
        cal = calibrated()                      # once per repeat, before its plans: fresh each time
        say(f"  world {R} repeat {rep} calibration after {CAL_ITERS} iterations of {CAL_PLAN[R]}: "
            f"v100 t(32) {model.profile('v100').time(32) * 1e3:.2f} -> {cal.profile('v100').time(32) * 1e3:.2f} ms, "
            f"allreduce tail {model.allreduce_tail(R) * 1e3:.2f} -> {cal.allreduce_tail(R) * 1e3:.2f} ms")
        err[rep], err_after[rep], kinds[rep] = [], [], []
        for text in order:
            t = measure(text)
            p = model.iteration_time(Plan.parse(text), types)
            pc = cal.iteration_time(Plan.parse(text), types)
            err[rep].append(abs(p - t) / t)
            err_after[rep].append(abs(pc - t) / t)
            kinds[rep].append("per_rank" if text in PER_RANK[R] else "identical")
            say(f"  world {R} repeat {rep} plan {text:<20} measured={t * 1e3:7.2f} ms predicted={p * 1e3:7.2f} ms "
                f"err={(p - t) / t:+.3f} calibrated={pc * 1e3:7.2f} ms err={(pc - t) / t:+.3f}")
    say("RESULT " + json.dumps({"err": err, "err_after": err_after, "kinds": kinds}))


if args.child:
    child(args.child)
else:
    driver()
