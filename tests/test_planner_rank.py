"""Per-rank micro-batch sizes: the exact planner vs brute force, never slower than identical b."""
from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_planner import instances

from hpc_jabas.core.perf.perfmodel import AllreduceModel, ComputeProfile, PerfModel, rank_time
from hpc_jabas.core.planning import Plan, plan_batch
from hpc_jabas.errors import ConfigError, InfeasibleError


def allowed(model, gpus, cands):
    """A_i as planner._rank_groups defines it."""
    out = []
    for g in gpus:
        cap = model.profile(g).max_b
        if cands is None:
            raw = {b for h in set(gpus) for b in model.profile(h).b}
            out.append(sorted({b for b in raw if b <= cap} | {cap}))
        else:
            out.append(sorted(b for b in cands if b <= cap))
    return out


def brute_per_rank(B, gpus, model, cands, sf):
    """Least iteration time over every split x (x_i >= 1) and every allowed b per rank."""
    sf = sf or [1.0] * len(gpus)
    A = allowed(model, gpus, cands)
    if any(not a for a in A) or B < len(gpus):
        return None
    best = None
    for cut in itertools.combinations(range(1, B), len(gpus) - 1):
        xs = [e - s for s, e in zip((0,) + cut, cut + (B,))]
        fin = max(min(rank_time(model.profile(g), b, -(-x // b), x, f) for b in a)
                  for g, a, x, f in zip(gpus, A, xs, sf))
        if best is None or fin < best:
            best = fin
    return best + model.allreduce_tail(len(gpus))


def check(B, model, gpus, sf, cands):
    want = brute_per_rank(B, gpus, model, cands, sf)
    try:
        plan = plan_batch(B, gpus, model, b_candidates=cands, speed_factors=sf, per_rank=True)
    except InfeasibleError as e:
        assert want is None, f"per-rank planner refused a feasible B={B}: {e}"
        return
    assert want is not None
    assert plan.B == B and plan.world_size == len(gpus) and min(plan.n) >= 1
    A = allowed(model, gpus, cands)
    for i, g in enumerate(gpus):
        assert plan.xs[i] <= model.profile(g).max_b * plan.n[i]
        assert max(plan.micro_sizes(i)) <= model.profile(g).max_b
        assert plan.n[i] == 1 or plan.bs[i] in A[i]
    got = model.iteration_time(plan, gpus, sf)
    assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12), (plan, got, want)
    # never slower than the identical-b optimum (same candidates), when that exists
    try:
        same = plan_batch(B, gpus, model, b_candidates=cands, speed_factors=sf)
    except InfeasibleError:
        return
    assert got <= model.iteration_time(same, gpus, sf) * (1 + 1e-12)


@settings(deadline=None, max_examples=300)
@given(instances(max_gpus=4, drop=False), st.integers(1, 12), st.booleans())
def test_per_rank_like_brute_force(inst, B, default):
    model, gpus, sf, cands, _ = inst
    check(B, model, gpus, sf, None if default else cands)


def test_per_rank_beats_identical_b_with_a_per_call_cost():
    """LB-BSP's point (docs/formulas.md, section 6): one big micro-batch pays the fixed cost once."""
    gpus = ["v100", "p100", "rtx2060"]
    m = PerfModel.emulated(gpus)
    per = plan_batch(480, gpus, m, per_rank=True)
    same = plan_batch(480, gpus, m)
    assert per.n == (1, 1, 1) and per.B == 480 and not per.identical_b
    assert m.iteration_time(per, gpus) < 0.9 * m.iteration_time(same, gpus)
    # memory caps force accumulation on the small GPU: more than one micro-batch, each within its cap
    big = plan_batch(2000, gpus, m, per_rank=True)
    cap = m.profile("rtx2060").max_b
    assert big.n[2] >= 2 and max(big.micro_sizes(2)) <= cap and big.B == 2000


def test_per_rank_non_monotone_profile_gives_a_valid_plan():
    prof = ComputeProfile("v100", b=[1, 2, 4], t=[1.0, 0.9, 2.0], max_b=4)
    m = PerfModel({"v100": prof})
    p = plan_batch(9, ["v100", "v100"], m, per_rank=True)
    assert p.B == 9 and max(max(p.micro_sizes(i)) for i in range(2)) <= 4


def test_per_rank_errors_are_one_line():
    m = PerfModel.emulated(["v100"])
    with pytest.raises(InfeasibleError, match="B >= 2"):
        plan_batch(1, ["v100", "v100"], m, per_rank=True)
    with pytest.raises(ConfigError, match="allow_drop"):
        plan_batch(8, ["v100", "v100"], m, per_rank=True, allow_drop=True)
    assert Plan.parse(str(plan_batch(77, ["v100", "v100"], m, per_rank=True))).B == 77


def test_cli_per_rank():
    from test_planner import cli
    rc, text = cli(["plan", "--batch", "512", "--gpus", "v100:2,p100,rtx2060", "--per-rank"])
    g = ["v100", "v100", "p100", "rtx2060"]
    m = PerfModel.emulated(sorted(set(g)))
    p = plan_batch(512, g, m, per_rank=True)
    assert rc == 0 and "per-rank micro-batches" in text
    assert f"{512 / m.iteration_time(p, g):.1f} samples/s" in text
    with pytest.raises(ConfigError, match="--per-rank plans one --batch"):
        cli(["plan", "--batch-range", "8:64", "--gpus", "v100:2", "--per-rank"])


@st.composite
def curved(draw):
    """Measured, monotone but otherwise arbitrary (convex or concave) profiles, odd measured sizes."""
    types = draw(st.lists(st.sampled_from(["v100", "p100", "rtx2060"]), min_size=1, max_size=2, unique=True))
    profs = {}
    for g in types:
        ts = sorted(draw(st.lists(st.floats(0.05, 3.0), min_size=3, max_size=3)))
        profs[g] = ComputeProfile(g, b=[1, 3, 7], t=ts, update_s=draw(st.sampled_from([0.0, 0.3])),
                                  max_b=draw(st.integers(2, 9)))
    n = draw(st.integers(1, 3))
    gpus = draw(st.lists(st.sampled_from(types), min_size=n, max_size=n))
    sf = draw(st.one_of(st.none(), st.lists(st.sampled_from([0.5, 1.0, 1.5]), min_size=n, max_size=n)))
    return PerfModel(profs), gpus, sf


@settings(deadline=None, max_examples=200)
@given(curved(), st.integers(1, 14))
def test_per_rank_like_brute_force_curved_profiles(inst, B):
    model, gpus, sf = inst
    check(B, model, gpus, sf, None)


@settings(deadline=None, max_examples=150)
@given(instances(max_gpus=6), st.integers(1, 30))
def test_numpy_slot_counts_equal_the_python_ones(inst, B):
    """Many groups (1024 ranks, each its own speed factor) run the slot counts in numpy: same plans."""
    from hpc_jabas.core.planning import slots as planner_solve
    model, gpus, sf, cands, drop = inst

    def both():
        try:
            return plan_batch(B, gpus, model, b_candidates=cands, speed_factors=sf, allow_drop=drop)
        except InfeasibleError as e:
            return str(e)
    saved = planner_solve.VEC
    try:
        planner_solve.VEC = 10**9
        want = both()
        planner_solve.VEC = 1
        got = both()
    finally:
        planner_solve.VEC = saved
    assert got == want


@settings(deadline=None, max_examples=100)
@given(instances(max_gpus=5, drop=False), st.integers(1, 20), st.integers(0, 40))
def test_per_rank_range_times_equal_single_plans(inst, lo, width):
    from hpc_jabas.core.planning import per_rank_times
    model, gpus, sf, _, _ = inst
    try:
        rows = per_rank_times(lo, lo + width, gpus, model, speed_factors=sf)
    except InfeasibleError:
        return
    assert [B for B, _ in rows] == list(range(max(lo, len(gpus)), lo + width + 1))
    for B, sec in rows:
        plan = plan_batch(B, gpus, model, speed_factors=sf, per_rank=True)
        assert math.isclose(sec, model.iteration_time(plan, gpus, sf), rel_tol=1e-12, abs_tol=1e-12), (B, plan)


def test_per_rank_batch_space_every_B_with_per_rank_times():
    from hpc_jabas.core.planning import GROW, job_batch_space, snap_toward
    g = ["v100", "p100", "rtx2060"]
    m = PerfModel.emulated(g)
    cfg = type("C", (), {"planner": "optimal", "micro_batch": None, "B_min": 2, "B_max": 300})()
    space = job_batch_space(cfg, g, m, per_rank=True, speed_factors=[1.0, 0.5, 2.0])
    assert [B for B, _ in space.table()] == list(range(3, 301))
    p = plan_batch(97, g, m, per_rank=True, speed_factors=[1.0, 0.5, 2.0])
    assert math.isclose(space.iter_time(97), m.iteration_time(p, g, [1.0, 0.5, 2.0]), rel_tol=1e-12)
    assert snap_toward(space, 96, GROW, 97.0).B == 97   # every B is realisable per rank
    same = job_batch_space(cfg, g, m)
    assert not same.is_realisable(97) or same.iter_time(97) >= space.iter_time(97)


@st.composite
def bumpy(draw):
    """Measured profiles with dips (t not monotone in b), arbitrary measured sizes, 1-4 ranks."""
    types = draw(st.lists(st.sampled_from(["v100", "p100", "rtx2060"]), min_size=1, max_size=2, unique=True))
    profs = {}
    for g in types:
        bs = sorted(draw(st.sets(st.integers(1, 12), min_size=2, max_size=5)))
        ts = draw(st.lists(st.floats(0.05, 4.0), min_size=len(bs), max_size=len(bs)))
        profs[g] = ComputeProfile(g, b=bs, t=ts, update_s=draw(st.sampled_from([0.0, 0.3])),
                                  max_b=draw(st.integers(bs[0], 14)))
    ar = AllreduceModel(a=draw(st.sampled_from([0.0, 1e-3, 0.5])), c=0.0, bandwidth=1.0)
    n = draw(st.integers(1, 4))
    gpus = draw(st.lists(st.sampled_from(types), min_size=n, max_size=n))
    sf = draw(st.one_of(st.none(), st.lists(st.sampled_from([0.5, 1.0, 1.5]), min_size=n, max_size=n)))
    cands = draw(st.one_of(st.none(), st.just(sorted({b for p in profs.values() for b in p.b}))))
    return PerfModel(profs, ar, grad_bytes=1.0), gpus, sf, cands


@settings(deadline=None, max_examples=200)
@given(bumpy(), st.integers(1, 40), st.integers(0, 30))
def test_non_monotone_profiles_plan_and_price_alike(inst, lo, width):
    """On any measured profile the per-rank plan is never slower than the identical-b plan,
    and per_rank_times (what the batch space and the auto-scaler read) is the returned plan's price."""
    from hpc_jabas.core.planning import per_rank_times
    model, gpus, sf, cands = inst
    try:
        rows = per_rank_times(lo, lo + width, gpus, model, b_candidates=cands, speed_factors=sf)
    except (InfeasibleError, ConfigError):
        return
    for B, sec in rows:
        plan = plan_batch(B, gpus, model, b_candidates=cands, speed_factors=sf, per_rank=True)
        got = model.iteration_time(plan, gpus, sf)
        assert plan.B == B and math.isclose(sec, got, rel_tol=1e-12, abs_tol=1e-12), (B, plan, sec, got)
        try:
            same = plan_batch(B, gpus, model, b_candidates=cands, speed_factors=sf)
        except InfeasibleError:
            continue
        assert got <= model.iteration_time(same, gpus, sf) * (1 + 1e-12), (B, plan, same)   # 1 ulp: float ties


def test_issue_example_non_monotone_profile():
    """b = [1, 4, 8], t = [1.0, 3.0, 2.5] on 2 ranks: the old per-rank plan cost 5.50 s at B = 24
    against 5.00 s for identical b, and per_rank_times said 6.00 s at B = 32 for a 5.00 s plan."""
    from hpc_jabas.core.planning import per_rank_times
    m = PerfModel({"v100": ComputeProfile("v100", b=[1, 4, 8], t=[1.0, 3.0, 2.5])}, AllreduceModel(1e-3, 0.0, 1.0),
                  grad_bytes=1.0)
    g = ["v100", "v100"]
    rows = dict(per_rank_times(2, 40, g, m))
    for B in (24, 32):
        per, same = plan_batch(B, g, m, per_rank=True), plan_batch(B, g, m)
        assert m.iteration_time(per, g) <= m.iteration_time(same, g)
        assert rows[B] == m.iteration_time(per, g)
    assert rows[24] == pytest.approx(5.0 + m.allreduce_tail(2))
