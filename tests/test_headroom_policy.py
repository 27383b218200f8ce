"""The curvature headroom in the policies (issue 56, items 3-4): the cap on moves up (headroom.move_allowed /
HeadroomCap: hypothesis), the goodput policy's E_lin pricing (efficiency = "linear") against McCandlish's expected
per-sample loss decrease written out and against the closed-form argmax on t(B) = a + c B, the similarity policy's
cap, and defaults that decide as before."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_jabas.core.adaptive import headroom as hr
from hpc_jabas.core.adaptive.policies.base import Observation, PolicyState
from hpc_jabas.core.adaptive.policies.goodput import GoodputPolicy
from hpc_jabas.core.adaptive.policies.registry import make_policy
from hpc_jabas.core.adaptive.policies.similarity import SimilarityPolicy
from hpc_jabas.core.planning.space import BatchSpace
from hpc_jabas.errors import ConfigError


def linear_space(B_min, B_max, a=0.1, c=0.001):
    return BatchSpace(B_min, B_max, lambda lo, hi: [(B, a + c * B) for B in range(lo, hi + 1)])


# ---- the rule ----------------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 100.0), st.floats(0.01, 100.0), st.floats(0.1, 10.0), st.floats(0.01, 1000.0))
def test_move_allowed_is_monotone_in_h_never_refuses_down_and_refuses_exactly_past_c_h(h1, h2, c, k):
    lo, hi = sorted((h1, h2))
    if hr.move_allowed(k, lo, c):                      # more headroom never refuses what less allowed
        assert hr.move_allowed(k, hi, c)
    assert hr.move_allowed(min(k, 1.0), lo, c)         # a move down (or none) is always free
    assert hr.move_allowed(k, lo, c) == (k <= 1.0 or k <= c * lo)
    assert not hr.move_allowed(c * lo * (1 + 1e-9) + 1.0, lo, c)   # past c x h and up: refused


@settings(max_examples=200, deadline=None)
@given(st.floats(0.05, 50.0), st.floats(0.5, 8.0), st.integers(1, 4096), st.integers(1, 4096),
       st.integers(1, 4096))
def test_the_cap_refers_to_the_batch_h_was_measured_at(h, c, B_h, cur, new):
    cap = hr.HeadroomCap(c)
    assert cap.allows(cur, new) and cap.limit(cur) is None       # off until measured
    assert cap.observe(h, B_h)
    assert cap.limit(cur) == pytest.approx(c * h * B_h)
    assert cap.allows(cur, new) == (new <= cur or new / B_h <= c * h)
    for bad in (None, math.nan, 0.0, -1.0):
        assert not cap.observe(bad, B_h) and cap.h == h


# ---- E_lin against McCandlish's quadratic model written out -----------------------------------------------------
def _progress_per_sample(B, B0, eps0, G2, GHG, trHS):
    """Expected loss decrease per sample of one step at B with the lr scaled linearly from eps0 at B0 (McCandlish
    et al.: -eps |G|^2 + eps^2 / 2 (G'HG + tr(H Sigma) / B)), written out."""
    eps = eps0 * B / B0
    return (eps * G2 - 0.5 * eps * eps * (GHG + trHS / B)) / B


@pytest.mark.parametrize("G2,GHG,trHS,eps_eff,B_h", [(4.0, 10.0, 300.0, 0.02, 32), (1.0, 50.0, 5e3, 0.004, 64)])
def test_linear_pricing_is_mccandlish_per_sample_progress(G2, GHG, trHS, eps_eff, B_h):
    h = 2 * (G2 / GHG) / eps_eff                           # headroom at B_h
    b_n = trHS / GHG                                       # B_n, given to the policy as its noise scale
    pol = GoodputPolicy(B0=B_h, B_min=1, B_max=4096, efficiency="linear", headroom_c=1.0, kappa=1.0,
                        noise_trend=False, warmup=0)
    pol.observe(Observation(headroom=h, headroom_B=B_h))
    ref0 = _progress_per_sample(B_h, B_h, eps_eff, G2, GHG, trHS)
    for B in (B_h, 2 * B_h, 3 * B_h, int(B_h * h / 2)):
        want = max(0.0, _progress_per_sample(B, B_h, eps_eff, G2, GHG, trHS)) / ref0
        got = pol.efficiency_at(B, b_n, B_h) / pol.efficiency_at(B_h, b_n, B_h)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), B
        assert got == pytest.approx(max(0.0, hr.e_lin(B, B_h, eps_eff, G2 / GHG, b_n)), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("h,bn,c", [(2.0, 20.0, 4.0), (8.0, 100.0, 1.0), (1.5, 0.0, 4.0)])
def test_linear_goodput_takes_the_closed_form_argmax(h, bn, c):
    """goodput ~ B (1 - (B + B_n) / M) / (a + c_t B), M = c h B_h: maximal at B* = (-a + sqrt(a^2 + c_t K a)) / c_t,
    K = M - B_n (set the derivative's numerator K a - 2 a B - c_t B^2 to 0)."""
    a, ct, B_h = 0.1, 0.001, 64
    pol = GoodputPolicy(B0=B_h, B_min=1, B_max=4096, efficiency="linear", headroom_c=c, warmup=0,
                        max_step=math.inf, min_gain=0.0, noise_trend=False)
    d = pol.decide(PolicyState(B=B_h, b_noise=bn, headroom=h), linear_space(1, 4096, a, ct))
    K = c * h * B_h - bn
    want = (-a + math.sqrt(a * a + ct * K * a)) / ct
    assert abs(d.B - want) <= 1, (d.B, want, d.reason)
    assert "E_lin" in d.reason
    # Pollux's E on the same numbers would take sqrt(a B_noise / c_t) (or the fastest B without noise): different
    pollux = GoodputPolicy(B0=B_h, B_min=1, B_max=4096, warmup=0, max_step=math.inf, min_gain=0.0,
                           noise_trend=False).decide(PolicyState(B=B_h, b_noise=bn), linear_space(1, 4096, a, ct))
    assert pollux.B != d.B


def test_linear_pricing_without_a_headroom_is_pollux_and_the_unresolved_case_grows_to_the_cap():
    space = linear_space(16, 4096)
    kw = dict(B0=64, B_min=16, B_max=4096, warmup=0, max_step=math.inf, noise_trend=False)
    for bn in (50.0, 400.0, 5000.0):
        a = GoodputPolicy(**kw).decide(PolicyState(B=64, b_noise=bn), space)
        b = GoodputPolicy(efficiency="linear", **kw).decide(PolicyState(B=64, b_noise=bn), space)
        assert a == b
    d = GoodputPolicy(efficiency="linear", headroom_c=4.0, **kw).decide(
        PolicyState(B=64, b_noise=math.inf, headroom=2.0), space)
    assert 64 < d.B <= 4 * 2.0 * 64 and "unresolved" in d.reason     # E_lin > 0 up to the edge, the cap past it


# ---- the cap in both policies --------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.floats(0.1, 20.0), st.floats(1.0, 8.0), st.sampled_from([50.0, 500.0, 5000.0, math.inf]))
def test_goodput_never_moves_up_past_c_h(h, c, bn):
    space = linear_space(16, 4096)
    kw = dict(B0=64, B_min=16, B_max=4096, warmup=0, max_step=math.inf, noise_trend=False, min_gain=0.0)
    free = GoodputPolicy(**kw).decide(PolicyState(B=64, b_noise=bn), space)
    pol = GoodputPolicy(headroom_c=c, **kw)
    assert pol.observe(Observation(headroom=h, headroom_B=64)) is False      # no noise estimate: not counted
    d = pol.decide(PolicyState(B=64, b_noise=bn), space)
    assert d.B <= max(64, c * h * 64) + 1e-9
    if free.B <= c * h * 64:
        assert d.B == free.B                         # within the cap: Pollux's decision as before
    else:
        assert "headroom" in d.reason
    assert pol.state_dict()["headroom"] == {"c": c, "h": h, "B_h": 64.0}


@settings(max_examples=100, deadline=None)
@given(st.floats(0.2, 5.0), st.floats(1.0, 8.0), st.integers(16, 512), st.floats(-0.5, 0.9))
def test_similarity_cap_refuses_growth_past_c_h_and_never_a_shrink(h, c, B, sim):
    space = BatchSpace.integers(8, 1024)
    free = SimilarityPolicy(B_min=8, B_max=1024).decide(PolicyState(B=B, similarity=sim), space)
    d = SimilarityPolicy(B_min=8, B_max=1024, headroom_c=c).decide(
        PolicyState(B=B, similarity=sim, headroom=h), space)
    if free.B <= B or free.B <= c * h * B:
        assert d.B == free.B                         # shrinks and moves within the cap: as before
    else:
        assert B <= d.B <= max(B, c * h * B) and d.B < free.B and "headroom" in d.reason


def test_defaults_and_bad_values():
    assert make_policy("noise-scale", B0=32, B_max=512).config() == GoodputPolicy(B0=32, B_max=512).config()
    assert "efficiency" not in GoodputPolicy(B0=32, B_max=512).config()
    assert "headroom" not in SimilarityPolicy(B_max=512).state_dict()
    for kw, what in (({"efficiency": "sqrt"}, "efficiency='sqrt'"), ({"headroom_c": 0.0}, "headroom_c=0.0"),
                     ({"headroom_c": math.inf}, "headroom_c=inf")):
        with pytest.raises(ConfigError, match=what):
            make_policy("noise-scale", B0=32, B_max=512, **kw)
    with pytest.raises(ConfigError, match="headroom_c=-1"):
        make_policy("similarity", B_max=512, headroom_c=-1)
    pol = SimilarityPolicy(B_max=512, headroom_c=2.0)
    pol.decide(PolicyState(B=64, similarity=0.0, headroom=0.5), BatchSpace.integers(1, 512))
    again = SimilarityPolicy(B_max=512, headroom_c=2.0)
    again.load_state_dict(pol.state_dict())
    assert again.cap.state_dict() == {"c": 2.0, "h": 0.5, "B_h": 64.0}


def test_the_job_keys_reach_the_policies_and_a_bad_one_is_one_line():
    from hpc_jabas.core.adaptive.policies.registry import policy_for_job
    from hpc_jabas.core.config.sections import JobConfig
    pol = policy_for_job(JobConfig(policy="goodput", batch=32, batch_max=512, efficiency="linear", headroom_c=3.0),
                         10)
    assert isinstance(pol, GoodputPolicy) and (pol.efficiency, pol.cap.c) == ("linear", 3.0)
    sim = policy_for_job(JobConfig(policy="similarity", batch=32, batch_max=512, headroom_c=5.0), 10)
    assert isinstance(sim, SimilarityPolicy) and sim.cap.c == 5.0
    default = policy_for_job(JobConfig(policy="goodput", batch=32, batch_max=512), 10)
    assert isinstance(default, GoodputPolicy) and (default.efficiency, default.cap.c) == ("pollux", 4.0)
    for kw, what in (({"efficiency": "adam"}, "efficiency"), ({"headroom_c": -2.0}, "headroom_c")):
        with pytest.raises(ConfigError, match=what) as e:
            JobConfig(policy="goodput", batch=32, **kw).validate()
        assert "\n" not in str(e.value)
