"""Online calibration of the perf model: the pure fit, the calibrated view, its storage."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_jabas.core.perf.calibration import Calibration, RankCalibration, corrected_profile
from hpc_jabas.core.perf.perfmodel import ComputeProfile, PerfModel

PM = PerfModel.emulated(["v100", "p100"])
P = PM.profile("v100")
BS = [4, 8, 16, 32, 64]


def feed(rc, f, o, iters, rng, noise=0.01, outliers=0.0, p=P):
    for _ in range(iters):
        b, n = int(rng.choice(BS)), int(rng.integers(1, 8))
        x = n * p.time(b)
        y = (f * x + o * n) * (1 + noise * rng.standard_normal())
        if rng.random() < outliers:
            y *= 3
        rc.update(x, n, y)


@settings(max_examples=40, deadline=None)
@given(f=st.floats(0.3, 4.0), o_rel=st.floats(0.5, 2.0))
def test_recovers_factor_and_offset_within_5pct(f, o_rel):
    """1% noisy micro-batch times over varying b and n: factor and per-call offset within 5%."""
    o = o_rel * P.time(16)
    rc = RankCalibration("v100")
    feed(rc, f, o, 300, np.random.default_rng(0))
    assert rc.factor == pytest.approx(f, rel=0.05)
    assert rc.offset == pytest.approx(o, rel=0.05)


def test_robust_to_outliers_and_follows_a_drift():
    rng = np.random.default_rng(1)
    rc = RankCalibration("v100")
    o = P.time(16)
    feed(rc, 1.5, o, 200, rng, outliers=0.03)          # 3% of the iterations 3x slower (hiccups)
    assert rc.factor == pytest.approx(1.5, rel=0.05)
    feed(rc, 3.0, o, 250, rng, outliers=0.03)          # the rank slows down 2x: followed (forgetting)
    assert rc.factor == pytest.approx(3.0, rel=0.05)
    assert rc.offset == pytest.approx(o, rel=0.10)


def test_one_b_puts_the_difference_into_the_factor():
    """Factor and offset cannot be told apart at one b; the prior gives it to the factor."""
    rc = RankCalibration("v100")
    rng = np.random.default_rng(2)
    for _ in range(100):
        x = 4 * P.time(16)
        rc.update(x, 4, 2.5 * x * (1 + 0.01 * rng.standard_normal()))
    assert rc.factor == pytest.approx(2.5, rel=0.02)


def test_corrected_profile_is_affine_in_the_profile():
    for p in (P, ComputeProfile("a100", [8, 32, 128], [0.01, 0.03, 0.11], update_s=0.002)):
        c = corrected_profile(p, 1.7, 0.003)
        for b in (1, 8, 20, 32, 100):
            if b <= p.max_b:
                assert c.time(b) == pytest.approx(1.7 * p.time(b) + 0.003, rel=1e-9)
        assert c.update_s == p.update_s and c.max_b == p.max_b
    assert corrected_profile(P, 1.7, 0.003).formula["speed"] == P.formula["speed"]   # declared speeds still apply


def test_view_state_and_seed_roundtrip(tmp_path):
    cal = Calibration.fresh(["v100", "v100", "p100"])
    rng = np.random.default_rng(3)
    for rc, f in zip(cal.ranks, [1.0, 2.0, 1.2]):
        feed(rc, f, 0.0, 120, rng, p=PM.profile(rc.gpu))
    corr = cal.type_corrections()
    assert corr["v100"][0] == pytest.approx(1.5, rel=0.03) and corr["p100"][0] == pytest.approx(1.2, rel=0.03)
    view = cal.apply(PM.profiles)
    assert view["v100"].time(16) == pytest.approx(corr["v100"][0] * P.time(16) + corr["v100"][1], rel=1e-9)
    path = cal.save(tmp_path / "calibration.json")
    d = json.loads(open(path).read())                       # plain JSON: floats, lists, dicts
    back = Calibration.load(path)
    assert back.to_dict() == cal.to_dict() == d
    more = [2, 3, 4]
    for a, b in zip(cal.ranks, back.ranks):                   # the restored fit continues exactly
        a.update(more[0] * P.time(8), 2, 0.05)
        b.update(more[0] * P.time(8), 2, 0.05)
        assert a.factor == b.factor and a.offset == b.offset
    nxt = back.seeded(["p100", "v100"])                       # another mix: same rank+type keeps its fit
    assert nxt.ranks[0].factor == pytest.approx(back.type_corrections()["p100"][0]) and nxt.ranks[0].n_obs == 0
    assert nxt.ranks[1].factor == back.ranks[1].factor and nxt.ranks[1].n_obs == back.ranks[1].n_obs
