"""bench/common/tta_protocol.py, the fair protocol's pure pieces, against known answers: the interpolated crossing
time, the targets, the reference chosen on selection seeds and scored on fresh ones, the performance profile, the
geometric mean and one run's share of the grid."""
import math
import statistics

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.common import tta_protocol as proto


def test_crossing_time_interpolates_between_the_bracketing_evaluations():
    pts = [(0.0, 0.10), (1.0, 0.50), (2.0, 0.70), (3.0, 0.90)]
    # 0.80 lies halfway between 0.70 (t=2) and 0.90 (t=3)
    assert math.isclose(proto.crossing_time(pts, 0.80), 2.5, rel_tol=1e-12)
    # a quarter of the way from 0.50 to 0.70
    assert math.isclose(proto.crossing_time(pts, 0.55), 1.25, rel_tol=1e-12)
    assert proto.crossing_time(pts, 0.70) == 2.0                 # an evaluation exactly at the target
    assert proto.crossing_time(pts, 0.05) == 0.0                 # already there before training
    assert proto.crossing_time(pts, 0.95) == math.inf


def test_crossing_time_is_the_first_crossing_not_a_later_one():
    # the curve crosses 0.6 between t=1 and t=2, dips below, and crosses again between t=3 and t=4
    pts = [(0.0, 0.0), (1.0, 0.4), (2.0, 0.8), (3.0, 0.5), (4.0, 0.9)]
    assert math.isclose(proto.crossing_time(pts, 0.6), 1.5, rel_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=12), st.floats(0.01, 0.99))
def test_crossing_time_matches_a_dense_scan_of_the_linear_curve(accs, target):
    pts = [(float(i), a) for i, a in enumerate(accs)]
    got = proto.crossing_time(pts, target)
    # independent reference: scan the piecewise-linear curve on a fine grid, first grid time at or above target
    ref = math.inf
    step = 1e-4
    for i in range(len(accs)):
        if i == 0:
            if accs[0] >= target:
                ref = 0.0
                break
            continue
        a0, a1 = accs[i - 1], accs[i]
        k = 0
        hit = None
        while k * step <= 1.0:
            if a0 + (a1 - a0) * k * step >= target:
                hit = i - 1 + k * step
                break
            k += 1
        if hit is not None:
            ref = hit
            break
    if math.isinf(ref):
        assert math.isinf(got)
    else:
        assert ref - step <= got <= ref + 1e-9, (got, ref)


def test_targets_mid_and_plateau():
    mid, plateau = proto.targets([0.80, 0.82, 0.81], [0.90, 0.92, 0.88])
    assert math.isclose(mid, 0.81)
    assert math.isclose(plateau, 0.90 - 2 * 0.02, rel_tol=1e-12)          # sample sd of 0.88, 0.90, 0.92 is 0.02
    assert proto.targets([0.5], [0.7]) == (0.5, 0.7)                       # one seed: no spread


def test_the_reference_is_chosen_on_selection_seeds_and_scored_on_fresh_ones():
    # selection seeds: fixed-256 is fastest but ends 1 point low (excluded); fixed-128 (lucky: 8 s) beats fixed-64
    sel_t = {"fixed-64": [10.0, 11.0, 12.0], "fixed-128": [8.0, 9.0, 8.5], "fixed-256": [5.0, 5.0, 5.0],
             "fixed-512": [math.inf, math.inf, 4.0]}
    sel_f = {"fixed-64": [0.900, 0.902, 0.899], "fixed-128": [0.897, 0.899, 0.898], "fixed-256": [0.890] * 3,
             "fixed-512": [0.95] * 3}
    ref = proto.choose_reference(sel_t, sel_f, base_final=0.901)
    assert ref == "fixed-128"            # 0.898 >= 0.901 - 0.005; fixed-256's 0.890 is not; fixed-512 misses
    # on fresh seeds fixed-128 is slower than its selection times: the score is the fresh median, 10.5
    fresh = {"fixed-128": [10.0, 11.0, 10.5]}
    assert proto.fresh_score(fresh[ref]) == 10.5
    assert math.isclose(proto.regret([12.6, 11.0, 13.0], fresh[ref]), 12.6 / 10.5)
    assert proto.choose_reference({"a": [1.0]}, {"a": [0.5]}, base_final=0.9) is None


def test_regret_counts_a_miss_as_infinite():
    assert proto.regret([math.inf, math.inf, 3.0], [2.0, 2.0, 2.0]) == math.inf
    assert math.isnan(proto.regret([1.0], [math.inf]))


def test_profile_geomean_and_summary_with_a_miss():
    regrets = [1.0, 1.05, 1.2, 1.4, math.inf]
    prof = proto.profile(regrets)
    assert prof == {1.10: 2 / 5, 1.25: 3 / 5, 1.5: 4 / 5}
    assert proto.geomean([1.0, 4.0]) == 2.0
    assert proto.geomean(regrets) == math.inf
    s = proto.summary(regrets)
    assert s["misses"] == 1 and s["regret_worst"] == math.inf and s["profile_125"] == 3 / 5
    s = proto.summary([1.21, 1.0, 1.0])
    assert math.isclose(s["regret_geomean"], (1.21 * 1.0 * 1.0) ** (1 / 3), rel_tol=1e-12)
    assert s["misses"] == 0 and s["regret_worst"] == 1.21


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.5, 3.0), min_size=1, max_size=10))
def test_geomean_against_the_log_mean(v):
    assert math.isclose(proto.geomean(v), math.exp(statistics.fmean(math.log(x) for x in v)), rel_tol=1e-9)
    assert min(v) - 1e-9 <= proto.geomean(v) <= max(v) + 1e-9


def test_one_run_vs_grid():
    assert proto.one_run_vs_grid(30.0, [100.0, 50.0, 50.0]) == 0.15
    assert math.isnan(proto.one_run_vs_grid(1.0, []))


def test_a_fair_section_end_to_end_on_synthetic_runs_with_known_answers():
    """tta_fair.fair_section with a fake ``run``: every run's accuracy rises linearly from 0 to its final value over
    its training time, so each crossing time is known by hand. fixed-64-linear is lucky on the selection seeds
    (0.6 s an epoch there, 0.7 s on fresh ones); fixed-128-linear is fastest but ends 2 points low."""
    from bench.common import tta_fair

    epochs = 4
    spec = {"fixed-32": (1.0, 1.0, 0.900), "fixed-64-linear": (0.6, 0.7, 0.898),
            "fixed-128-linear": (0.4, 0.4, 0.880), "noise-scale": (0.75, 0.75, 0.900)}
    calls = []

    def run(kind, seed):
        calls.append((kind, seed))
        sel_t, fresh_t, final = spec[kind]
        T = (sel_t if seed < 3 else fresh_t) * epochs
        return {"final": final, "train_s": T, "evals": [{"acc": final * e / epochs} for e in range(1, epochs + 1)],
                "curve": [{"clock": 0.0, "acc": 0.0}, {"clock": T, "acc": final}]}

    out = tta_fair.fair_section("toy", epochs, ["fixed-64-linear", "fixed-128-linear"], ["noise-scale"],
                                [0, 1, 2], [3, 4, 5], run, lambda obj: obj, rank=0)
    # fresh seeds run fixed-32, the two references and the policy, never the excluded fixed-128-linear
    assert sorted({k for k, s in calls if s >= 3}) == ["fixed-32", "fixed-64-linear", "noise-scale"]
    mid = out["pairs"][("noise-scale", "mid")]          # mid target 0.45: fixed-32's accuracy after 2 of 4 epochs
    assert mid["ref"] == "fixed-64-linear"              # 0.898 is within 0.5 point of 0.900; 1.20 s on selection
    assert math.isclose(mid["regret"], (0.45 / 0.9 * 3.0) / (0.45 / 0.898 * 2.8), rel_tol=1e-12)  # fresh: 1.069
    plateau = out["pairs"][("noise-scale", "plateau")]  # plateau 0.900 (no spread): fixed-64 never reaches it
    assert plateau["ref"] == "fixed-32" and math.isclose(plateau["regret"], 3.0 / 4.0, rel_tol=1e-12)
    assert math.isclose(out["vs_grid"]["noise-scale"], 3.0 / (4.0 + 2.4 + 1.6), rel_tol=1e-12)
    assert abs(out["gap"]["noise-scale"]) < 1e-12
    line = tta_fair.last_line({"toy": out}, ["noise-scale"], 3, np.random.default_rng(0))
    assert f"regret_geomean={math.sqrt(mid['regret'] * 0.75):.3f}" in line
    assert "regret_worst=1.069 misses=0 profile_110=1.000" in line and line.endswith("seeds=3")
