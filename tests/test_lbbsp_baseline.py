"""The benchmarks' hand-written LB-BSP (bench/common/lbbsp.py) is tested, not only used: it converges to equal finish
times on a static speed mix, keeps B, halves its step on oscillation and keeps a leader within its headroom."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.common.lbbsp import LBBSP, split_in_proportion


def _times(x, speeds, base=0.0, per=1e-3):
    return [(base + per * xi) / v for xi, v in zip(x, speeds)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 1.0), min_size=2, max_size=6), st.integers(64, 2048))
def test_static_speeds_converge_to_equal_finish_times(speeds, B):
    lb = LBBSP(B, len(speeds))
    for _ in range(30):
        x = lb.update(_times(lb.x, speeds))
        assert sum(x) == B and min(x) >= 1
    t = _times(lb.x, speeds)
    # equal within one sample of the slowest rank's time per sample (integer batches)
    assert max(t) - min(t) <= 1e-3 / min(speeds) + 1e-12


def test_one_window_moves_samples_from_the_straggler_to_the_leader():
    lb = LBBSP(512, 3)
    assert lb.x == [171, 171, 170]
    x = lb.update(_times(lb.x, [1.0, 0.5, 0.25]))
    assert x == [293, 146, 73] and lb.halvings == 0


def test_a_reversal_halves_the_step():
    lb = LBBSP(300, 2)
    lb.update([1.0, 2.0])                  # rank 1 slower: rank 0 grows
    assert lb.x[0] > 150 and lb.step == 1.0
    lb.update([3.0, 1.0])                  # now rank 0 looks slow: the move reverses
    assert lb.halvings == 1 and lb.step == 0.5
    assert sum(lb.x) == 300


def test_the_leader_stays_within_its_headroom():
    lb = LBBSP(512, 3, max_local=200)
    for _ in range(10):
        lb.update(_times(lb.x, [1.0, 0.5, 0.25]))
    assert max(lb.x) <= 200 and sum(lb.x) == 512


def test_split_in_proportion_sums_exactly_within_bounds():
    assert split_in_proportion(10, [1, 1, 1]) == [4, 3, 3]
    assert split_in_proportion(100, [1, 0.001], lo=1) == [99, 1]
    assert split_in_proportion(10, [5, 1], hi=[6, 10]) == [6, 4]
