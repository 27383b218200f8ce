"""The simulator against real runs: does ``hpc-jabas simulate`` predict what a real job then takes?

    .venv/bin/python -m bench.sim_validation [--repeats 3] [--epochs 4] [--backend torch] [--json FILE]

Real side: 3 emulated ranks (v100, p100, rtx2060; mpirun, examples/train_digits.py, the default emulated speeds;
``--backend``: Horovod where it imports, as the recorded runs, or torch DDP), each case run ``--repeats`` times in
rotated order:
- ``lbbsp``: fixed B = 96, LB-BSP split (planner lbbsp), micro-batch 8;
- ``goodput``: the goodput (noise-scale) policy from B0 = 32 in [32, 512], the optimal planner with one
  micro-batch size on every rank (what the simulator's optimal planner prices), auto-scaling off.
Both plan on a profile measured once with ``hpc-jabas profile --emulate`` (micro-batch times and the
allreduce fit over 3 ranks), never on the emulator's own formula.

Simulated side: the same job (samples per epoch, epochs, B range, micro-batch) on a described cluster of
three one-GPU partitions, no queue wait, ``[model] profile_dir`` = that profile, strategy ``lbbsp`` or
``goodput`` (the goodput policy on the static allocation). For the goodput case the gradient statistics
are the real run's own (``[gradstats] curve = "trace"`` on its metrics.jsonl, no added noise): the
simulator's policy then sees the noise scale the real one saw at the same progress, not the decisions.

What a run costs besides its iterations (``[model] measure_factor``: a measurement iteration's time over a
normal one's; ``epoch_end_s``: evaluation, checkpoint and fit()'s own work per epoch) is measured once per
case, the median over ``--calibration-runs`` runs of other seeds (``run_overheads``: the factor from the
adaptive runs' real over modelled iteration time, less the fixed case's), as the profile is measured once.
With ``--backend`` torch or horovod the profile is measured on that backend too.

Per case and run: ``error`` = |predicted - measured| / measured with measured = the whole ``fit()``
(``summary.json``'s wall_s: iterations, evaluation, checkpoints, safe points) and predicted with those
overheads; ``error_iterations_only`` the same for the prediction without them (the perf model's iterations
alone); ``iteration_error`` that prediction against the sum of the run's iteration times (``iter_s``);
for goodput also the mean |B_sim - B_real| / B_real over the iterations (``b_error``). Medians over the
repeats with min/max. Goal (issue): error <= 0.10.

Last line: ``validation_error=X (max of the cases' medians) validation_error_lbbsp=.. error_iterations_only_lbbsp=..
iteration_error_lbbsp=.. validation_error_goodput=.. error_iterations_only_goodput=.. iteration_error_goodput=..
b_error_goodput=..``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common.launch import ROOT, _mpi_env, _mpirun, load_note, profile_emulated
from hpc_jabas.core.perf.perfmodel import EMU_BASE_S, EMU_PER_SAMPLE_S
from hpc_jabas.core.sim.simconfig import cluster_from_dict, job_from_dict
from hpc_jabas.core.sim.simulate import Simulation

TYPES = ["v100", "p100", "rtx2060"]
CASES = {
    "lbbsp": {"strategy": "lbbsp", "batch": 96, "lo": 96, "hi": 96, "micro_batch": 8,
              "args": ["--planner", "lbbsp", "--micro-batch", "8", "--batch", "96"]},
    "goodput": {"strategy": "goodput", "batch": 32, "lo": 32, "hi": 512, "micro_batch": None,
                "args": ["--planner", "optimal", "--identical-micro-batch", "true", "--policy", "noise-scale",
                         "--batch", "32", "--batch-min", "32", "--batch-max", "512"]},
}


def real_run(case: dict, profile: Path, run_dir: Path, epochs: int, seed: int = 0, backend: str = "auto") -> dict:
    summary = run_dir.parent / f"{run_dir.name}-summary.json"
    cmd = [*_mpirun(len(TYPES)), str(ROOT / "examples" / "train_digits.py"), "-q", "--emulate",
           "--gpu-types", ",".join(TYPES), "--profile-dir", str(profile), "--epochs", str(epochs),
           "--run-dir", str(run_dir), "--summary", str(summary), "--seed", str(seed), "--backend", backend,
           *case["args"]]
    r = subprocess.run(cmd, env=_mpi_env(), capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"sim_validation: the real run failed (rc={r.returncode}): "
                         f"{(r.stderr.strip().splitlines() or [''])[-1]}")
    s = json.loads(summary.read_text())
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    its = [x for x in recs if x.get("type") == "iteration"]
    return {"wall_s": float(s["wall_s"]), "samples": int(s["samples"]), "iterations": int(s["iterations"]),
            "iter_s": sum(float(x["iter_s"]) for x in its), "B": [int(x["B"]) for x in its],
            "its": [(int(x["it"]), int(x["B"]), float(x["iter_s"])) for x in its],
            "measure_share": sum(bool(x.get("measure")) for x in its) / max(len(its), 1)}


def run_overheads(real: dict, epochs: int, model_ratio: float | None = None, bias: float = 1.0) -> dict:
    """What a run costs besides its iterations, from its own records (the simulator's [model] keys):
    ``epoch_end_s`` = (fit() - the iterations' sum) / epochs; ``measure_factor`` for an adaptive run, from
    ``model_ratio`` = its iterations' real time over the profile's model of the same iterations (the simulator
    without overheads on the run's own B trajectory) and ``bias`` = that ratio on the fixed case (the model's
    error on iterations that do not measure): with a share m of measurement iterations (the records' "measure"
    flag), ratio = bias x (1 + m (factor - 1)), so factor = 1 + (ratio / bias - 1) / m, at least 1. Comparing
    measurement iterations with the run's other ones cannot work here: with p = a tenth of a short epoch,
    measure_every rounds to 1 and nearly every iteration measures."""
    out = {"epoch_end_s": max(real["wall_s"] - real["iter_s"], 0.0) / epochs, "measure_factor": 1.0}
    m = real.get("measure_share", 0.0)
    if model_ratio is not None and m > 0:
        out["measure_factor"] = max(1.0, 1.0 + (model_ratio / bias - 1.0) / m)
    return out


def simulate(case: dict, profile: Path, run_dir: Path, epochs: int, samples_per_epoch: int,
             overheads: dict | None = None):
    cluster = cluster_from_dict({"name": "three-emulated-gpus", "restart_s": 0,
                                 "partition": [{"name": t, "gpu": t, "nodes": 1, "gpus_per_node": 1}
                                               for t in TYPES]})
    job = {"name": "digits", "samples": samples_per_epoch, "epochs": epochs, "batch": case["batch"],
           "batch_min": case["lo"], "batch_max": case["hi"], "stop": "samples",
           "model": {"profile_dir": str(profile), **(overheads or {})},
           "gradstats": ({"curve": "trace", "path": str(run_dir / "metrics.jsonl"), "noise": 0.0}
                         if case["strategy"] == "goodput" else {"curve": "mccandlish", "noise": 0.0})}
    if case["micro_batch"]:
        job["micro_batch"] = case["micro_batch"]
    return Simulation(cluster, job_from_dict(job)).run(case["strategy"])


# ---- a Slurm chain with a move (tests/test_demo.py replays the demo's; bench/sim_validation_chain.py measures) ----
def _records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def chain_real(chain_dir: Path) -> dict:
    """What a finished chain did, from its own records: ``total_s`` from the first job's start to the last
    job's end (chain.jsonl), its moves as (epoch ended, mix), the measured restart overheads (checkpoint ->
    the next job's first iteration), the iterations (it, B, iter_s, measure, samples) and the jobs' fit() walls."""
    from hpc_jabas.slurm import chain as chainlog
    ev = chainlog.read(chain_dir)
    starts = [e for e in ev if e["event"] == "start"]
    ends = [e for e in ev if e["event"] == "end"]
    if not starts or len(ends) != len(starts) or ends[-1].get("state") != "finished":
        raise SystemExit(f"sim_validation: the chain in {chain_dir} did not finish: {[e['event'] for e in ev]}")
    recs = _records(Path(chain_dir) / "run" / "metrics.jsonl")
    its = [x for x in recs if x["type"] == "iteration"]
    spec_path = next(e["spec"] for e in ev if e["event"] == "submit")
    return {"total_s": float(ends[-1]["time"]) - float(starts[0]["time"]),
            "moves": [(int(e["epoch"]) - 1, dict(e["mix"])) for e in ev if e["event"] == "move"],
            "restarts_s": [float(e["overhead_s"]) for e in ev if e["event"] == "restart"],
            "first_mix": dict(starts[0]["mix"]), "fit_s": sum(float(e["wall_s"]) for e in ends),
            "its": [(int(x["it"]), int(x["B"]), float(x["iter_s"]), bool(x.get("measure")), int(x["samples"]))
                    for x in its],
            "samples": sum(int(x["samples"]) for x in its), "B": [int(x["B"]) for x in its],
            "autoscale": [x for x in recs if x["type"] == "autoscale" and "free" in x],
            "spec": json.loads(Path(spec_path).read_text())}


def chain_overheads(real: dict, epochs: int) -> dict:
    """The simulator's [model] keys from a chain's records, measured as the trainer's auto-scaler meters them
    (core/autoscale/overheads.py: measurement iterations against normal ones at the same B), and ``epoch_end_s`` =
    (the jobs' fit() - their iterations) / epochs."""
    from hpc_jabas.core.autoscale.overheads import OverheadMeter
    m = OverheadMeter()
    for _, B, t, meas, n in real["its"]:
        m.observe_iteration(B, t, meas, n)
    iters = sum(t for _, _, t, _, _ in real["its"])
    return {"measure_factor": m.estimate().measure_factor, "epoch_end_s": max(real["fit_s"] - iters, 0.0) / epochs}


def simulate_chain(chain_dir: Path, real: dict, overheads: dict, restart_s: float, work: Path):
    """The chain's job in the simulator (strategy ``hpcjabas-cost``: goodput + the cost objective, as the chain
    ran): the cluster as the first epoch-end decision saw it (free GPUs, allocation units, billing rates), the
    job's own config and perf model (its profile, else the emulated model it planned with, saved as one), its
    gradient statistics (``curve = "trace"``), ``overheads`` and a move costing ``restart_s``."""
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.perf.perfmodel import job_perf_model
    cfg, auto = dict(real["spec"]["config"]), dict(real["spec"]["config"].get("autoscale") or {})
    if cfg.get("policy") != "noise-scale" or auto.get("objective") != "cost":
        raise SystemExit("sim_validation: simulate_chain replays goodput + cost chains (strategy hpcjabas-cost); "
                         f"this one has policy={cfg.get('policy')!r} objective={auto.get('objective')!r}")
    view = real["autoscale"][0]
    free, unit, rates = view["free"], view["unit"], view["rates"]
    parts = []
    for q in sorted(free):
        g = int(unit[q]) if isinstance(unit, dict) else 1
        if free[q] // g:
            parts.append({"name": q, "gpu": q, "nodes": free[q] // g, "gpus_per_node": g, "rate": float(rates[q])})
    cluster = cluster_from_dict({"name": "local-slurm", "restart_s": float(restart_s), "partition": parts})
    jc = JobConfig.from_dict({k: v for k, v in cfg.items() if k != "autoscale"})
    profile = cfg.get("profile_dir")
    if not profile:
        profile = str(work / "job-model")
        job_perf_model(jc, sorted(free), calibrated=False).save(profile)
    epochs = int(jc.epochs)
    job = {"name": "chain", "samples": real["samples"] // epochs, "epochs": epochs, "batch": int(jc.batch),
           "batch_min": int(jc.B_min), "batch_max": int(jc.B_max), "stop": "samples", "mix": real["first_mix"],
           "p": jc.p, "seed": 0, "model": {"profile_dir": profile, **overheads},
           "gradstats": {"curve": "trace", "path": str(Path(chain_dir) / "run" / "metrics.jsonl"), "noise": 0.0},
           "autoscale": {k: auto[k] for k in ("max_gpus", "min_gpus", "max_partitions", "margin", "restart_prior_s",
                                              "exact_upto") if k in auto} | {"unit": 0 if isinstance(unit, dict)
                                                                             else int(unit)}}
    if jc.micro_batch:
        job["micro_batch"] = int(jc.micro_batch)
    return Simulation(cluster, job_from_dict(job)).run("hpcjabas-cost")


def sim_moves(sim) -> list[tuple[int, dict]]:
    from hpc_jabas.core.autoscale.scaler import mix_label
    out = []
    for d in sim.decisions:
        if d["move"]:
            mix = {q: int(n) for q, n in (x.split(":") for x in d["mix"].split("+"))}
            out.append((int(d["epoch"]), mix))
            assert mix_label(mix) == d["mix"]
    return out


def b_error(real_B: list[int], trajectory: list[tuple[int, int]]) -> float:
    """Mean over the real run's iterations of |B_sim(it) - B_real(it)| / B_real(it)."""
    out, k, B = [], 0, trajectory[0][1]
    for it, br in enumerate(real_B):
        while k + 1 < len(trajectory) and trajectory[k + 1][0] <= it:
            k += 1
            B = trajectory[k][1]
        out.append(abs(B - br) / br)
    return sum(out) / len(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--calibration-runs", type=int, default=3,
                    help="runs (seeds 1..N, not the validated seed 0) that measure the overheads; the median")
    ap.add_argument("--backend", choices=("auto", "horovod", "torch"), default="auto",
                    help="the real runs' backend (auto: Horovod when it imports, as the recorded runs)")
    ap.add_argument("--json", metavar="FILE")
    a = ap.parse_args()
    if a.repeats < 1 or a.epochs < 1 or a.calibration_runs < 1:
        print("sim_validation: --repeats, --epochs and --calibration-runs must be >= 1", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sim-validation-"))
    profile = work / "profile"
    if a.backend != "auto":              # profiled on the backend the runs use, as a user of that backend would
        os.environ["HPC_JABAS_BACKEND"] = a.backend
    profile_emulated("examples.models:digits_mlp", "examples.models:digits_mlp", TYPES, EMU_BASE_S,
                     EMU_PER_SAMPLE_S, profile)
    names = list(CASES)
    # what the runs cost besides their iterations, measured once per case on runs of other seeds (as the
    # profile is measured once): the simulator's [model] measure_factor and epoch_end_s
    over: dict[str, dict] = {}
    bias = 1.0                          # the fixed case's real / modelled iteration time, calibrated first
    for n in sorted(names, key=lambda k: CASES[k]["strategy"] != "lbbsp"):
        got, ratios = [], []
        for seed in range(1, a.calibration_runs + 1):
            cal_dir = work / f"{n}-calibration-{seed}"
            cal = real_run(CASES[n], profile, cal_dir, a.epochs, seed=seed, backend=a.backend)
            modelled = float(simulate(CASES[n], profile, cal_dir, a.epochs, cal["samples"] // a.epochs)
                             .totals["time_s"])
            ratios.append(cal["iter_s"] / modelled)
            adaptive = CASES[n]["strategy"] != "lbbsp"
            got.append(run_overheads(cal, a.epochs, ratios[-1] if adaptive else None, bias))
        if CASES[n]["strategy"] == "lbbsp":
            bias = statistics.median(ratios)
        over[n] = {k: statistics.median(g[k] for g in got) for k in got[0]}
        print(f"{n}: measured on {a.calibration_runs} runs of seeds 1-{a.calibration_runs} (median): "
              f"epoch_end_s={over[n]['epoch_end_s']:.4f} measure_factor={over[n]['measure_factor']:.3f} "
              f"real/modelled iterations={statistics.median(ratios):.3f}", flush=True)
    rows: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(a.repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            case = CASES[n]
            run_dir = work / f"{n}-{r}"
            real = real_run(case, profile, run_dir, a.epochs, backend=a.backend)
            sim = simulate(case, profile, run_dir, a.epochs, real["samples"] // a.epochs, over[n])
            bare = simulate(case, profile, run_dir, a.epochs, real["samples"] // a.epochs)   # iterations only
            pred, pred_bare = float(sim.totals["time_s"]), float(bare.totals["time_s"])
            row = {"repeat": r, "predicted_s": pred, "predicted_iterations_only_s": pred_bare,
                   "fit_s": real["wall_s"], "iter_sum_s": real["iter_s"],
                   "iterations_real": real["iterations"], "iterations_sim": int(sim.totals["iterations"]),
                   "error": abs(pred - real["wall_s"]) / real["wall_s"],
                   "error_iterations_only": abs(pred_bare - real["wall_s"]) / real["wall_s"],
                   "iteration_error": abs(pred_bare - real["iter_s"]) / real["iter_s"]}
            if n == "goodput":
                row["b_error"] = b_error(real["B"], sim.trajectory)
                row["B_final_real"], row["B_final_sim"] = real["B"][-1], sim.trajectory[-1][1]
            rows[n].append(row)
            print(f"repeat {r} {n}: predicted {pred:.2f} s, fit() {real['wall_s']:.2f} s (error "
                  f"{row['error']:.3f}; iterations only {pred_bare:.2f} s, error {row['error_iterations_only']:.3f}), "
                  f"iterations {real['iter_s']:.2f} s (error of the iterations-only prediction "
                  f"{row['iteration_error']:.3f}), "
                  f"iterations real/sim {row['iterations_real']}/{row['iterations_sim']}"
                  + (f", B error {row['b_error']:.3f}, final B real/sim {row['B_final_real']}/{row['B_final_sim']}"
                     if n == "goodput" else ""), flush=True)
    figs: dict[str, float] = {}
    spread = []
    for n in names:
        for key in ("error", "error_iterations_only", "iteration_error", "b_error"):
            vals = [x[key] for x in rows[n] if key in x]
            if vals:
                figs[f"{'validation_error' if key == 'error' else key}_{n}"] = statistics.median(vals)
                spread.append(f"{key}_{n}_min={min(vals):.3f} {key}_{n}_max={max(vals):.3f}")
    figs = {"validation_error": max(figs[f"validation_error_{n}"] for n in names), **figs}
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "figures": figs}, indent=1))
    print(f"repeats={a.repeats} epochs={a.epochs} backend={a.backend} ({load_note()}) " + " ".join(spread))
    print(" ".join(f"{k}={v:.3f}" for k, v in figs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
