"""The simulator at cluster scale: 4,096 GPUs of 8 types over 8 partitions, 100 epochs, every strategy.

8 partitions of 512 GPUs (64 nodes of 8), one catalog type each (V100, P100, A100, H100, RTX 3090,
TITAN RTX, RTX 2060, L40S), emulated perf model (speeds: the catalog's FP32 TFLOPS ratios; V100 4 ms +
2.5 ms per sample; ResNet-50-sized gradients), catalog rates, lognormal queue waits (the fast types wait
longer). The job: ImageNet-sized epochs (1,281,167 samples), B0 = 16,384 in [4,096, 131,072], micro-batch
32, p = 100, McCandlish-style noise scale growth, ``stop = "samples"`` (exactly 100 epochs), the initial
mix 64 V100 + 64 P100. Every strategy of core/sim/simulate.py runs (``Simulation.compare``); the epoch-end
searches take the default work caps except ``max_evals = 60`` (their reasons say how close to the optimum
a cut search is).

Last line: gpus=4096 partitions=8 epochs=100 sim_s=... decision_ms_max=... validation_error=...
jabas_time_vs_simigrad=... hpcjabas_cost_vs_simigrad=... queue_aware_time_vs_jabas=... (validation_error: after
the comparison (outside sim_s), bench/sim_validation.py runs against real 3-rank runs (``--validation-repeats``,
default 3, with 1 calibration run; about 3 minutes) and its figure is printed here; ``--validation-repeats 0`` skips
it and prints ``not_measured``; the full validation is bench/sim_validation.py's own 5 repeats and
bench/sim_validation_chain.py; sim_s: wall time of
the whole comparison, scikit-learn's one-time import included; decision_ms_max: the slowest epoch-end
decision, forecast + search, wall clock, after that import). The simulator reuses what its decisions compute
when the inputs are exactly the same (``Simulation(cache=True)``; tests/test_simulate.py checks a run decides
the same without).
Before it: the comparison table.

Run: .venv/bin/python -m bench.simulate_scale
"""
from __future__ import annotations

import os
import sys
import time

from hpc_jabas.core.sim.simconfig import cluster_from_dict, job_from_dict
from hpc_jabas.core.sim.simulate import Simulation, comparison_table

TYPES8 = ["v100", "p100", "a100", "h100", "rtx3090", "titan-rtx", "rtx2060", "l40s"]
WAIT_MEDIAN_S = {"v100": 600, "p100": 120, "a100": 1800, "h100": 3600, "rtx3090": 900, "titan-rtx": 300,
                 "rtx2060": 60, "l40s": 1200}


def validation_error(repeats: int) -> str:
    """bench/sim_validation.py's validation_error over ``repeats`` repeats (one calibration run per case)."""
    if repeats < 1:
        return "not_measured"
    import json
    import subprocess
    import tempfile
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "validation.json")
        r = subprocess.run([sys.executable, "-m", "bench.sim_validation", "--repeats", str(repeats),
                            "--calibration-runs", "1", "--json", out], capture_output=True, text=True, cwd=root)
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["?"])[-1]
            print(f"simulate_scale: the validation run failed (rc={r.returncode}): {tail}", file=sys.stderr)
            return "failed"
        with open(out) as f:
            return f"{json.load(f)['figures']['validation_error']:.3f}"


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation-repeats", type=int, default=3,
                    help="repeats of bench/sim_validation.py after the comparison (0: skip)")
    a = ap.parse_args()
    if a.validation_repeats < 0:
        print(f"simulate_scale: --validation-repeats={a.validation_repeats} is invalid; give an integer >= 0",
              file=sys.stderr)
        sys.exit(2)
    cluster = cluster_from_dict({
        "name": "scale-8x512", "restart_s": 120, "queue": {"seed": 0, "period_s": 3600},
        "partition": [{"name": t, "gpu": t, "nodes": 64, "gpus_per_node": 8,
                       "wait": {"dist": "lognormal", "median_s": WAIT_MEDIAN_S[t], "sigma": 1.0}} for t in TYPES8]})
    job = job_from_dict({
        "name": "imagenet-scale", "samples": 1_281_167, "epochs": 100, "batch": 16384, "batch_min": 4096,
        "batch_max": 131072, "micro_batch": 32, "p": 100, "stop": "samples", "seed": 0,
        "mix": {"v100": 64, "p100": 64},
        "model": {"base_s": 0.004, "per_sample_s": 0.0025, "b_list": [8, 16, 32, 64, 128, 256], "grad_mb": 102},
        "gradstats": {"curve": "mccandlish", "b_start": 8192, "b_end": 131072, "tau": 0.3},
        "autoscale": {"max_partitions": 8, "unit": 0, "exact_upto": 0, "restart_prior_s": 120,
                      "max_queue_wait_s": 7200, "max_evals": 60}})
    t0 = time.perf_counter()
    sim = Simulation(cluster, job, clock=time.perf_counter)
    res = sim.compare()
    sim_s = time.perf_counter() - t0
    print(comparison_table(res))
    dms = max(r.totals["decision_ms_max"] for r in res.values())
    tt = {n: r.totals for n, r in res.items()}
    val = validation_error(a.validation_repeats)
    print(f"gpus=4096 partitions=8 epochs=100 sim_s={sim_s:.1f} decision_ms_max={dms:.0f} "
          f"validation_error={val} "
          f"jabas_time_vs_simigrad={tt['jabas']['time_s'] / tt['simigrad']['time_s']:.3f} "
          f"hpcjabas_cost_vs_simigrad={tt['hpcjabas-cost']['cost'] / tt['simigrad']['cost']:.3f} "
          f"queue_aware_time_vs_jabas={tt['hpcjabas-queue']['time_s'] / tt['jabas']['time_s']:.3f}")


if __name__ == "__main__":
    main()
