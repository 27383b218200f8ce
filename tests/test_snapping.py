"""The direction-preserving snap (core/planning/space.py): a property test over catalog mixes and both
planners, plus the cases the issue names."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc_jabas.core.config import gpus as catalog
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning import (
    BatchSpace,
    job_batch_space,
    lbbsp_speeds,
    optimal_space,
    plan_batch,
    proportional_plan,
    snap_nearest,
    snap_toward,
)
from hpc_jabas.errors import InfeasibleError

B_LIST = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TYPES = catalog.known()


class Cfg:
    def __init__(self, planner, micro_batch, B_min, B_max, speeds=None):
        self.planner, self.micro_batch, self.B_min, self.B_max, self.speeds = planner, micro_batch, B_min, B_max, speeds


def realisable_set(cfg, gpus, model):
    """Independent oracle: the B in range the trainer's planner realises exactly."""
    out = set()
    for B in range(cfg.B_min, cfg.B_max + 1):
        if cfg.planner == "optimal":
            try:
                plan = plan_batch(B, gpus, model, b_candidates=[cfg.micro_batch] if cfg.micro_batch else None)
            except InfeasibleError:
                continue
        else:
            b = cfg.micro_batch or 1
            if B % b or B < b:
                continue
            plan = proportional_plan(B, b, lbbsp_speeds(gpus))
        assert plan.B == B
        out.add(B)
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=st.lists(st.sampled_from(TYPES), min_size=1, max_size=8),
       planner=st.sampled_from(["optimal", "lbbsp"]),
       micro_batch=st.sampled_from([None, None, 2, 4, 8, 16, 32]),
       B_min=st.integers(1, 64), width=st.integers(0, 300),
       alpha=st.sampled_from([0.01, 0.05, 0.1, 0.25, 0.5]))
def test_every_decision_keeps_its_direction(gpus, planner, micro_batch, B_min, width, alpha):
    B_max = B_min + width
    model = PerfModel.emulated(gpus, B_LIST, 0.002, 0.0002)
    cfg = Cfg(planner, micro_batch, B_min, B_max)
    space = job_batch_space(cfg, gpus, model)
    real = realisable_set(cfg, gpus, model)
    assert {B for B, _ in space.table()} == real
    if not real:
        with pytest.raises(InfeasibleError):
            snap_toward(space, B_min, "stay")
        return
    lo, hi = min(real), max(real)
    for B in range(B_min, B_max + 1):
        g = snap_toward(space, B, "grow", min(B * (1 + alpha), B_max))
        s = snap_toward(space, B, "shrink", max(B * (1 - alpha), B_min))
        k = snap_toward(space, B, "stay")
        assert {g.B, s.B, k.B} <= real
        if B in real:
            assert g.B > B or B == hi, (B, g)
            assert s.B < B or B == lo, (B, s)
            assert k.B == B and not k.moved
            assert g.moved == (g.B != B) and s.moved == (s.B != B)
            if not g.moved:
                assert "could not grow" in g.note
            if not s.moved:
                assert "could not shrink" in s.note
        else:                    # a B this mix cannot run (after a move): never the wrong way if avoidable
            assert g.B > B or not any(x > B for x in real)
            assert s.B < B or not any(x < B for x in real)
            assert "pulled" in k.note
        # the nearest to the target on the right side; ties (equal up to float noise, e.g. 25 * 1.1 =
        # 27.500000000000004) to the nearer B; on a grain space the roundest within 2.5% first
        above = [x for x in real if x > B]
        below = [x for x in real if x < B]
        if B in real and above:
            assert g.B == oracle(above, min(B * (1 + alpha), B_max), B, space.grain)
        if B in real and below:
            assert s.B == oracle(below, max(B * (1 - alpha), B_min), B, space.grain)
    assert space.grain == (planner == "optimal" and micro_batch is None)


def oracle(cands, t, B, grain):
    """The snap rule written out (module docstring of planning/space.py)."""
    d = lambda x: round(abs(x - t), 6)   # noqa: E731
    if grain:
        band = min(d(x) for x in cands) + 0.025 * max(t, 1.0) + 1e-6
        near = [x for x in cands if d(x) <= band]
        top = max(min(x & -x, 8) for x in near)
        cands = [x for x in near if min(x & -x, 8) == top]
    return min(cands, key=lambda x: (d(x), abs(x - B), x))


@pytest.fixture(scope="module")
def three():
    gpus = ["v100", "p100", "rtx2060"]
    return gpus, PerfModel.emulated(gpus, B_LIST, 0.002, 0.0002)


def test_issue_example_grow_moves_and_is_never_broken_by_throughput(three):
    gpus, model = three
    per_rank = optimal_space(gpus, model, 16, 1024, per_rank=True)
    # per-rank sizes run every B with full micro-batches: the nearest wins (the old rule broke
    # near-ties by throughput, which on this space always took the largest B: drift upward)
    assert snap_toward(per_rank, 128, "grow", 140.8).B == 141
    assert snap_toward(per_rank, 128, "shrink", 115.2).B == 115
    space = optimal_space(gpus, model, 16, 1024)
    g = snap_toward(space, 128, "grow", 140.8)
    assert g.B > 128 and g.moved
    # identical b: 141 = 3 x 47 is realisable only with b = 1; within 2.5% the roundest B wins
    # (144 = 16 x 9), by its factors of two, not by its throughput (which would be mix-dependent)
    assert space.is_realisable(141) and g.B == 144 and space.grain
    assert space.throughput(144) > 2 * space.throughput(141)
    assert snap_toward(space, 128, "shrink", 115.2).B == 116          # 4 x 29; 112 is beyond 2.5%


def test_ties_go_to_the_nearer_B_then_the_smaller():
    even = BatchSpace(2, 100, lambda lo, hi: [(B, 1.0) for B in range(lo, hi + 1) if B % 2 == 0])
    assert snap_toward(even, 40, "grow", 45.0).B == 44          # 44 and 46 tie: nearer to 40
    assert snap_toward(even, 50, "shrink", 45.0).B == 46        # 44 and 46 tie: nearer to 50
    assert snap_toward(even, 40, "set", 45.0).B == 44 and snap_toward(even, 50, "set", 45.0).B == 46
    assert snap_nearest(even, 45.0) == 44                       # no current B: the smaller
    # times never matter: the same set with other times gives the same answers
    fast_big = BatchSpace(2, 100, lambda lo, hi: [(B, 1.0 / B) for B in range(lo, hi + 1) if B % 2 == 0])
    for B in range(2, 101, 2):
        for f in (0.75, 0.9, 1.1, 1.25):
            d = "grow" if f > 1 else "shrink"
            assert snap_toward(even, B, d, B * f) == snap_toward(fast_big, B, d, B * f)


def test_micro_batch_set_and_lbbsp(three):
    gpus, model = three
    sp = job_batch_space(Cfg("optimal", 8, 16, 512), gpus, model)
    assert all(B % 8 == 0 and B >= 24 for B, _ in sp.table())
    assert snap_toward(sp, 128, "grow", 140.8).B == 144
    assert snap_toward(sp, 504, "grow", 512).B == 512
    lb = job_batch_space(Cfg("lbbsp", 4, 16, 96), gpus, model)
    assert [B for B, _ in lb.table()] == list(range(16, 97, 4))
    assert snap_toward(lb, 64, "grow", 70.4).B == 72 and snap_toward(lb, 96, "grow", 105.6).B == 96


def test_set_and_nearest():
    sp = BatchSpace(10, 100, lambda lo, hi: [(B, 1.0 + B / 100) for B in range(lo, hi + 1) if B % 10 == 0])
    assert snap_toward(sp, 30, "set", 60).B == 60
    assert snap_toward(sp, 30, "set", 64.0).B == 60 and snap_nearest(sp, 4.0) == 10 and snap_nearest(sp, 1e9) == 100
    st_ = snap_toward(sp, 35, "stay")
    assert st_.B in (30, 40) and "not realisable" in st_.note


def test_wide_ranges_are_searched_by_window():
    sp = BatchSpace.integers(1, 10**6)
    assert snap_toward(sp, 500_000, "grow", 550_000).B == 550_000
    assert snap_toward(sp, 10**6, "grow", 10**6).moved is False
    sparse = BatchSpace(1, 10**6, lambda lo, hi: [(B, None) for B in range(-(-lo // 4096) * 4096, hi + 1, 4096)])
    assert snap_toward(sparse, 4096, "grow", 4100).B == 8192
    assert sparse.above(8192) == 12288 and sparse.below(8192) == 4096 and sparse.below(4096) is None
