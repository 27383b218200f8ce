"""`hpc-jabas simulate CLUSTER.toml JOB.toml`: whole training jobs in simulated time (core/sim/simulate.py).

    hpc-jabas simulate examples/sim/cluster_a.toml examples/sim/job_resnet50.toml --compare
    hpc-jabas simulate CLUSTER JOB --strategy hpcjabas-queue --epochs 5 --out runs/sim

Without --compare one strategy runs (--strategy, default hpcjabas-cost) and its per-epoch table is
printed; with --compare every strategy (or the comma-separated --strategies) runs on the same job,
cluster and seed and one table compares them, each total relative to the SimiGrad row. --out DIR writes
``simulation.json`` (every epoch, decision and total) and ``table.txt``; --json FILE the JSON alone.
Bad input is one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hpc_jabas.core.config.validate import parse_int
from hpc_jabas.errors import ConfigError


def add_parser(subparsers) -> argparse.ArgumentParser:
    from hpc_jabas.core.sim.simulate import STRATEGIES
    p = subparsers.add_parser(
        "simulate", help="simulate whole training jobs on a described cluster and compare strategies",
        description="Run a job in simulated time on a cluster file (partitions, GPUs, rates, queue model) "
                    "with the project's own perf model, planner, policies, forecaster and auto-scaler.")
    p.add_argument("cluster", metavar="CLUSTER.toml", help="the cluster: partitions, GPU types, counts, rates, queue")
    p.add_argument("job", metavar="JOB.toml", help="the job: data, batch range, perf model, gradient statistics")
    p.add_argument("--compare", action="store_true", help="run every strategy and print one table")
    p.add_argument("--strategy", default="hpcjabas-cost", metavar="NAME",
                   help=f"the strategy to run without --compare: {', '.join(STRATEGIES)}")
    p.add_argument("--strategies", metavar="LIST", help="with --compare: the strategies, comma-separated")
    p.add_argument("--epochs", type=str, metavar="N", help="override the job's epochs")
    p.add_argument("--seed", type=str, metavar="N", help="override the job's seed (measurement noise)")
    p.add_argument("--out", metavar="DIR", help="write simulation.json and table.txt into DIR")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    p.set_defaults(func=run)
    return p


def _int(text: str | None, what: str, lo: int) -> int | None:
    return None if text is None else parse_int(text, what, lo=lo)


def run(args) -> int:
    from hpc_jabas.core.sim.simconfig import load_cluster, load_job
    from hpc_jabas.core.sim.simulate import STRATEGIES, Simulation, comparison_table, epoch_table
    epochs, seed = _int(args.epochs, "--epochs", 1), _int(args.seed, "--seed", 0)
    cluster, job = load_cluster(args.cluster), load_job(args.job)
    if job.model.profile_dir:                  # the perf model the simulation prices with, checked as a job's is
        from hpc_jabas.trust import check_profile_dir
        check_profile_dir(job.model.profile_dir)
    if epochs is not None:
        job.epochs = epochs
    if seed is not None:
        job.seed = seed
    sim = Simulation(cluster, job, clock=time.perf_counter)
    if args.compare:
        names = [s.strip() for s in args.strategies.split(",") if s.strip()] if args.strategies else None
        results = sim.compare(names)
        text = comparison_table(results)
    else:
        if args.strategies:
            raise ConfigError("--strategies needs --compare; for one strategy give --strategy NAME")
        if args.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {args.strategy!r}; valid: {', '.join(STRATEGIES)}")
        results = {args.strategy: sim.run(args.strategy)}
        text = epoch_table(results[args.strategy])
    print(f"{cluster.name}: {sum(cluster.capacity.values())} GPUs in {len(cluster.partitions)} partitions; "
          f"job {job.name}: {job.epochs} epochs of {job.samples} samples, B0={job.batch}, seed {job.seed}")
    print(text)
    doc = {"cluster": cluster.name, "job": job.name, "epochs": job.epochs, "seed": job.seed,
           "results": {n: r.to_dict() for n, r in results.items()}}
    try:
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "simulation.json").write_text(json.dumps(doc, indent=1) + "\n")
            (out / "table.txt").write_text(text + "\n")
            print(f"wrote {out / 'simulation.json'} and {out / 'table.txt'}")
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {args.json}")
    except OSError as e:
        raise ConfigError(f"cannot write the results: {e.strerror or e}") from None
    return 0
