"""Planner: exact optimum vs brute force, exact B, caps, ties, range table, snapping, errors, CLI."""
from __future__ import annotations

import argparse
import io
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_jabas.cli import plan as cli_plan
from hpc_jabas.core.perf.perfmodel import AllreduceModel, ComputeProfile, PerfModel
from hpc_jabas.core.planning import Plan, plan_batch, plan_range, snap_batch
from hpc_jabas.errors import ConfigError, InfeasibleError

TYPES = ["v100", "p100", "rtx2060", "titan-v", "a100"]
MEASURED = [1, 2, 3, 4, 5, 6]
NICE = [0.0, 0.25, 0.5, 1.0, 1.5, 2.0]           # exact binary fractions: produce exact ties


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


# -- brute force --------------------------------------------------------------------------------

def compositions(total: int, lows: list[int]):
    """All tuples n with n_i >= lows[i] (lows[i] < 0: rank fixed at 0) summing to total."""
    if not lows:
        if total == 0:
            yield ()
        return
    lo = lows[0]
    if lo < 0:
        for rest in compositions(total, lows[1:]):
            yield (0,) + rest
        return
    rest_min = sum(max(x, 0) for x in lows[1:])
    for first in range(lo, total - rest_min + 1):
        for rest in compositions(total - first, lows[1:]):
            yield (first,) + rest


def brute(B, gpus, model, cands, allow_drop, sf=None):
    """(best time, set of b reaching it, all optimal plans) by full enumeration, or None."""
    sf = sf or [1.0] * len(gpus)
    best = None
    for b in cands:
        if B % b:
            continue
        M = B // b
        caps = [model.profile(g).max_b for g in gpus]
        if not allow_drop and any(c < b for c in caps):
            continue
        lows = [(0 if allow_drop else 1) if c >= b else -1 for c in caps]
        t = [model.t_micro(g, b, f) if c >= b else None for g, f, c in zip(gpus, sf, caps)]
        u = [model.profile(g).update_s for g in gpus]
        for n in compositions(M, lows):
            if sum(n) == 0:
                continue
            fin = max(k * ti + ui for k, ti, ui in zip(n, t, u) if k > 0)
            val = fin + model.allreduce_tail(sum(1 for k in n if k > 0))
            if best is None or val < best[0]:
                best = [val, {b}, [Plan(b, n)]]
            elif val == best[0]:
                best[1].add(b)
                best[2].append(Plan(b, n))
    return best


@st.composite
def instances(draw, max_gpus=6, drop=None):
    k = draw(st.integers(1, 3))
    types = draw(st.lists(st.sampled_from(TYPES), min_size=k, max_size=k, unique=True))
    coef = st.one_of(st.sampled_from(NICE), st.floats(0.0, 2.0))
    profiles = {}
    for g in types:
        c0, c1 = draw(coef), draw(coef)
        if c0 + c1 < 0.01:          # keep micro-batch times well above float resolution
            c0 += 0.01
        upd = draw(st.one_of(st.sampled_from(NICE), st.floats(0.0, 1.0)))
        cap = draw(st.integers(1, 6))
        profiles[g] = ComputeProfile(g, b=MEASURED, t=[c0 + c1 * b for b in MEASURED], update_s=upd, max_b=cap)
    ar = AllreduceModel(a=draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])), c=draw(st.sampled_from([0.0, 0.25, 1.0])),
                        bandwidth=1.0)
    model = PerfModel(profiles, ar, grad_bytes=draw(st.sampled_from([0.0, 1.0, 2.0])),
                      overlap=draw(st.sampled_from([0.0, 0.5, 1.0])))
    n = draw(st.integers(1, max_gpus))
    gpus = draw(st.lists(st.sampled_from(types), min_size=n, max_size=n))
    sf = draw(st.one_of(st.none(), st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=n, max_size=n)))
    cands = sorted(draw(st.sets(st.integers(1, 4), min_size=1, max_size=4)))
    allow_drop = draw(st.booleans()) if drop is None else drop
    return model, gpus, sf, cands, allow_drop


def check_against_brute(B, model, gpus, sf, cands, allow_drop):
    want = brute(B, gpus, model, cands, allow_drop, sf)
    try:
        plan = plan_batch(B, gpus, model, b_candidates=cands, speed_factors=sf, allow_drop=allow_drop)
    except InfeasibleError as e:
        assert want is None, f"planner refused a feasible B={B}: {e}"
        assert "\n" not in str(e)
        return None
    assert want is not None, f"planner returned {plan} but nothing is feasible"
    assert plan.B == B and plan.b in cands
    assert len(plan.n) == len(gpus)
    for g, k in zip(gpus, plan.n):
        if k > 0:
            assert plan.b <= model.profile(g).max_b
        if not allow_drop:
            assert k >= 1
    got = model.iteration_time(plan, gpus, sf)
    assert got == want[0], (plan, got, want)
    assert plan.b == max(want[1])                      # ties: the larger b
    assert plan in want[2]
    # interchangeable ranks (same type, same speed factor): the lower index gets at least as many
    sfl = sf or [1.0] * len(gpus)
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            if gpus[i] == gpus[j] and sfl[i] == sfl[j]:
                assert plan.n[i] >= plan.n[j], plan
    assert plan == plan_batch(B, gpus, model, b_candidates=cands, speed_factors=sf, allow_drop=allow_drop)
    return plan


@settings(deadline=None, max_examples=250)
@given(instances(drop=False), st.integers(1, 24))
def test_optimal_like_brute_force_all_ranks_run(inst, B):
    check_against_brute(B, *inst)


@settings(deadline=None, max_examples=200)
@given(instances(max_gpus=4, drop=True), st.integers(1, 14))
def test_optimal_like_brute_force_with_dropping(inst, B):
    check_against_brute(B, *inst)


@settings(deadline=None, max_examples=60)
@given(instances(max_gpus=4), st.integers(1, 20), st.integers(0, 20))
def test_range_table_equals_single_plans(inst, lo, width):
    model, gpus, sf, cands, allow_drop = inst
    hi = lo + width
    try:
        rows = plan_range(lo, hi, gpus, model, b_candidates=cands, speed_factors=sf, allow_drop=allow_drop)
    except InfeasibleError as e:      # e.g. no candidate b fits a memory cap: then no B is feasible
        assert "max_b" in str(e)
        rows = []
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    table = {B: (p, s) for B, p, s in rows}
    for B in range(lo, hi + 1):
        try:
            p = plan_batch(B, gpus, model, b_candidates=cands, speed_factors=sf, allow_drop=allow_drop)
        except InfeasibleError:
            assert B not in table
            continue
        assert table[B][0] == p and table[B][0] == Plan(p.b, p.n)
        assert table[B][1] == model.iteration_time(p, gpus, sf)


@settings(deadline=None, max_examples=80)
@given(instances(max_gpus=4), st.floats(0.5, 40.0), st.integers(1, 20), st.integers(0, 25))
def test_snap_is_nearest_feasible_ties_to_smaller(inst, target, lo, width):
    model, gpus, sf, cands, allow_drop = inst
    hi = lo + width
    kw = dict(b_candidates=cands, speed_factors=sf, allow_drop=allow_drop)
    feasible = []
    for B in range(lo, hi + 1):
        try:
            plan_batch(B, gpus, model, **kw)
            feasible.append(B)
        except InfeasibleError:
            pass
    if not feasible:
        with pytest.raises(InfeasibleError):
            snap_batch(target, gpus, model, B_min=lo, B_max=hi, **kw)
        return
    want = min(feasible, key=lambda B: (abs(B - target), B))
    assert snap_batch(target, gpus, model, B_min=lo, B_max=hi, **kw) == want


def test_snap_without_bounds():
    m = PerfModel.emulated(["v100", "p100"], b_list=[8, 16])
    g = ["v100"] * 2 + ["p100"] * 2
    assert snap_batch(100, g, m) == 96            # multiples of 8 (M >= 4): 96 and 104 -> 96 is nearer
    assert snap_batch(100.0, g, m) == 96
    assert snap_batch(4, g, m) == 32              # the smallest feasible: b=8 on 4 GPUs
    assert snap_batch(12, g, m, b_candidates=[8, 16], allow_drop=True) == 8   # tie 8/16 -> smaller
    assert snap_batch(1000, g, m, B_max=500) == 496
    with pytest.raises(InfeasibleError) as e:
        snap_batch(100, g, m, B_min=33, B_max=39)
    assert "no feasible" in one_line(e)
    with pytest.raises(ConfigError):
        snap_batch(float("nan"), g, m)
    with pytest.raises(ConfigError):
        snap_batch(100, g, m, B_min=50, B_max=40)


# -- ties, defaults, determinism -----------------------------------------------------------------

def test_ties_prefer_larger_b():
    prof = ComputeProfile("v100", b=[1, 2, 4, 8], t=[0.5, 1.0, 2.0, 4.0], max_b=8)   # t = b/2: B/2 for any b
    m = PerfModel({"v100": prof}, AllreduceModel(0.0, 0.0, 1.0), grad_bytes=0.0)
    assert plan_batch(24, ["v100"], m) == Plan(8, (3,))
    assert plan_batch(6, ["v100"], m) == Plan(2, (3,))


def test_lower_rank_gets_more_and_same_result_when_permuted():
    m = PerfModel.emulated(["v100", "p100"], b_list=[4])
    p = plan_batch(4 * 7, ["v100", "v100", "v100"], m)
    assert p.n == (3, 2, 2)
    a = plan_batch(4 * 11, ["v100", "p100", "v100"], m)
    b = plan_batch(4 * 11, ["v100", "v100", "p100"], m)
    assert sorted(a.n) == sorted(b.n) and a.n[0] >= a.n[2] and b.n[0] >= b.n[1]
    assert m.iteration_time(a, ["v100", "p100", "v100"]) == m.iteration_time(b, ["v100", "v100", "p100"])


def test_default_candidates_respect_every_cap_unless_dropping():
    # large fixed cost: bigger micro-batches are better, so the cap decides b
    m = PerfModel.emulated(["v100", "rtx2060"], base_s=1.0, per_sample_s=0.0001)
    assert m.profile("rtx2060").max_b < m.profile("v100").max_b
    g = ["v100", "rtx2060"]
    p = plan_batch(4096, g, m)
    assert p.b == 64 and all(k >= 1 for k in p.n)                 # 64 <= 96 (rtx2060) < 128
    d = plan_batch(4096, g, m, allow_drop=True)
    assert d.b > m.profile("rtx2060").max_b and d.n[1] == 0      # rtx2060 dropped, v100 takes big b


def test_speed_factors_shift_work():
    m = PerfModel.emulated(["v100"], b_list=[8])
    even = plan_batch(8 * 8, ["v100"] * 2, m)
    skew = plan_batch(8 * 8, ["v100"] * 2, m, speed_factors=[3.0, 1.0])
    assert even.n == (4, 4) and skew.n[0] > skew.n[1]


def test_large_allocation_is_fast_and_exact_in_B():
    types = {"v100": 160, "p100": 160, "a100": 128, "h100": 64, "rtx3090": 128,
             "titan-rtx": 128, "titan-v": 128, "p4000": 128}
    g = [t for t, k in types.items() for _ in range(k)]
    m = PerfModel.emulated(types, b_list=[8, 16, 32, 64, 128])
    t0 = time.perf_counter()
    p = plan_batch(40000, g, m)
    assert time.perf_counter() - t0 < 0.5
    assert p.B == 40000 and min(p.n) >= 1
    rows = plan_range(30000, 32768, g, m)
    assert rows and all(B == pl.B for B, pl, _ in rows)
    for B, pl, s in rows[::97]:
        assert pl == plan_batch(B, g, m) and s == m.iteration_time(pl, g)
    d = plan_batch(5000, g, m, allow_drop=True)
    assert d.B == 5000


# -- errors -------------------------------------------------------------------------------------

@pytest.fixture
def mix():
    return PerfModel.emulated(["v100", "p100", "rtx2060"], b_list=[8, 16, 32, 64, 128]), \
        ["v100"] * 2 + ["p100"] * 2 + ["rtx2060"] * 4


@pytest.mark.parametrize("B", [0, -8, 2.5, "64", True, None])
def test_bad_B(mix, B):
    m, g = mix
    with pytest.raises(ConfigError) as e:
        plan_batch(B, g, m)
    assert "B=" in one_line(e) and "positive integer" in str(e.value)


def test_error_cases(mix):
    m, g = mix
    with pytest.raises(ConfigError) as e:
        plan_batch(256, g + ["k80"], m)
    assert "k80" in one_line(e) and "known types" in str(e.value)
    with pytest.raises(ConfigError) as e:
        plan_batch(256, g + ["a100"], m)
    assert "no compute profile" in one_line(e) and "a100" in str(e.value)
    with pytest.raises(InfeasibleError) as e:
        plan_batch(4096, g, m, b_candidates=[128])
    msg = one_line(e)
    assert "rtx2060" in msg and "max_b=96" in msg and "b=128" in msg
    with pytest.raises(InfeasibleError) as e:
        plan_batch(32, g, m)
    msg = one_line(e)
    assert "too small" in msg and "8 GPUs" in msg and "64" in msg
    with pytest.raises(InfeasibleError) as e:
        plan_batch(1001, g, m, b_candidates=[8, 16])
    msg = one_line(e)
    assert "B=1001" in msg and "[8, 16]" in msg and "nearest feasible B is 1000" in msg
    with pytest.raises(ConfigError) as e:
        plan_batch(1000, g, m, b_candidates=[])
    assert "empty" in one_line(e)
    with pytest.raises(ConfigError):
        plan_batch(1000, g, m, b_candidates=[0, 8])
    with pytest.raises(ConfigError) as e:
        plan_batch(1000, [], m)
    assert "no GPU" in one_line(e)
    with pytest.raises(ConfigError) as e:
        plan_batch(1000, g, m, speed_factors=[1.0])
    assert "speed factors" in one_line(e)
    with pytest.raises(ConfigError):
        plan_batch(1000, g, m, speed_factors=[1.0] * 7 + [0.0])
    with pytest.raises(InfeasibleError) as e:
        plan_batch(4096, ["rtx2060"], m, b_candidates=[128], allow_drop=True)
    assert "max_b=96" in one_line(e)
    tiny = PerfModel({"v100": ComputeProfile("v100", b=[1], t=[1e-20], update_s=1.0)})
    with pytest.raises(ConfigError) as e:          # a profile the user gave that no solver can use
        plan_batch(4, ["v100"], tiny)
    assert "too small" in one_line(e)
    with pytest.raises(ConfigError) as e:
        plan_range(500, 400, g, m)
    assert "empty" in one_line(e)
    with pytest.raises(ConfigError):
        plan_range(0, 400, g, m)
    assert plan_range(1, 63, g, m) == []


# -- CLI ----------------------------------------------------------------------------------------

def cli(argv):
    parser = argparse.ArgumentParser(prog="hpc-jabas")
    cli_plan.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    out = io.StringIO()
    rc = args.func(args, out=out)
    return rc, out.getvalue()


def test_cli_single_batch(tmp_path):
    rc, text = cli(["plan", "--batch", "2048", "--gpus", "v100:4,p100:4,rtx2060:8"])
    assert rc == 0
    assert "v100" in text and "rtx2060" in text and "predicted throughput" in text and "idle" in text
    m = PerfModel.emulated(["v100", "p100", "rtx2060"])
    g = ["v100"] * 4 + ["p100"] * 4 + ["rtx2060"] * 8
    p = plan_batch(2048, g, m)
    assert f"micro-batch b={p.b}" in text
    assert f"{2048 / m.iteration_time(p, g):.1f} samples/s" in text
    m.save(tmp_path / "prof")
    rc, text2 = cli(["plan", "--batch", "2048", "--gpus", "v100:4,p100:4,rtx2060:8", "--profile",
                     str(tmp_path / "prof")])
    assert rc == 0 and f"micro-batch b={p.b}" in text2


def test_cli_range_and_extrapolation_note(tmp_path):
    rc, text = cli(["plan", "--batch-range", "256:1024", "--gpus", "v100:2,p100:2", "--b-candidates", "16,32"])
    lines = [ln for ln in text.splitlines() if ln.strip() and ln.split()[0].isdigit() and "feasible" not in ln]
    m = PerfModel.emulated(["v100", "p100"])
    rows = plan_range(256, 1024, ["v100"] * 2 + ["p100"] * 2, m, b_candidates=[16, 32])
    assert rc == 0 and len(lines) == len(rows) and lines[0].split()[0] == "256"
    prof = PerfModel({"v100": ComputeProfile("v100", b=[8, 16], t=[0.1, 0.15], max_b=64)},
                     AllreduceModel(1.0, 0.0, 1e9), grad_bytes=1e6)
    prof.save(tmp_path / "p")
    rc, text = cli(["plan", "--batch", "256", "--gpus", "v100:2", "--profile", str(tmp_path / "p"),
                    "--b-candidates", "32,64"])
    assert rc == 0 and "extrapolated" in text


@pytest.mark.parametrize("argv, needle", [
    (["plan", "--batch", "2048", "--gpus", "v100:4,k80:2"], "k80"),
    (["plan", "--batch", "2048", "--gpus", "v100:x"], "GPU count in 'v100:x'='x' is invalid; it must be an integer"),
    (["plan", "--batch", "2048", "--gpus", "v100:0"], ">= 1"),
    (["plan", "--batch", "abc", "--gpus", "v100:4"], "--batch='abc' is invalid; it must be an integer in 1..10000000"),
    (["plan", "--batch", "9" * 41, "--gpus", "v100:4"], "--batch='" + "9" * 36 + "...' is invalid"),
    (["plan", "--batch", "3", "--gpus", "v100:4"], "too small"),
    (["plan", "--batch-range", "300", "--gpus", "v100:4"], "LO:HI"),
    (["plan", "--batch", "64", "--gpus", "v100:4", "--profile", "/nonexistent/dir"], "does not exist"),
    (["plan", "--batch", "64", "--gpus", "v100:4", "--profile", "x", "--emulated"], "exclude"),
])
def test_cli_errors_are_one_line_exit_2(argv, needle, capsys):
    assert cli_plan.main(argv) == 2
    err = capsys.readouterr()
    assert err.out == ""
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("hpc-jabas: error:")
