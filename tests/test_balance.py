"""LB-BSP rebalancing decision: one-step response, hysteresis, oscillation damping, invariants."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hpc_jabas.core.balancing import RankPredictors, Rebalancer, interpolate_plan
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning import Plan, plan_batch, proportional_plan
from hpc_jabas.errors import ConfigError, StateError

GPUS = ["v100"] * 4
MODEL = PerfModel.emulated(GPUS)
B = 1024


def plan_fn(B, f):                       # the real planner, one micro-batch size
    return plan_batch(B, GPUS, MODEL, speed_factors=f, b_candidates=[8])


def time_fn(p, f):                       # the real perf model
    return MODEL.iteration_time(p, GPUS, f)


def prop_plan_fn(B, f):                  # plain LB-BSP: shares proportional to speed
    return proportional_plan(B, 8, f)


def prop_time_fn(p, f):
    return max(n / s for n, s in zip(p.n, f))


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("pf, tf", [(plan_fn, time_fn), (prop_plan_fn, prop_time_fn)])
def test_rank_slowed_3x_gets_its_proportional_share_in_one_proposal(pf, tf):
    r = Rebalancer()
    cur = pf(B, [1.0] * 4)
    assert cur.n == (32, 32, 32, 32)
    f = [1 / 3, 1.0, 1.0, 1.0]
    new, info = r.propose(B, cur, f, pf, tf)
    assert new is not None and not info["kept"] and not info["damped"]
    share = new.n[0] / new.M
    ideal = f[0] / sum(f)
    assert abs(share - ideal) <= 0.1 * ideal, (new, ideal)
    assert new.B == B and info["gain"] > 0.5


def test_one_percent_change_does_not_replan():
    r = Rebalancer(threshold=0.05)
    cur = plan_fn(B, [1.0] * 4)
    for f in ([0.99, 1, 1, 1], [1.01, 1, 1, 1], [1, 0.99, 1.01, 1]):
        new, info = r.propose(B, cur, f, plan_fn, time_fn)
        assert new is None and info["kept"]
        assert info["gain"] <= 0.05
    # a different candidate whose predicted gain is too small is refused by the hysteresis
    new, info = r.propose(B, cur, [0.95, 1, 1, 1], plan_fn, time_fn)
    assert info["candidate"] != str(cur) and 0 <= info["gain"] <= 0.05
    assert new is None and "threshold" in info["reason"]
    # ... while a zero threshold takes any strict gain
    new, _ = Rebalancer(threshold=0.0).propose(B, cur, [0.9, 1, 1, 1], plan_fn, time_fn)
    assert new is not None and new.n[0] < 32


def run_alternating(periods, per_period, damping, pf=plan_fn, tf=time_fn):
    r = Rebalancer(damping=damping)
    cur = pf(B, [1.0] * 4)
    n0 = [cur.n[0]]                           # rank 0's count at the start and after every period
    flips = 0
    for k in range(periods):
        f = [1 / 3, 1.0, 1.0, 1.0] if k % 2 == 0 else [1.0, 1.0, 1.0, 1.0]
        for _ in range(per_period):
            new, info = r.propose(B, cur, f, pf, tf)
            assert info["kept"] == (new is None)
            if new is not None:
                assert new.B == B and new.M == cur.M
                cur = new
        if k and cur.n[0] != n0[-1]:
            flips += 1
        n0.append(cur.n[0])
    return flips, n0


@pytest.mark.parametrize("pf, tf", [(plan_fn, time_fn), (prop_plan_fn, prop_time_fn)])
def test_alternating_slow_fast_does_not_flip_every_period(pf, tf):
    flips, n0 = run_alternating(10, 1, damping=True, pf=pf, tf=tf)
    assert flips < 5, n0
    undamped, m0 = run_alternating(10, 1, damping=False, pf=pf, tf=tf)
    assert undamped == 9, m0                  # without damping it flips every period


def test_alternating_with_several_proposals_per_period_shrinks_the_amplitude():
    _, n0 = run_alternating(10, 3, damping=True)
    first = abs(n0[1] - n0[0])
    late = max(abs(a - b) for a, b in zip(n0[6:], n0[7:]))
    assert first == 32 - 13
    assert late <= first / 2, n0
    _, m0 = run_alternating(10, 3, damping=False)
    assert min(abs(a - b) for a, b in zip(m0, m0[1:])) == first


def test_first_reversal_moves_halfway_and_sum_is_kept():
    r = Rebalancer()
    cur = plan_fn(B, [1.0] * 4)
    slow, _ = r.propose(B, cur, [1 / 3, 1, 1, 1], plan_fn, time_fn)
    cand = plan_fn(B, [1.0] * 4)
    back, info = r.propose(B, slow, [1.0] * 4, plan_fn, time_fn)
    assert info["damped"] and info["step"] == 0.5 and info["reversed_ranks"] == [0, 1, 2, 3]
    for s, c, n in zip(slow.n, cand.n, back.n):
        assert min(s, c) <= n <= max(s, c)
        assert abs(n - (s + c) / 2) <= 0.5
    assert back.M == slow.M and back.b == slow.b


def test_persistent_change_after_oscillation_is_followed():
    r = Rebalancer(max_history=4)
    cur = plan_fn(B, [1.0] * 4)
    for k in range(6):                            # oscillate first
        f = [1 / 3, 1, 1, 1] if k % 2 == 0 else [1.0] * 4
        new, _ = r.propose(B, cur, f, plan_fn, time_fn)
        cur = new or cur
    target = plan_fn(B, [1 / 3, 1, 1, 1])
    for _ in range(12):                           # then rank 0 stays slow
        new, _ = r.propose(B, cur, [1 / 3, 1, 1, 1], plan_fn, time_fn)
        cur = new or cur
    assert time_fn(cur, [1 / 3, 1, 1, 1]) <= 1.05 * time_fn(target, [1 / 3, 1, 1, 1])
    assert r.step == 1.0


def test_invariants_under_random_factor_sequences():
    gpus = ["v100", "v100", "p100", "rtx2060", "a100"]
    model = PerfModel.emulated(gpus)
    rng = np.random.default_rng(0)
    for allow_drop, cands in ((False, [4, 8, 16]), (True, [8, 32, 64]), (False, [8])):
        def pf(B, f, cands=cands, allow_drop=allow_drop):
            return plan_batch(B, gpus, model, speed_factors=f, b_candidates=cands, allow_drop=allow_drop)

        def tf(p, f):
            return model.iteration_time(p, gpus, f)

        Bx = 512
        r = Rebalancer(threshold=0.02)
        cur = pf(Bx, [1.0] * 5)
        for _ in range(40):
            f = list(np.exp(rng.normal(0, 0.6, 5)))
            new, info = r.propose(Bx, cur, f, pf, tf)
            if new is None:
                assert info["kept"] and info["gain_applied"] == 0.0
                continue
            assert new.B == Bx and new.world_size == 5 and min(new.n) >= 0
            assert info["gain_applied"] > 0.02
            assert tf(new, f) < tf(cur, f)
            if info["damped"] and new.b == cur.b:
                c = pf(Bx, f)
                if c.b == cur.b:
                    assert all(min(a, b) <= n <= max(a, b) for a, b, n in zip(cur.n, c.n, new.n))
            cur = new


def test_interpolation_across_a_change_of_b_uses_the_candidate_ranks_only():
    cur = Plan(4, (4, 4, 4, 4))                   # B = 64
    cand = Plan(8, (0, 4, 2, 2))                  # B = 64; rank 0 cannot hold b = 8
    mid = interpolate_plan(cur, cand, 0.5)
    assert mid.b == 8 and mid.B == 64 and mid.n[0] == 0 and min(mid.n[1:]) >= 1
    assert interpolate_plan(cur, cand, 1.0) is cand
    same = interpolate_plan(cur, Plan(4, (1, 1, 1, 13)), 0.25)
    assert same.M == 16 and same.n[0] >= 1 and same.n == (4, 3, 3, 6)   # 3.25 x 3, 6.25: one extra, lowest rank
    with pytest.raises(ConfigError):
        interpolate_plan(cur, Plan(4, (16,)), 0.5)


def test_state_round_trip():
    r = Rebalancer()
    cur = plan_fn(B, [1.0] * 4)
    for k in range(3):
        new, _ = r.propose(B, cur, [1 / 3, 1, 1, 1] if k % 2 == 0 else [1.0] * 4, plan_fn, time_fn)
        cur = new or cur
    q = Rebalancer(threshold=0.3, damping=False)
    q.load_state_dict(json.loads(json.dumps(r.state_dict())))
    assert q.threshold == 0.05 and q.damping and q.step == r.step < 1.0
    a, ia = r.propose(B, cur, [1 / 3, 1, 1, 1], plan_fn, time_fn)
    b, ib = q.propose(B, cur, [1 / 3, 1, 1, 1], plan_fn, time_fn)
    assert a == b and ia == ib
    with pytest.raises(StateError, match="rebalancer state is malformed"):      # saved state, not user input
        q.load_state_dict({"kind": "rebalancer", "version": 1})


def test_both_balancing_parts_restore_through_one_state_check():
    """A malformed state is one StateError line naming the part and what makes a good one; a state for another
    rank count says so as it is (not wrapped as "malformed"); the part is unchanged after either."""
    rp = RankPredictors(3, kind="last")
    good = rp.state_dict()
    two = RankPredictors(2, kind="last").state_dict()
    two["n_ranks"] = 3
    with pytest.raises(StateError) as e:
        rp.load_state_dict(two)
    assert str(e.value) == "rank predictor state has 2 ranks, expected 3"
    with pytest.raises(StateError) as e:
        rp.load_state_dict({k: v for k, v in good.items() if k != "n_scored"})
    assert str(e.value) == ("rank predictor state is malformed (KeyError: 'n_scored'); give a dict made by "
                            "RankPredictors.state_dict()")
    assert rp.state_dict() == good
    with pytest.raises(StateError) as e:
        Rebalancer().load_state_dict({"kind": "rebalancer", "version": 1, "config": {}, "world_size": "x"})
    assert str(e.value) == ("rebalancer state is malformed (ValueError: invalid literal for int() with base 10: "
                            "'x'); give a dict made by Rebalancer.state_dict()")


@pytest.mark.parametrize("make, needle", [
    (lambda: Rebalancer(threshold=1.0), "threshold=1.0"),
    (lambda: Rebalancer(threshold=-0.1), "threshold=-0.1"),
    (lambda: Rebalancer(damping="yes"), "damping='yes'"),
    (lambda: Rebalancer(max_history=0), "max_history=0"),
    (lambda: Rebalancer(min_step=0), "min_step=0"),
    (lambda: Rebalancer().propose(B + 8, plan_fn(B, [1] * 4), [1] * 4, plan_fn, time_fn), "B=1032"),
    (lambda: Rebalancer().propose(B, plan_fn(B, [1] * 4), [1] * 3, plan_fn, time_fn), "3 predicted"),
    (lambda: Rebalancer().propose(B, plan_fn(B, [1] * 4), [1, 0, 1, 1], plan_fn, time_fn), "rank 1"),
    (lambda: Rebalancer().propose(B, plan_fn(B, [1] * 4), [1] * 4,
                                  lambda B, f: Plan(8, (1, 1, 1, 1)), time_fn), "keep B"),
    (lambda: Rebalancer().propose(B, plan_fn(B, [1] * 4), [1] * 4, plan_fn, lambda p, f: 0.0),
     "time_fn(current plan)=0.0"),
    (lambda: Rebalancer().propose(B, "b=8 n=1", [1] * 4, plan_fn, time_fn), "not a Plan"),
])
def test_bad_input_is_one_clear_config_error(make, needle):
    with pytest.raises(ConfigError) as e:
        make()
    assert needle in one_line(e)


def test_with_predicted_factors_end_to_end():
    """NARX-predicted factors + rebalancer beat the static equal split under periodic bursts
    announced by a load signal one window ahead (the predictor sees past windows only)."""
    rp = RankPredictors(4)
    r = Rebalancer()
    cur = static = plan_fn(B, [1.0] * 4)
    t_lb = t_static = 0.0
    for t in range(120):
        burst = [float((t // 6) % 2), 0.0, 0.0, 0.0]
        true = [1 / (1 + 2 * x) for x in burst]
        exo = [{"load": float(((t + 1) // 6) % 2)}, {"load": 0.0}, {"load": 0.0}, {"load": 0.0}]
        if t:
            new, _ = r.propose(B, cur, rp.predict(), plan_fn, time_fn)
            cur = new or cur
        t_lb += time_fn(cur, true)
        t_static += time_fn(static, true)
        rp.update(true, exo)
    assert t_lb < 0.8 * t_static
    rep = rp.error_report()
    assert rep["predictor_error"] < 0.5 * rep["lastvalue_error"]


def test_per_rank_plans_interpolate_samples_and_keep_B():
    cur = Plan((300, 150, 62), (1, 1, 1))
    cand = Plan((96, 96, 96), (2, 2, 2), (160, 176, 176))
    mid = interpolate_plan(cur, cand, 0.5)
    assert mid.B == cur.B == cand.B == 512 and mid.xs == (230, 163, 119)
    assert all(max(mid.micro_sizes(i)) <= 96 for i in range(3))
    r = Rebalancer(threshold=0.0)
    new, info = r.propose(512, cur, [1.0, 1.0, 1.0], plan_fn=lambda B, f: cand,
                          time_fn=lambda p, f: float(max(p.xs)))
    assert new == cand and info["gain"] > 0 and r.history[-1]["candidate_b"] == [96, 96, 96]
