"""Epoch-end decision speed at cluster scale, and exactness against brute force on small clusters.

4,096 GPUs over 8 partitions (512 each, one catalog type each, 4-GPU nodes: ``unit=4``, plus the exact
counts 1 and 2), emulated perf model (t(b) = (4 ms + 2.5 ms * b) / speed, speed = FP32 TFLOPS vs a V100:
a ResNet-50-like V100 at ~390 images/s; ResNet-50-sized gradients, 10 GB/s allreduce). The epoch time
of a mix is priced like ``autoscale.epoch_time_fn``: each forecast period's B is snapped to a B = b * M
the optimal planner realises on the mix (every rank runs: M >= #GPUs), nearest the forecast, near-ties
(2.5%) to the higher throughput, and priced by the planner's exact makespan
(``planning.slots.makespan_all`` on the rank groups) plus the allreduce tail. It differs from
``epoch_time_fn`` in working on the groups instead of 4,096 per-rank plans (which take seconds per mix
at this size) and in its b candidates (8..512). The search bound is ``mixsearch.perf_bound`` of the same
model; the bench checks that it holds on sampled mixes. Decisions: the four objectives from two current
mixes, one ``search`` call each (default work caps), timed; then the time and cost decisions priced by
``autoscale.epoch_time_fn`` itself (not in the last line: ~15 ms per 4,096-GPU mix, so up to
MAX_EVALS x that). Exactness: 60 random clusters of 2-4
partitions with up to 8 GPUs each, search vs ``choose`` over every mix (``all_mixes``): the same
objective value and mix.

Last line: gpus=4096 partitions=8 decision_ms_max=... exact_matches=N/N (wall clock; the lines before:
each decision's objective, wall and CPU ms, mix, mixes priced and whether the search was exact or its
proven gap, and the CPU-time maximum: on a shared machine the wall times carry the other work's load).

Run: .venv/bin/python -m bench.autoscale_search
"""
from __future__ import annotations

import math
import os
import random
import time

from hpc_jabas.core.autoscale import mixsearch
from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning.slots import makespan_all

TYPES8 = ["v100", "p100", "a100", "h100", "rtx3090", "titan-rtx", "rtx2060", "l40s"]
B_LIST = [8, 16, 32, 64, 128, 256, 512]
BASE_S, PER_SAMPLE_S = 0.004, 0.0025    # a ResNet-50-like V100: ~390 images/s at b = 64


def group_epoch_fn(model, types, forecast, period, samples, B_min, B_max):
    caps = {t: model.profile(t).max_b for t in set(types.values())}
    t_of = {(t, b): model.profile(t).time(b) for t in caps for b in B_LIST if b <= caps[t]}
    u_of = {t: model.profile(t).update_s for t in caps}

    def fn(mix):
        groups = {}
        for p, n in mix.items():
            groups[types[p]] = groups.get(types[p], 0) + n
        N = sum(groups.values())
        bs = [b for b in B_LIST if all(caps[t] >= b for t in groups)]
        tail = model.allreduce_tail(N)

        def iter_time(b, M):
            ts = [t_of[t, b] for t in groups]
            us = [u_of[t] for t in groups]
            T = makespan_all(M, ts, us, list(groups.values()))
            return None if T is None else T + tail

        def snap(target):
            rows = []
            for b in bs:
                m_lo, m_hi = max(N, -(-B_min // b)), B_max // b
                if m_lo > m_hi:
                    continue
                for m in {min(max(math.floor(target / b), m_lo), m_hi), min(max(math.ceil(target / b), m_lo), m_hi)}:
                    rows.append((b * m, b, m))
            if not rows:
                return None
            d = min(abs(B - target) for B, _, _ in rows)
            near = [r for r in rows if abs(r[0] - target) <= d + 0.025 * target + 1e-9]
            timed = [(B / T, -B, B, T) for B, b, m in near for T in (iter_time(b, m),)]
            return max(timed)[2:]
        total, left, k = 0.0, samples, 0
        while left > 0:
            got = snap(forecast[min(k, len(forecast) - 1)])
            if got is None:
                return None
            B, T = got
            its = min(period, math.ceil(left / B))
            total += its * T
            left -= its * B
            k += 1
        return total
    return fn


def big_decisions():
    parts = {f"{t}-part": t for t in TYPES8}
    model = PerfModel.emulated(sorted(set(parts.values())), base_s=BASE_S, per_sample_s=PER_SAMPLE_S)
    samples = 1_281_167                          # an ImageNet epoch
    fc = [16384 * 1.15 ** k for k in range(12)]
    fn = group_epoch_fn(model, parts, fc, 50, samples, 4096, 131072)
    bound = mixsearch.perf_bound(model, parts, samples, 131072, forecast=fc, period=50, B_min=4096,
                                 micro_batch=B_LIST[0])
    rng = random.Random(0)
    for _ in range(200):                         # the bound holds where it is checked
        m = {p: rng.choice([0, 4, 64, 512]) for p in parts}
        m = {p: n for p, n in m.items() if n} or {"v100-part": 4}
        t = fn(m)
        lb = bound.mix_s(m)
        assert t is None or lb <= t * (1 + 1e-12), (m, lb, t)
    rates = autoscale.catalog_rates(parts)
    free = {p: 512 for p in parts}
    out = []
    for cur in ({"v100-part": 64, "p100-part": 64}, {"a100-part": 512, "h100-part": 256}):
        base_t = fn(cur) * 10
        base_c = base_t / 3600 * autoscale.mix_rate(cur, rates)
        for obj, kw in (("time", {}), ("cost", {}), ("time-under-budget", {"budget": 1.25 * base_c}),
                        ("cost-under-deadline", {"deadline_s": 0.5 * base_t})):
            t0, c0 = time.perf_counter(), time.process_time()
            ch = mixsearch.search(cur, free, parts, fn, rates, obj, 60.0, bound, max_gpus=4096, unit=4,
                                  exact_upto=2, remaining_epochs=10, **kw)
            ms, cpu_ms = 1000 * (time.perf_counter() - t0), 1000 * (time.process_time() - c0)
            how = ch.reason[ch.reason.rindex("(search:") + 1:-1]
            out.append((obj, ms, cpu_ms, ch.mix, how))
    return out


def real_fn_decisions():
    """The same cluster priced by autoscale.epoch_time_fn itself (snapping, grouptimes): ~15 ms per mix here."""
    parts = {f"{t}-part": t for t in TYPES8}
    model = PerfModel.emulated(sorted(set(parts.values())), B_LIST, base_s=BASE_S, per_sample_s=PER_SAMPLE_S)
    samples = 1_281_167
    fc = [16384 * 1.15 ** k for k in range(12)]
    fn = autoscale.epoch_time_fn(model, parts, fc, 50, samples, None, B_min=4096, B_max=131072)
    bound = mixsearch.perf_bound(model, parts, samples, 131072, forecast=fc, period=50, B_min=4096)
    rates = autoscale.catalog_rates(parts)
    out = []
    for obj in ("time", "cost"):
        t0 = time.perf_counter()
        ch = mixsearch.search({"v100-part": 64, "p100-part": 64}, {p: 512 for p in parts}, parts, fn, rates, obj,
                              60.0, bound, max_gpus=4096, unit=4, exact_upto=2, remaining_epochs=10)
        out.append((obj, 1000 * (time.perf_counter() - t0), ch.reason[ch.reason.rindex("(search:") + 1:-1]))
    return out


def small_exact(n_cases=60):
    rng = random.Random(1)
    names = ["v100", "p100", "a100", "rtx2060"]
    model = PerfModel.emulated(names, base_s=BASE_S, per_sample_s=PER_SAMPLE_S)
    ok = 0
    for _ in range(n_cases):
        parts = {p: p for p in rng.sample(names, rng.randint(2, 4))}
        free = {p: rng.randint(0, 8) for p in parts}
        unit, exact = rng.choice([1, 2, 4]), rng.choice([0, 2])
        max_gpus = rng.randint(2, 24)
        samples = 20_000
        fc = [rng.choice([128, 256, 512]) * 1.1 ** k for k in range(6)]
        fn = group_epoch_fn(model, parts, fc, 10, samples, 64, 2048)
        bound = mixsearch.perf_bound(model, parts, samples, 2048, forecast=fc, period=10, B_min=64,
                                     micro_batch=B_LIST[0])
        rates = autoscale.catalog_rates(parts)
        counts = mixsearch.partition_counts(free, parts, max_gpus, unit=unit, exact_upto=exact)
        cands = mixsearch.all_mixes(counts, max_gpus)
        cur = rng.choice(cands) if cands else {next(iter(parts)): 1}
        obj = rng.choice(autoscale.OBJECTIVES)
        ref = fn(cur) * 3
        kw = {"budget": 0.9 * ref / 3600 * autoscale.mix_rate(cur, rates)} if obj == "time-under-budget" else \
            {"deadline_s": 0.7 * ref} if obj == "cost-under-deadline" else {}
        want = autoscale.choose(cur, cands, fn, rates, obj, 30.0, remaining_epochs=3, **kw)
        got = mixsearch.search(cur, free, parts, fn, rates, obj, 30.0, bound, max_gpus=max_gpus, unit=unit,
                               exact_upto=exact, remaining_epochs=3, brute_max=0, **kw)
        pick = lambda ch: next(r for r in ch.table if r["chosen"])     # noqa: E731
        key = "total_cost" if obj in ("cost", "cost-under-deadline") else "total_time_s"
        if "no mix" in want.reason:
            key = "total_time_s" if key == "total_cost" else "total_cost"
        if math.isclose(pick(got)[key], pick(want)[key], rel_tol=1e-9) and got.mix == want.mix:
            ok += 1
    return ok, n_cases


def main():
    big = big_decisions()
    for obj, ms, cpu_ms, mix, how in big:
        print(f"{obj:<20} {ms:7.1f} ms (cpu {cpu_ms:7.1f} ms)  {autoscale.mix_label(mix)}  [{how}]")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
          f"decision_cpu_ms_max={max(c for _, _, c, _, _ in big):.0f}")
    for obj, ms, how in real_fn_decisions():
        print(f"real epoch_time_fn: {obj:<6} {ms:7.1f} ms  [{how}]")
    ok, n = small_exact()
    print(f"gpus=4096 partitions=8 decision_ms_max={max(ms for _, ms, _, _, _ in big):.0f} exact_matches={ok}/{n}")


if __name__ == "__main__":
    main()
