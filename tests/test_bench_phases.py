"""bench/common/phases.py: the split of an adaptive run's time to target against a fixed run at equal samples
adds up exactly, and each term is where it belongs (hand-made runs with known answers)."""
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.common import phases


def _run(Bs, per_sample):
    """(B, samples, seconds) rows: every iteration a full B at ``per_sample(B)`` seconds per sample."""
    return [(b, b, b * per_sample(b)) for b in Bs]


def test_the_same_run_loses_nothing():
    rows = _run([64] * 50, lambda b: 0.001)
    got = phases.split(rows, 3.5, 64 * 40, rows, 3.5, 64 * 40)
    assert all(abs(v) < 1e-12 for v in got.values()), got


def test_a_slow_start_is_charged_to_the_start_and_extra_samples_to_samples():
    # fixed: B = 128 at 1 ms/sample throughout, target after 6,400 samples (6.4 s of iterations, 0.6 s other)
    fixed = _run([128] * 100, lambda b: 0.001)
    # adaptive: 10 iterations at B = 32 at 2 ms/sample (slow), a climb 64, then 128 at F's speed; target at 7,680
    Bs = [32] * 10 + [64] * 5 + [128] * 100
    ada = _run(Bs, lambda b: 0.002 if b == 32 else 0.001)
    n_a = 32 * 10 + 64 * 5 + 128 * 55
    t_a = sum(r[2] for r in ada[:70]) + 1.0
    got = phases.split(ada, t_a, n_a, fixed, 6.4 + 0.6, 6400)
    assert math.isclose(got["start"], 320 * 0.001, rel_tol=1e-9)          # 320 samples at twice F's cost
    assert abs(got["climb"]) < 1e-12 and abs(got["steady"]) < 1e-12
    assert math.isclose(got["samples"], (n_a - 6400) * 0.001, rel_tol=1e-9)
    assert math.isclose(got["other"], 1.0 - 0.6, rel_tol=1e-9)
    assert math.isclose(sum(got.values()), t_a - 7.0, rel_tol=1e-9)


def test_bounds_of_the_phases():
    assert phases.bounds([32, 32, 64, 120, 128, 128]) == (2, 3)      # 120 >= 0.9 * 128 starts the steady phase
    assert phases.bounds([32] * 5) == (5, 5)                          # never moved: all start
    assert phases.bounds([]) == (0, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([16, 32, 64, 128, 256]), min_size=1, max_size=60),
       st.lists(st.floats(0.1, 5.0), min_size=1, max_size=60), st.floats(0, 3), st.floats(0, 3),
       st.integers(1, 60), st.integers(1, 80))
def test_the_terms_add_up_to_the_difference(Bs, speeds, extra_a, extra_f, k_a, k_f):
    ada = [(b, b, b * 1e-3 * speeds[i % len(speeds)]) for i, b in enumerate(Bs)]
    fixed = [(64, 64, 0.05)] * 80
    k_a = min(k_a, len(ada))
    n_a = sum(r[1] for r in ada[:k_a])
    t_a = sum(r[2] for r in ada[:k_a]) + extra_a
    n_f, t_f = 64 * k_f, 0.05 * k_f + extra_f
    got = phases.split(ada, t_a, n_a, fixed, t_f, n_f)
    assert set(got) == set(phases.TERMS)
    assert math.isclose(sum(got.values()), t_a - t_f, rel_tol=1e-9, abs_tol=1e-9)


def test_both_goals_names_the_fixed_runs_that_meet_time_and_accuracy_at_once():
    """The language-model grid of 2026-12-06 (lm_run): the best fixed B (256-linear) ends 1.51 points below
    fixed-32; 128-linear is within 1.10 of its time (0.654 <= 1.1 x 0.616) and within 0.5 point; 64-linear is not
    within the time."""
    ratio = {"fixed-32": 1.0, "fixed-64-linear": 0.762, "fixed-128-linear": 0.654, "fixed-128-sqrt": 0.752,
             "fixed-256-linear": 0.616, "fixed-256-sqrt": math.inf}
    gap = {"fixed-32": 0.0, "fixed-64-linear": 0.11, "fixed-128-linear": 0.10, "fixed-128-sqrt": 1.28,
           "fixed-256-linear": 1.51, "fixed-256-sqrt": 3.36}
    assert phases.both_goals(ratio, gap, "fixed-256-linear") == ["fixed-128-linear"]
    # the image grid (image_run): nothing within 1.10 of 128-linear's time is within 0.5 point
    ratio = {"fixed-32": 1.0, "fixed-64-sqrt": 0.722, "fixed-128-sqrt": 0.539, "fixed-128-linear": 0.537}
    gap = {"fixed-32": 0.0, "fixed-64-sqrt": -0.80, "fixed-128-sqrt": 5.80, "fixed-128-linear": 4.20}
    assert phases.both_goals(ratio, gap, "fixed-128-linear") == []
    assert phases.both_goals({"a": math.inf}, {"a": 0.0}, "a") == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(0.05, 3.0), st.just(math.inf)), st.floats(-5.0, 20.0)),
                min_size=1, max_size=10))
def test_both_goals_against_a_brute_force_reading_of_the_goals(rows):
    ratio = {f"k{i}": r for i, (r, _) in enumerate(rows)}
    gap = {f"k{i}": g for i, (_, g) in enumerate(rows)}
    best = min(ratio, key=lambda k: (ratio[k], k))
    got = set(phases.both_goals(ratio, gap, best))
    for k in ratio:
        meets = math.isfinite(ratio[k]) and ratio[k] / ratio[best] <= 1.10 + 1e-12 and gap[k] <= 0.5
        assert (k in got) == meets, (k, ratio[k], ratio[best], gap[k])
