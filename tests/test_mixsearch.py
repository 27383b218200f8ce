"""core/autoscale/mixsearch.py: the branch-and-bound decision equals brute force (choose over every mix) on small
clusters, for every objective, with granularity, restart overhead, margin and queue waits."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hpc_jabas.core.autoscale.mixtree as mixtree
import hpc_jabas.errors as errors
from hpc_jabas.core.autoscale import mixbound, mixsearch
from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.autoscale.mixsearch import Bound, all_mixes, allowed_counts, partition_counts, search
from hpc_jabas.core.autoscale.overheads import Overheads
from hpc_jabas.core.autoscale.scaler import choose
from hpc_jabas.errors import ConfigError

NAMES = ["a100", "v100", "p100", "rtx2060"]
TYPES = {p: p for p in NAMES}
SAMPLES = 10_000.0


def synthetic(peak, tail_s, iters, slack, floor=None):
    """An epoch time that respects Bound(SAMPLES, peak, iters, tail, floor): the bound, plus a per-mix slack
    (imbalance, small micro-batches) and a coupling term that is not separable across partitions."""
    floor = floor or {}

    def fn(mix):
        n = sum(mix.values())
        theta = sum(k * peak[p] for p, k in mix.items())
        its = iters(n) if callable(iters) else iters
        base = max(SAMPLES / theta, its * max(floor.get(p, 0.0) for p in mix)) + its * tail_s * math.log2(n + 1)
        extra = sum(slack[p] * k for p, k in mix.items()) / theta * (1 + 0.3 * (len(mix) - 1))
        return base * (1 + extra)
    return fn


def brute(current, counts, fn, rates, objective, overhead, max_gpus, min_gpus, maxp, **kw):
    cands = all_mixes(counts, max_gpus, min_gpus, maxp)
    return choose(current, cands, fn, rates, objective, overhead, **kw)


def value(ch, objective):
    row = next(r for r in ch.table if r["chosen"])
    key = "total_cost" if objective in ("cost", "cost-under-deadline") else "total_time_s"
    if "no mix" in ch.reason:                   # nothing meets the limit: the other metric is minimised
        key = "total_time_s" if key == "total_cost" else "total_cost"
    return row[key], row["mix"]


cluster = st.fixed_dictionaries({
    "parts": st.integers(2, 4),
    "free": st.lists(st.integers(0, 8), min_size=4, max_size=4),
    "peak": st.lists(st.floats(0.5, 8.0), min_size=4, max_size=4),
    "rate": st.lists(st.floats(0.0, 5.0), min_size=4, max_size=4),
    "slack": st.lists(st.floats(0.0, 0.6), min_size=4, max_size=4),
    "floor": st.lists(st.sampled_from([0.0, 0.0, 20.0, 60.0, 200.0]), min_size=4, max_size=4),
    "fewer_its": st.booleans(),
    "tail": st.floats(0.0, 0.5),
    "unit": st.sampled_from([1, 2, 4]),
    "exact": st.sampled_from([0, 1, 2]),
    "max_gpus": st.integers(1, 24),
    "min_gpus": st.integers(1, 4),
    "maxp": st.sampled_from([None, 1, 2, 3]),
    "objective": st.sampled_from(autoscale.OBJECTIVES),
    "limit": st.floats(0.05, 3.0),
    "overhead": st.sampled_from([0.0, 30.0, 400.0]),
    "margin": st.sampled_from([0.0, 0.05, 0.3]),
    "R": st.sampled_from([1, 3.5]),
    "current": st.integers(0, 5),
    "wait": st.booleans(),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=cluster)
def test_search_equals_brute_force(c):
    parts = NAMES[:c["parts"]]
    free = {p: c["free"][i] for i, p in enumerate(parts)}
    peak = {p: c["peak"][i] for i, p in enumerate(parts)}
    rates = {p: c["rate"][i] for i, p in enumerate(parts)}
    slack = {p: c["slack"][i] for i, p in enumerate(parts)}
    floor = {p: c["floor"][i] for i, p in enumerate(parts)}
    iters = (lambda n: max(5, 40 - 2 * n)) if c["fewer_its"] else 20     # more GPUs, fewer iterations (snapping)
    fn = synthetic(peak, c["tail"], iters, slack, floor)
    bound = Bound(SAMPLES, peak, iters, lambda n, t=c["tail"]: t * math.log2(n + 1), floor)
    min_gpus = min(c["min_gpus"], c["max_gpus"])
    counts = partition_counts(free, TYPES, c["max_gpus"], unit=c["unit"], exact_upto=c["exact"])
    cands = all_mixes(counts, c["max_gpus"], min_gpus, c["maxp"])
    current = cands[c["current"] % len(cands)] if cands and c["current"] else {parts[0]: 1}
    # a reference value of the objective so that budgets and deadlines sometimes bind, sometimes not
    ref = fn(current) * c["R"]
    kw = dict(margin=c["margin"], remaining_epochs=c["R"])
    if c["objective"] == "time-under-budget":
        kw["budget"] = c["limit"] * ref / 3600 * autoscale.mix_rate(current, rates)
    if c["objective"] == "cost-under-deadline":
        kw["deadline_s"] = c["limit"] * ref
    if c["wait"]:
        kw["wait_fn"] = lambda m: None if m.get(parts[-1], 0) > 6 else 50.0 * sum(m.values())
        kw["max_queue_wait_s"] = 600.0
    want = brute(current, counts, fn, rates, c["objective"], c["overhead"], c["max_gpus"], min_gpus, c["maxp"], **kw)
    got = search(current, free, TYPES, fn, rates, c["objective"], c["overhead"], bound, max_gpus=c["max_gpus"],
                 min_gpus=min_gpus, max_partitions=c["maxp"], unit=c["unit"], exact_upto=c["exact"],
                 max_waits=10**6, max_evals=10**6, max_nodes=10**6, brute_max=0, **kw)   # no caps, no brute force
    assert "exact" in got.reason
    assert got.move == want.move
    (gv, gm), (wv, wm) = value(got, c["objective"]), value(want, c["objective"])
    assert gv == pytest.approx(wv, rel=1e-9, abs=1e-12), (got.reason, want.reason)
    assert gm == wm                              # the same tie-breaks as choose


def test_search_equals_brute_force_on_the_real_epoch_time():
    """The perf model's own bound under autoscale.epoch_time_fn (snapped forecast, optimal planner)."""
    from hpc_jabas.core.perf.perfmodel import PerfModel
    types = {"a100": "a100", "v100": "v100", "rtx2060": "rtx2060"}
    model = PerfModel.emulated(sorted(types.values()), [1, 2, 4, 8, 16, 32, 64, 128, 256], 0.002, 0.0002)
    fc, N = [70.4, 77.4, 85.2, 93.7], 4000
    bound = mixsearch.perf_bound(model, types, N, 256, forecast=fc, period=5, B_min=32)
    free = {"a100": 3, "v100": 4, "rtx2060": 4}
    cands = autoscale.enumerate_mixes(free, types, max_gpus=8)
    rates = autoscale.catalog_rates(types)
    # also with a run's measured overheads priced (core/autoscale/overheads.py): the bound ignores them and stays valid
    for ov in (None, Overheads(measure_share=0.25, measure_factor=1.7, epoch_end_s=3.0)):
        fn = autoscale.epoch_time_fn(model, types, fc, 5, N, None, B_min=32, B_max=256, overheads=ov)
        for m in cands:                               # the bound holds on every mix
            t = autoscale.price(m, fn, rates).time_s
            assert t is None or bound.mix_s(m) <= t
        for obj, kw in (("time", {}), ("cost", {}), ("time-under-budget", {"budget": 0.05}),
                        ("cost-under-deadline", {"deadline_s": 30.0})):
            want = choose({"v100": 2}, cands, fn, rates, obj, 30.0, remaining_epochs=3, **kw)
            got = search({"v100": 2}, free, types, fn, rates, obj, 30.0, bound, max_gpus=8, remaining_epochs=3,
                         brute_max=0, **kw)
            assert got.mix == want.mix and "exact" in got.reason, (obj, ov, got.reason, want.reason)


def test_a_node_cache_changes_no_decision():
    """Decisions that share a node_cache (same bound, other R, overhead, budget, current mix, caps) choose,
    explain and price exactly as fresh searches; another bound empties the cache."""
    from hpc_jabas.core.perf.perfmodel import PerfModel
    types = {p: p for p in ("a100", "v100", "rtx2060", "p100")}
    model = PerfModel.emulated(sorted(types.values()), [1, 2, 4, 8, 16, 32, 64], 0.002, 0.0002)
    fc, N = [70.4, 77.4, 85.2, 93.7], 4000
    fn = autoscale.epoch_time_fn(model, types, fc, 5, N, None, B_min=32, B_max=256)
    bound = mixsearch.perf_bound(model, types, N, 256, forecast=fc, period=5, B_min=32)
    free = {"a100": 8, "v100": 16, "rtx2060": 12, "p100": 8}
    rates = autoscale.catalog_rates(types)
    cache: dict = {}
    n_cached = 0
    for obj, kw in (("time", {}), ("cost", {}), ("time-under-budget", {"budget": 0.05}),
                    ("time-under-budget", {"budget": 0.02}), ("cost-under-deadline", {"deadline_s": 30.0})):
        for cur, R, over, caps in (({"v100": 2}, 3, 30.0, {}), ({"v100": 4, "a100": 2}, 0.7, 5.0, {}),
                                   ({"p100": 8}, 11, 0.0, {"max_nodes": 40}), ({"v100": 2}, 3, 30.0, {})):
            args = dict(max_gpus=24, remaining_epochs=R, brute_max=0, unit=2, exact_upto=1, **caps, **kw)
            want = search(cur, free, types, fn, rates, obj, over, bound, **args)
            got = search(cur, free, types, fn, rates, obj, over, bound, node_cache=cache, **args)
            assert (got.mix, got.reason, got.move, got.table) == (want.mix, want.reason, want.move, want.table)
            n_cached = max(n_cached, sum(len(v) for k, v in cache.items() if k != "bound"))
    assert n_cached > 10
    other = mixsearch.perf_bound(model, types, N, 256, forecast=[200.0], period=5, B_min=32)
    search({"v100": 2}, free, types, fn, rates, "time", 1.0, other, max_gpus=24, brute_max=0, node_cache=cache)
    assert cache["bound"] is other and all(len(v) <= 5000 for k, v in cache.items() if k != "bound")


def test_granularity_counts():
    assert allowed_counts(10, 4) == [0, 4, 8]
    assert allowed_counts(10, 4, exact_upto=2) == [0, 1, 2, 4, 8]
    assert allowed_counts(3, 1) == [0, 1, 2, 3]
    assert allowed_counts(1, 2) == [0]
    c = partition_counts({"a100": 9, "v100": 1, "p100": 6}, TYPES, 8, unit={"a100": 4, "p100": 2})
    assert c == {"a100": [0, 4, 8], "v100": [0, 1], "p100": [0, 2, 4, 6]}
    with pytest.raises(ConfigError, match="unit=0"):
        allowed_counts(4, 0)
    with pytest.raises(ConfigError, match="h100"):
        partition_counts({"a100": 2}, TYPES, 4, allowed=["h100"])


def test_no_mix_cap_at_cluster_scale():
    """65^4 = 17.8 million mixes: enumerate_mixes would list them; the search decides from a few."""
    peak = {p: s for p, s in zip(NAMES, (4.0, 2.0, 1.0, 0.5))}
    rates = {p: r for p, r in zip(NAMES, (4.0, 2.5, 1.0, 0.4))}
    fn = synthetic(peak, 0.01, 20, {p: 0.05 for p in NAMES})
    bound = Bound(SAMPLES, peak, 20, lambda n: 0.01 * math.log2(n + 1))
    free = {p: 64 for p in NAMES}
    for obj in ("time", "cost"):
        ch = search({"v100": 4}, free, TYPES, fn, rates, obj, 30.0, bound, max_gpus=256, remaining_epochs=5)
        assert ch.mix and "mixes priced" in ch.reason
    ch = search({"v100": 4}, free, TYPES, fn, rates, "time", 30.0, bound, max_gpus=256, max_evals=3)
    assert "work cap" in ch.reason            # a cut search says so (and how far from optimal it may be)


def test_queue_wait_is_priced_and_capped():
    peak = {"a100": 4.0, "v100": 2.0}
    rates = {"a100": 4.0, "v100": 2.0}
    fn = lambda m: SAMPLES / sum(k * peak[p] for p, k in m.items())
    bound = Bound(SAMPLES, peak)
    free = {"a100": 4, "v100": 4}
    # a100 would be 2x faster, but its partition is busy: 3 h of queue wait
    wait = lambda m: 10_800.0 if "a100" in m else 60.0
    ch = search({"v100": 2}, free, TYPES, fn, rates, "time", 0.0, bound, max_gpus=4, wait_fn=wait)
    assert ch.mix == {"v100": 4} and "queue estimates" in ch.reason and "queue wait priced 60 s" in ch.reason
    ch = search({"v100": 2}, free, TYPES, fn, rates, "time", 0.0, bound, max_gpus=4, wait_fn=wait,
                remaining_epochs=100)              # a long run pays the wait back
    assert ch.mix == {"a100": 4} and "queue wait priced 10800 s" in ch.reason
    ch = search({"v100": 2}, free, TYPES, fn, rates, "time", 0.0, bound, max_gpus=4, wait_fn=wait,
                remaining_epochs=100, max_queue_wait_s=3600.0)
    assert ch.mix == {"v100": 4}
    row = next(r for r in ch.table if r["label"] == "a100:4") if any(
        r["label"] == "a100:4" for r in ch.table) else None
    assert row is None or (not row["feasible"] and "max_queue_wait_s" in row["note"])
    # cost counts the run only: the wait does not change it
    ch = choose({"v100": 2}, [{"a100": 4}], fn, rates, "cost", 0.0, wait_fn=wait)
    r = next(r for r in ch.table if r["label"] == "a100:4")
    assert r["wait_s"] == 10_800.0 and r["total_cost"] == pytest.approx(SAMPLES / 16 / 3600 * 16)
    assert r["total_time_s"] == pytest.approx(SAMPLES / 16 + 10_800.0)


@settings(max_examples=40, deadline=None)
@given(fc=st.lists(st.floats(8.0, 600.0), min_size=1, max_size=5), period=st.integers(1, 8),
       samples=st.integers(50, 3000), lo=st.sampled_from([8, 16, 40]), width=st.sampled_from([0, 64, 500]),
       mb=st.sampled_from([None, 4, 16]),
       mix=st.dictionaries(st.sampled_from(["a100", "v100", "rtx2060"]), st.integers(1, 6), min_size=1))
def test_perf_bound_holds_under_the_real_epoch_time(fc, period, samples, lo, width, mb, mix):
    """L(n) <= autoscale.epoch_time_fn(n): peak throughput, the snapped iteration count, the one-micro-batch
    floor and the allreduce tail, on random forecasts, batch ranges, micro-batch settings and mixes."""
    from hpc_jabas.core.perf.perfmodel import AllreduceModel, PerfModel
    types = {"a100": "a100", "v100": "v100", "rtx2060": "rtx2060"}
    model = PerfModel.emulated(sorted(types.values()), [1, 2, 4, 8, 16, 32, 64, 128], 0.002, 0.0002, update_s=0.001,
                               allreduce=AllreduceModel(1.0, 0.001))
    fn = autoscale.epoch_time_fn(model, types, fc, period, samples, [mb] if mb else None, B_min=lo, B_max=lo + width)
    bound = mixsearch.perf_bound(model, types, samples, lo + width, forecast=fc, period=period, B_min=lo,
                                 micro_batch=mb)
    t = autoscale.price(mix, fn, autoscale.catalog_rates(types)).time_s
    assert t is None or bound.mix_s(mix) <= t * (1 + 1e-12)


def test_search_checks_its_arguments_like_choose():
    bound = Bound(SAMPLES, {"a100": 1.0, "v100": 1.0})
    fn = lambda m: 1.0
    rates = {"a100": 1.0, "v100": 1.0}
    free = {"a100": 2, "v100": 2}
    for kw, needle in ((dict(margin=1.0), "margin=1.0"), (dict(remaining_epochs=0), "remaining_epochs=0"),
                       (dict(objective="time-under-budget"), "budget"), (dict(objective="fastest"), "fastest"),
                       (dict(unit=0), "unit=0"), (dict(max_gpus=0), "max_gpus=0")):
        args = dict(objective="time", margin=0.05, remaining_epochs=1, unit=1, max_gpus=4)
        args.update(kw)
        with pytest.raises(ConfigError, match=needle):
            search({"v100": 1}, free, TYPES, fn, rates, args.pop("objective"), 0.0, bound, **args)
    with pytest.raises(ConfigError, match="peak throughput"):
        search({"v100": 1}, {**free, "p100": 1}, TYPES, fn, {**rates, "p100": 1.0}, "time", 0.0, bound, max_gpus=4)


@given(fc=st.lists(st.floats(1.0, 5000.0), min_size=1, max_size=6), period=st.integers(1, 20),
       samples=st.integers(1, 100_000), lo=st.integers(1, 64), width=st.integers(0, 4000), b0=st.integers(1, 32))
def test_snapped_iterations_never_grow_with_more_gpus(fc, period, samples, lo, width, b0):
    its = mixsearch.snapped_iterations(fc, period, samples, lo, lo + width, b0, 0.025)
    counts = [its(n) for n in (1, 2, 8, 64, 512, 4096)]
    assert counts == sorted(counts, reverse=True) and counts[-1] >= math.ceil(samples / (lo + width))


@given(fc=st.lists(st.floats(1.0, 5000.0), min_size=1, max_size=6), period=st.integers(1, 20),
       samples=st.integers(1, 100_000), lo=st.integers(1, 64), width=st.integers(0, 4000), b0=st.integers(1, 32),
       tol=st.sampled_from([0.0, 0.025, 0.5]))
def test_vectorised_snapped_iterations_equal_the_scalar_counts(fc, period, samples, lo, width, b0, tol):
    its = mixsearch.snapped_iterations(fc, period, samples, lo, lo + width, b0, tol)
    vec = mixbound.snapped_iterations_vec(fc, period, samples, lo, lo + width, b0, tol)
    ns = np.array([1, 2, 3, 7, 8, 64, 100, 511, 512, 4096], dtype=np.int64)
    assert vec(ns).tolist() == [its(int(n)) for n in ns]
    b = Bound(float(samples), {"v100": 1.0}, its, iters_vec=vec)
    assert b.iters_table(70).tolist() == [float(its(max(n, 1))) for n in range(71)]
    assert Bound(float(samples), {"v100": 1.0}, its).iters_table(9).tolist() == [float(its(max(n, 1)))
                                                                                 for n in range(10)]


@settings(max_examples=40, deadline=None)
@given(mix=st.dictionaries(st.sampled_from(["a100", "v100", "rtx2060", "p100"]), st.integers(1, 5), min_size=1),
       lo=st.integers(1, 60), width=st.integers(0, 400), mb=st.sampled_from([None, 2, 8, 48]),
       update=st.sampled_from([0.0, 0.003]))
def test_group_space_has_the_optimal_spaces_times(mix, lo, width, mb, update):
    """grouptimes.group_space: the B and the seconds of snapping.optimal_space, bit for bit, without plans."""
    from hpc_jabas.core.perf.perfmodel import PerfModel
    from hpc_jabas.core.planning.grouptimes import group_space
    from hpc_jabas.core.planning.space import optimal_space
    model = PerfModel.emulated(["a100", "v100", "rtx2060", "p100"], [1, 2, 4, 8, 16, 32, 64], 0.002, 0.0002,
                               update_s=update)
    gl = autoscale.expand_mix(mix, {p: p for p in mix})
    cands = [mb] if mb else None
    assert group_space(gl, model, lo, lo + width, cands).table() == optimal_space(gl, model, lo, lo + width,
                                                                                   cands).table()


def test_small_clusters_are_priced_whole_and_listed():
    """Up to BRUTE_MAX mixes and no queue wait: every mix priced and listed (the table of choose over all)."""
    peak = {"a100": 4.0, "v100": 2.0}
    fn = lambda m: SAMPLES / sum(k * peak[p] for p, k in m.items())
    free = {"a100": 2, "v100": 3}
    ch = search({"v100": 1}, free, TYPES, fn, {"a100": 4.0, "v100": 2.0}, "cost", 0.0, Bound(SAMPLES, peak), max_gpus=8)
    assert "all 11 mixes priced, exact" in ch.reason and len(ch.table) == 11
    ch = search({"v100": 1}, free, TYPES, fn, {"a100": 4.0, "v100": 2.0}, "cost", 0.0, Bound(SAMPLES, peak), max_gpus=8,
                brute_max=0)
    assert "nodes" in ch.reason and len(ch.table) <= 11


# ---- the search's parts, each on its own (core/autoscale/mixtree.py: Problem, Memo, NodeBound, Frontier, Incumbent)

def _problem(free, peak, rates, fn=None, objective="time", max_gpus=8, min_gpus=1, maxp=None, floor=None,
             current=None, R=1.0, overhead=0.0, **kw):
    floor = floor or {}
    bound = Bound(SAMPLES, peak, lambda n: max(5, 30 - 2 * n), lambda n: 0.05 * math.log2(n + 1), floor)
    fn = fn or synthetic(peak, 0.05, lambda n: max(5, 30 - 2 * n), {p: 0.1 for p in peak}, floor)
    counts = partition_counts(free, TYPES, max_gpus)
    return mixtree.Problem(counts, current or {}, fn, rates, objective, overhead, bound, R, max_gpus, min_gpus,
                             maxp, **kw)


@settings(max_examples=25, deadline=None)
@given(free=st.lists(st.integers(0, 5), min_size=3, max_size=3), peak=st.lists(st.floats(0.5, 8.0), min_size=3,
       max_size=3), rate=st.lists(st.floats(0.1, 5.0), min_size=3, max_size=3),
       floor=st.lists(st.sampled_from([0.0, 20.0, 200.0]), min_size=3, max_size=3), min_gpus=st.integers(1, 4),
       maxp=st.sampled_from([None, 1, 2]))
def test_node_bound_is_below_every_mix_of_the_subtree(free, peak, rate, floor, min_gpus, maxp):
    """NodeBound.children: a child's A (seconds of one epoch) and C (cost x 3600) are at most Bound.mix_s and
    Bound.mix_s x rate of every mix below it, at the first two levels of the tree (reference: Bound.mix_s)."""
    parts = NAMES[:3]
    pb = _problem({p: f for p, f in zip(parts, free)}, dict(zip(parts, peak)), dict(zip(parts, rate)),
                  max_gpus=8, min_gpus=min_gpus, maxp=maxp, floor=dict(zip(parts, floor)))
    if not pb.counts:
        return
    tables = mixtree.Tables(pb)
    order = tables.order("cost")
    nb = mixtree.NodeBound(pb, tables, order, need_cost=True)
    mixes = all_mixes(pb.counts, pb.max_gpus, min_gpus, maxp)
    checked = 0

    def check(ch, fixed):
        nonlocal checked
        for c, k in enumerate(ch.K.tolist()):
            below = [m for m in mixes if all(m.get(p, 0) == x for p, x in zip(order, fixed + (k,)))]
            for m in below:
                L = pb.bound.mix_s(m)
                assert ch.A[c] <= L * (1 + 1e-12)
                assert ch.C[c] <= L * autoscale.mix_rate(m, pb.rates) * (1 + 1e-12) + 1e-12
                checked += 1
    with np.errstate(divide="ignore", invalid="ignore"):
        root = nb.children(0, 0, 0.0, 0.0, 0.0, 0)         # None only when no mix reaches min_gpus
        assert root is not None or not mixes
        if root is None:
            return
        check(root, ())
        for c, k in enumerate(root.K.tolist()):
            if len(order) > 1:
                sub = nb.children(1, k, float(root.th[c]), float(root.rr[c]), root.fl_first if c == 0 else root.fmax,
                                  1 if k else 0)
                if sub is not None:
                    check(sub, (k,))
    assert checked >= len(mixes)


def test_memo_asks_each_mix_once_and_keeps_its_totals():
    calls, waits = [], []

    def fn(m):
        calls.append(dict(m))
        if "p100" in m:
            raise errors.InfeasibleError("p100 does not fit")
        return 100.0 * sum(m.values())
    pb = _problem({"a100": 4, "v100": 4, "p100": 2}, {"a100": 4.0, "v100": 2.0, "p100": 1.0},
                  {"a100": 3.0, "v100": 1.5, "p100": 1.0}, fn=fn, current={"v100": 1}, R=2.0, overhead=30.0,
                  wait_fn=lambda m: waits.append(dict(m)) or 7.0)
    memo = mixtree.Memo(pb)
    assert memo.price((("a100", 2),)) == (2 * 200.0 + 30.0 + 7.0, 2 * 200.0 * 6.0 / 3600 + 30.0 / 3600 * 6.0)
    assert memo.price((("a100", 2),)) is not None and len(calls) == 1 and len(waits) == 1
    assert memo.priced[(("a100", 2),)] == (437.0, pytest.approx(2 * 200.0 * 6.0 / 3600 + 30.0 * 6.0 / 3600), 2)
    assert memo.price((("v100", 1),)) == (200.0, 2 * 100.0 * 1.5 / 3600)     # staying: no move, no queue
    assert memo.price((("p100", 1),)) is None and memo.price((("p100", 1),)) is None
    assert len(calls) == 3 and (("p100", 1),) not in memo.priced and memo.work.evals == 3 and memo.work.waits == 1
    with pytest.raises(errors.InfeasibleError):
        memo.epoch_s({"p100": 1})
    assert len(calls) == 3


def test_incumbent_keeps_the_least_rank_and_prunes_strictly():
    inc = mixtree.Incumbent()
    assert not inc.beaten(1e300) and not inc.tied_and_worse(1.0, 1.0)
    assert inc.offer((("a", 1),), (10.0, 5.0, 1, (("a", 1),)))
    assert not inc.offer((("b", 1),), (10.0, 6.0, 1, (("b", 1),)))      # worse secondary
    assert inc.offer((("b", 2),), (10.0, 4.0, 2, (("b", 2),))) and inc.key == (("b", 2),)
    assert not inc.beaten(10.0) and not inc.beaten(10.0 * (1 + 1e-10)) and inc.beaten(10.001)
    assert inc.tied_and_worse(10.0, 4.1) and not inc.tied_and_worse(10.0, 4.0) and not inc.tied_and_worse(9.9, 9.0)


def test_frontier_pops_by_key_then_depth():
    fr = mixtree.Frontier()
    a = fr.add(mixtree.Chain(1, (), [0, 1], [3.0, 5.0], [0.0, 0.0], None, None, None, 0.0, 0.0, None, 0))
    b = fr.add(mixtree.Chain(2, (1,), [0], [3.0], [0.0], None, None, None, 0.0, 0.0, None, 1))
    assert fr.least() == math.inf and not fr
    fr.push(a, 1)
    fr.push(a, 0)
    fr.push(b, 0)
    assert fr.least() == 3.0 and len(fr) == 3
    assert [fr.pop() for _ in range(3)] == [(3.0, b, 0), (3.0, a, 0), (5.0, a, 1)]     # deeper first on ties
    fr.push(a, 1)
    fr.clear()
    assert not fr and fr.least() == math.inf


def test_tree_search_state_after_an_exact_run():
    """A run's parts after it ends: its incumbent is brute force's best mix, priced in the memo; nothing on
    the frontier could beat it; no cap cut it (unexplored: inf)."""
    peak = {"a100": 4.0, "v100": 2.0, "p100": 1.0}
    rates = {"a100": 4.0, "v100": 1.0, "p100": 0.3}
    pb = _problem({"a100": 3, "v100": 5, "p100": 6}, peak, rates, objective="cost", max_gpus=10, min_gpus=2)
    for primary in ("time", "cost"):
        ts = mixtree.TreeSearch(pb, mixtree.Memo(pb), primary, None)
        key, unexplored = ts.run()
        mixes = all_mixes(pb.counts, 10, 2)
        ref = min(mixes, key=lambda m: ((pb.epoch_time_fn(m), autoscale.price(m, pb.epoch_time_fn, rates).cost)
                                        if primary == "time" else (autoscale.price(m, pb.epoch_time_fn, rates).cost,
                                                                   pb.epoch_time_fn(m)), sum(m.values())))
        assert dict(key) == ref and key in ts.memo.priced and ts.best.key == key
        assert unexplored == math.inf and not ts.memo.work.cut
        assert ts.best.beaten(ts.frontier.least()) or not ts.frontier
        assert 0 < ts.memo.work.evals <= len(mixes) and ts.memo.work.nodes > 0


@settings(max_examples=20, deadline=None)
@given(mix=st.dictionaries(st.sampled_from(["a100", "v100", "rtx2060"]), st.integers(1, 4), min_size=1),
       lo=st.integers(1, 40), width=st.integers(0, 120), mb=st.sampled_from([None, 2, 8]))
def test_range_times_are_the_planners_own_times(mix, lo, width, mb):
    """planning.identical.RangeTimes (what grouptimes prices from): every B that plan_batch realises on the ranks,
    with model.iteration_time of plan_batch's plan, and no other B (reference: one plan_batch per B)."""
    from hpc_jabas.core.perf.perfmodel import PerfModel
    from hpc_jabas.core.planning.identical import RangeTimes, plan_batch
    model = PerfModel.emulated(["a100", "v100", "rtx2060"], [1, 2, 4, 8, 16, 32], 0.002, 0.0002, update_s=0.001)
    gl = autoscale.expand_mix(mix, {p: p for p in mix})
    cands = [mb] if mb else None
    want = []
    for B in range(lo, lo + width + 1):
        try:
            plan = plan_batch(B, gl, model, b_candidates=cands)
        except errors.InfeasibleError:
            continue
        want.append((B, model.iteration_time(plan, gl)))
    got = RangeTimes(gl, model, b_candidates=cands).rows(lo, lo + width)
    assert [b for b, _ in got] == [b for b, _ in want]
    assert [t for _, t in got] == pytest.approx([t for _, t in want], rel=1e-12)
