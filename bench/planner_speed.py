"""Planner speed on a large heterogeneous allocation (goals: <= 10 ms per plan, <= 1 s per range table).

1024 GPUs of 8 catalog types, emulated perf model (PerfModel.emulated defaults, micro-batch sizes
8..512 under each type's memory cap). Measures plan_batch for a spread of global batches (median)
and plan_range for every feasible B in 256..65536. The last line is machine-readable:

    plan_ms=<median ms of one plan_batch> range_table_s=<seconds of one plan_range>

Run: .venv/bin/python bench/planner_speed.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hpc_jabas.core.perfmodel import PerfModel  # noqa: E402
from hpc_jabas.core.planner import plan_batch, plan_range, snap_batch  # noqa: E402

TYPES = {"v100": 160, "p100": 160, "a100": 128, "h100": 64, "rtx3090": 128,
         "titan-rtx": 128, "titan-v": 128, "p4000": 128}
B_LIST = (8, 16, 32, 64, 128, 256, 512)


def main() -> None:
    gpus = [g for g, k in TYPES.items() for _ in range(k)]
    assert len(gpus) == 1024 and len(TYPES) == 8
    model = PerfModel.emulated(TYPES, b_list=B_LIST)
    caps = {g: model.profile(g).max_b for g in TYPES}
    print(f"gpus: {len(gpus)} of {len(TYPES)} types; memory caps max_b: {caps}")

    targets = [snap_batch(B, gpus, model) for B in (9000, 12345, 16384, 20000, 32768, 50000, 65536)]
    plan_batch(targets[0], gpus, model)  # warm caches / imports
    samples = []
    for _ in range(5):
        for B in targets:
            t0 = time.perf_counter()
            plan = plan_batch(B, gpus, model)
            samples.append((time.perf_counter() - t0) * 1e3)
    plan_ms = statistics.median(samples)
    last = plan_batch(65536, gpus, model)
    print(f"plan_batch: {len(samples)} plans, median {plan_ms:.2f} ms, max {max(samples):.2f} ms; "
          f"B=65536 -> b={last.b} M={last.M} iter={model.iteration_time(last, gpus) * 1e3:.1f} ms")

    t0 = time.perf_counter()
    rows = plan_range(256, 65536, gpus, model)
    range_s = time.perf_counter() - t0
    print(f"plan_range 256..65536: {len(rows)} feasible B (from {rows[0][0]} to {rows[-1][0]}) "
          f"in {range_s:.3f} s")

    # spot check: the table agrees with single plans
    for B, plan, sec in rows[:: max(1, len(rows) // 25)]:
        assert plan == plan_batch(B, gpus, model), B
        assert sec == model.iteration_time(plan, gpus), B
    print("spot check: range table rows equal plan_batch and model.iteration_time")
    print(f"plan_ms={plan_ms:.3f} range_table_s={range_s:.3f}")


if __name__ == "__main__":
    main()
