"""Invariants 2-3: identical or per-rank micro-batches; every sample exactly once per epoch across plan
changes, B changes, rank-count changes and a mid-epoch resume (hypothesis)."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hpc_jabas.core.planning import Plan, proportional_plan, split_proportional
from hpc_jabas.core.planning.sampler import HeterogeneousSampler
from hpc_jabas.errors import ConfigError

identical_plans = st.builds(lambda b, n: Plan(b, tuple(n)), st.integers(1, 9),
                           st.lists(st.integers(0, 5), min_size=1, max_size=6).filter(lambda n: sum(n) > 0))


@st.composite
def per_rank_plans(draw):
    """b_i, n_i and x_i per rank, the last micro-batch of a rank possibly partial."""
    R = draw(st.integers(1, 6))
    bs = draw(st.lists(st.integers(1, 9), min_size=R, max_size=R))
    ns = draw(st.lists(st.integers(0, 4), min_size=R, max_size=R).filter(lambda n: sum(n) > 0))
    xs = [0 if k == 0 else draw(st.integers((k - 1) * b + 1, k * b)) for b, k in zip(bs, ns)]
    return Plan(tuple(bs), tuple(ns), tuple(xs))


plans = st.one_of(identical_plans, per_rank_plans())


@settings(max_examples=200, deadline=None)
@example(N=65, seed=0, first=Plan((2, 3, 1, 1, 1), (2, 2, 0, 0, 1), (3, 4, 0, 0, 1)), changes=[], resume_at=0,
         tail="shrink")
@given(N=st.integers(1, 400), seed=st.integers(0, 2**31), first=plans,
       changes=st.lists(st.tuples(st.integers(0, 40), plans), max_size=5),
       resume_at=st.integers(0, 40), tail=st.sampled_from(["shrink", "drop"]))
def test_every_sample_once_per_epoch(N, seed, first, changes, resume_at, tail):
    s = HeterogeneousSampler(N, seed=seed, tail=tail)
    sched = dict(changes)
    plan, seen, it = first, [], 0
    while not s.epoch_done(plan.B):
        if it in sched:
            plan = sched[it]          # plan, B and rank count may all change here
            if s.epoch_done(plan.B):
                break
        if it == resume_at:           # save, rebuild from the saved state, go on
            st_ = s.state_dict()
            s = HeterogeneousSampler(N, seed=seed, tail=tail)
            s.load_state_dict(st_)
        ib = s.next(plan)
        sizes = [len(m) for r in ib.micro for m in r]
        assert ib.plan.world_size == plan.world_size and ib.total == ib.plan.B == sum(sizes)
        assert [len(ib.rank_indices(i)) for i in range(plan.world_size)] == list(ib.plan.xs)
        if ib.total == plan.B and ib.plan == plan:
            # a full iteration (invariant 2): exactly the plan's micro-batches, b_i each but a rank's last
            for i in range(plan.world_size):
                assert len(ib.rank_indices(i)) == plan.xs[i]
                assert [len(m) for m in ib.micro[i]] == plan.micro_sizes(i)
        else:
            # the shrunk epoch tail, or the last iteration taking B + 1 (exactly B + 1 samples were left)
            assert ib.total < plan.B or (tail == "shrink" and ib.total == plan.B + 1 == s.cursor - ib.start
                                         and s.remaining == 0)
            # the documented bound is per rank (x_i + 1): the B + 1 iteration gives its last running rank the
            # extra sample, and the no-single-sample rule may then move one sample between neighbouring ranks
            # (N=65, b=2,3,1,1,1 n=2,2,0,0,1: x=3,4,0,0,1 runs as 4,3,0,0,2)
            assert all(len(ib.rank_indices(i)) <= plan.xs[i] + 1 for i in range(plan.world_size))
            assert all(ib.plan.n[i] <= plan.n[i] + 1 for i in range(plan.world_size))
            for i in range(plan.world_size):
                for m in ib.micro[i]:
                    # never one sample where the plan runs b_i >= 2 (BatchNorm); at most b_i (3 for b_i = 2)
                    assert len(m) >= 2 or ib.total == 1 or min(b for b, k in zip(plan.bs, plan.n) if k) == 1
                    assert len(m) <= max(plan.bs[i], 3 if plan.bs[i] == 2 else 1)
            if plan.identical_b:
                assert all(x == plan.b for x in sizes[:-2])      # b each, but the last two
        seen.extend(ib.all_indices().tolist())
        it += 1
    assert len(seen) == len(set(seen))                       # never repeated
    if tail == "shrink":
        assert sorted(seen) == list(range(N))                # never skipped
    else:
        # drop: only the final short remainder (< the B in force) goes unused
        assert set(seen) <= set(range(N)) and N - len(seen) < plan.B


def test_epochs_use_different_permutations_and_are_deterministic():
    a, b = HeterogeneousSampler(100, seed=3), HeterogeneousSampler(100, seed=3)
    p = Plan(5, (1, 2))
    x = a.next(p).all_indices()
    assert np.array_equal(x, b.next(p).all_indices())
    a.cursor = 100
    a.new_epoch()
    assert not np.array_equal(a.next(p).all_indices(), x)


def test_drop_tail_skips_less_than_B():
    s = HeterogeneousSampler(100, seed=0, tail="drop")
    p = Plan(4, (2, 4))   # B = 24: 4 iterations, 4 samples dropped
    n = 0
    while not s.epoch_done(p.B):
        assert s.next(p).total == 24
        n += 1
    assert n == 4 and s.remaining == 4


def test_shrink_tail_keeps_proportions_and_caps():
    s = HeterogeneousSampler(30, seed=0)
    p = Plan(4, (1, 3, 4))   # B = 32 > 30: one shrunk iteration
    ib = s.next(p)
    assert ib.total == 30 and ib.plan.M == 8 and ib.plan.n == (1, 3, 4)
    s2 = HeterogeneousSampler(10, seed=0)
    ib2 = s2.next(p)
    assert ib2.total == 10 and ib2.plan.M == 3 and all(a <= b for a, b in zip(ib2.plan.n, p.n))


@settings(max_examples=300, deadline=None)
@given(total=st.integers(0, 500), w=st.lists(st.floats(0.01, 100), min_size=1, max_size=8))
def test_split_proportional_exact_and_fair(total, w):
    out = split_proportional(total, w)
    assert sum(out) == total and all(x >= 0 for x in out)
    ideal = [total * x / sum(w) for x in w]
    assert all(abs(o - i) < 1.0 + 1e-9 for o, i in zip(out, ideal))


def test_proportional_plan_lbbsp_rule():
    p = proportional_plan(512, 8, [1, 0.5, 0.25])
    assert p.B == 512 and p.n == (37, 18, 9)
    with pytest.raises(ConfigError, match="not a positive multiple"):
        proportional_plan(100, 8, [1, 1])


def test_plan_parse_and_errors():
    p = Plan.parse("b=4 n=1,3,4")
    assert (p.b, p.n, p.M, p.B) == (4, (1, 3, 4), 8, 32)
    assert p.weight(2) == 0.5 and p.first_microbatch(2) == 4
    for bad in ["b=0 n=1", "n=1,2", "b=4 n=0,0", "b=4 n=-1,2"]:
        with pytest.raises(ConfigError):
            Plan.parse(bad)
    with pytest.raises(ConfigError, match="tail"):
        HeterogeneousSampler(10, tail="wrap")


def test_per_rank_plan_syntax_dict_round_trip_and_old_checkpoints():
    p = Plan.parse("b=8,4,4 n=2,3,1 x=13,12,4")
    assert (p.bs, p.n, p.xs, p.B, p.M) == ((8, 4, 4), (2, 3, 1), (13, 12, 4), 29, 6)
    assert p.micro_sizes(0) == [8, 5] and not p.identical_b and not p.full
    assert Plan.parse(str(p)) == p and Plan.from_dict(p.to_dict()) == p
    q = Plan.parse("b=8,4,4 n=2,3,1")
    assert q.full and q.xs == (16, 12, 4) and str(q) == "b=8,4,4 n=2,3,1"
    old = Plan.from_dict({"b": 4, "n": [1, 3, 4]})             # a checkpoint of the identical-b era
    assert old == Plan(4, (1, 3, 4)) == Plan.parse("b=4,4,4 n=1,3,4") and old.b == 4
    assert old.to_dict() == {"b": 4, "n": [1, 3, 4]}
    with pytest.raises(ValueError, match="per-rank"):
        _ = p.b
    for bad in ("b=8,4 n=1,1,1", "b=4 n=2 x=9", "b=4 n=2 x=4", "b=0,1 n=1,1"):
        with pytest.raises(ConfigError) as e:
            Plan.parse(bad)
        assert "\n" not in str(e.value)


def test_tail_has_no_single_sample_micro_batch():
    """BatchNorm cannot train on one sample: (b, 1) becomes (b - 1, 2); B + 1 left: one iteration of B + 1."""
    p = Plan(4, (1, 1))                                   # B = 8
    s = HeterogeneousSampler(13, seed=0)
    assert s.next(p).total == 8 and s.iterations_left(8) == 1
    ib = s.next(p)                                        # 5 left: [4] [1] -> [3] [2]
    assert [[len(m) for m in r] for r in ib.micro] == [[3], [2]] and ib.plan.xs == (3, 2)
    s = HeterogeneousSampler(9, seed=0)                   # 9 = B + 1: one iteration of 9, [4] [4, 1] -> [4] [3, 2]
    assert s.iterations_left(8) == 1
    ib = s.next(p)
    assert ib.total == 9 and [[len(m) for m in r] for r in ib.micro] == [[4], [3, 2]] and s.epoch_done(8)
    assert sorted(ib.all_indices().tolist()) == list(range(9))
    s = HeterogeneousSampler(7, seed=0)                   # b = 2, 7 left: [2, 2] [2, 1] -> [2, 2] [3]
    ib = s.next(Plan(2, (2, 2)))
    assert [[len(m) for m in r] for r in ib.micro] == [[2, 2], [3]] and ib.plan.xs == (4, 3)
    s = HeterogeneousSampler(5, seed=0)                   # b = 1 runs one-sample micro-batches by plan: unchanged
    assert [len(m) for m in s.next(Plan(1, (2, 4))).micro[1]] == [1, 1, 1]


def test_per_rank_invariance_same_samples_whatever_the_plan():
    """Invariance: the same B indices per iteration for an identical-b and a per-rank plan of that B."""
    a, b = HeterogeneousSampler(97, seed=5), HeterogeneousSampler(97, seed=5)
    same, per = Plan(4, (1, 3, 4)), Plan((13, 6, 8), (1, 2, 1), (13, 11, 8))
    assert same.B == per.B == 32
    while not a.epoch_done(32):
        x, y = a.next(same), b.next(per)
        assert np.array_equal(x.all_indices(), y.all_indices())
        assert [len(y.rank_indices(i)) for i in range(3)] == list(y.plan.xs)
    assert b.epoch_done(32) and x.total == y.total == 33          # 97 = 2 * 32 + 33: no 1-sample tail
