"""Planner speed on a large heterogeneous allocation (goals: <= 10 ms per plan, <= 1 s per range table).

1024 GPUs of 8 catalog types, emulated perf model (PerfModel.emulated defaults, micro-batch sizes
8..512 under each type's memory cap). Measures plan_batch for a spread of global batches: plain,
with per-rank speed factors (what every rebalancing step asks: 1024 distinct factors, so no two
ranks can be grouped), and with per-rank micro-batch sizes (once the planner offers them); and
plan_range for every feasible B in 256..65536. 3 repeats, the order rotated. Last line (medians
over repeats of each repeat's median plan time, wall and CPU time; the line before: min/max):

    plan_ms= plan_factors_ms= plan_per_rank_b_ms= cpu_plan_ms= ... range_table_s=

On a shared machine the wall times carry the other work's load; the CPU times do not.

Run: .venv/bin/python -m bench.planner_speed
"""
from __future__ import annotations

import inspect
import os
import random
import statistics
import time

from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning import plan_batch, plan_range, snap_batch

TYPES = {"v100": 160, "p100": 160, "a100": 128, "h100": 64, "rtx3090": 128,
         "titan-rtx": 128, "titan-v": 128, "p4000": 128}
B_LIST = (8, 16, 32, 64, 128, 256, 512)
REPEATS = 3


def per_rank_b_kwargs() -> dict | None:
    """The plan_batch keyword that asks for per-rank micro-batch sizes, once the planner has one."""
    params = inspect.signature(plan_batch).parameters
    for name, value in (("per_rank", True), ("per_rank_b", True)):
        if name in params:
            return {name: value}
    return None


def timed(fn, targets, rounds=3) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of each plan (CPU time: immune to other work sharing the cores)."""
    wall, cpu = [], []
    for _ in range(rounds):
        for B in targets:
            c0, t0 = time.process_time(), time.perf_counter()
            fn(B)
            wall.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    return wall, cpu


def main() -> None:
    gpus = [g for g, k in TYPES.items() for _ in range(k)]
    assert len(gpus) == 1024 and len(TYPES) == 8
    model = PerfModel.emulated(TYPES, b_list=B_LIST)
    caps = {g: model.profile(g).max_b for g in TYPES}
    print(f"gpus: {len(gpus)} of {len(TYPES)} types; memory caps max_b: {caps}")
    rng = random.Random(0)
    # rebalancing: every rank its own measured speed factor (1024 distinct values: no two ranks grouped)
    factors = [rng.uniform(0.3, 1.0) for _ in gpus]
    prb = per_rank_b_kwargs()

    targets = [snap_batch(B, gpus, model) for B in (9000, 12345, 16384, 20000, 32768, 50000, 65536)]
    sides = {"plain": lambda B: plan_batch(B, gpus, model),
             "factors": lambda B: plan_batch(B, gpus, model, speed_factors=factors)}
    if prb is not None:
        sides["per_rank_b"] = lambda B: plan_batch(B, gpus, model, speed_factors=factors, **prb)
    for f in sides.values():
        f(targets[0])                       # warm caches / imports
    med: dict[str, list[float]] = {k: [] for k in sides}
    cmed: dict[str, list[float]] = {k: [] for k in sides}
    mx: dict[str, float] = {k: 0.0 for k in sides}
    for rep in range(REPEATS):
        names = list(sides)
        order = names[rep % len(names):] + names[:rep % len(names)]
        for k in order:
            ms, cms = timed(sides[k], targets)
            med[k].append(statistics.median(ms))
            cmed[k].append(statistics.median(cms))
            mx[k] = max(mx[k], max(ms))
        print(f"repeat {rep} order={','.join(order)} "
              + " ".join(f"{k}={med[k][-1]:.2f}ms(cpu {cmed[k][-1]:.2f})" for k in sides), flush=True)
    last = plan_batch(65536, gpus, model)
    print(f"plan_batch B=65536 -> b={last.b} M={last.M} iter={model.iteration_time(last, gpus) * 1e3:.1f} ms; "
          f"slowest single plan: " + " ".join(f"{k}={mx[k]:.2f}ms" for k in sides))
    if prb is None:
        print("per-rank micro-batch sizes: plan_batch has no such option yet (the planner change is pending)")

    rng_s, rng_c = [], []
    for _ in range(REPEATS):
        c0, t0 = time.process_time(), time.perf_counter()
        rows = plan_range(256, 65536, gpus, model)
        rng_s.append(time.perf_counter() - t0)
        rng_c.append(time.process_time() - c0)
    print(f"plan_range 256..65536: {len(rows)} feasible B (from {rows[0][0]} to {rows[-1][0]})")

    # spot check: the table agrees with single plans
    for B, plan, sec in rows[:: max(1, len(rows) // 25)]:
        assert plan == plan_batch(B, gpus, model), B
        assert sec == model.iteration_time(plan, gpus), B
    print("spot check: range table rows equal plan_batch and model.iteration_time")
    keys = {"plain": "plan_ms", "factors": "plan_factors_ms", "per_rank_b": "plan_per_rank_b_ms"}
    spread = [f"{keys[k]}_min={min(v):.3f} {keys[k]}_max={max(v):.3f}" for k, v in med.items()]
    spread += [f"cpu_{keys[k]}_min={min(v):.3f} cpu_{keys[k]}_max={max(v):.3f}" for k, v in cmed.items()]
    print(f"repeats={REPEATS} (shared machine, load1={os.getloadavg()[0]:.1f}) " + " ".join(spread)
          + f" range_table_s_min={min(rng_s):.3f} range_table_s_max={max(rng_s):.3f}"
          + f" cpu_range_table_s_min={min(rng_c):.3f} cpu_range_table_s_max={max(rng_c):.3f}")
    lastline = [f"{keys[k]}={statistics.median(v):.3f}" for k, v in med.items()]
    lastline += [f"cpu_{keys[k]}={statistics.median(v):.3f}" for k, v in cmed.items()]
    if prb is None:
        lastline.append("plan_per_rank_b_ms=n/a")
    print(" ".join(lastline) + f" range_table_s={statistics.median(rng_s):.3f}"
          f" cpu_range_table_s={statistics.median(rng_c):.3f}")


if __name__ == "__main__":
    main()
