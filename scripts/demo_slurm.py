"""Demo, part 2: the Slurm lifecycle on the local cluster, driven from Python (submitit).

Digits on a heterogeneous job {a100:1, v100:2}, adaptive batching on (the goodput policy; part 1 of the demo
shows the similarity policy), ranks emulating their partition's GPU type. At the first epoch end the
auto-scaler (objective: cost, over the mixes the cluster can give) moves the job; rank 0 resubmits it onto
the new mix, the new job resumes from the checkpoint. The chain is printed and the report PNG written.
tests/test_demo.py also replays this chain in the simulator (bench/sim_validation.py: ``simulate_chain``).
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc_jabas.cli.submit import stopped_line  # noqa: E402
from hpc_jabas.core.config.jobspec import JobSpec  # noqa: E402
from hpc_jabas.errors import JabasError  # noqa: E402
from hpc_jabas.slurm.executor import submit  # noqa: E402
from hpc_jabas.slurm.watch import wait_chain  # noqa: E402


def main(out: str) -> int:
    # the chain must live where every node sees it (each node has its own /tmp)
    chain_dir = (ROOT / out / "chain").resolve()
    chain_dir.mkdir(parents=True, exist_ok=True)
    # emulated GPUs slow enough that an epoch takes seconds; a short restart prior, because the
    # demo's epochs are short (the auto-scaler moves only when the saving beats the restart)
    train = {"epochs": 4, "batch": 96, "batch_min": 48, "batch_max": 384, "policy": "noise-scale", "p": 4,
             "planner": "optimal", "identical_micro_batch": "true", "emulate": True, "seed": 0,
             "emulate_base_s": 0.004, "emulate_per_sample_s": 0.001}
    auto = {"objective": "cost", "max_gpus": 3, "max_partitions": 2, "restart_prior_s": 2.0}
    spec = JobSpec(task="examples.train_digits:build", config={**train, "autoscale": auto},
                   chain_dir=str(chain_dir), mix={"a100": 1, "v100": 2}, method="submitit",
                   pythonpath=[str(ROOT)])
    try:
        sub = submit(spec)      # refused in one line when the nodes could not see the python environment or the code
    except JabasError as e:
        print(f"demo: not submitted: {e}", file=sys.stderr)
        return 2
    print(f"submitted job {sub.job_id} onto {sub.mix} (submitit); following the chain ...", flush=True)
    res = wait_chain(chain_dir, sub.job_id, timeout=400,
                     on_event=lambda e: print(f"  chain: {e['event']:<7} " + ", ".join(
                         f"{k}={e[k]}" for k in ("job_id", "from_job", "to_job", "mix", "epoch", "overhead_s")
                         if k in e), flush=True))
    hj = str(ROOT / ".venv" / "bin" / "hpc-jabas")
    if not res["ok"]:               # (a job that died on its node before training wrote no metrics)
        subprocess.run([hj, "status", str(chain_dir)], check=False)
        print(stopped_line(res, 400, str(chain_dir)), file=sys.stderr)
        return 1
    import json
    for ln in (chain_dir / "run" / "metrics.jsonl").read_text().splitlines():
        r = json.loads(ln)
        if r.get("type") == "autoscale" and "reason" in r:
            fe = f", forecast error of the finished epoch {r['forecast_error']:.1%}" if "forecast_error" in r else ""
            print(f"  epoch {r['epoch']} end: {'MOVE' if r.get('move') else 'stay'}: {r['reason']}{fe}")
    subprocess.run([hj, "status", str(chain_dir)], check=False)
    subprocess.run([hj, "report", str(chain_dir / "run")], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runs/demo-slurm"))
