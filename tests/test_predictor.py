"""Online NARX speed predictor (LB-BSP): no oracle (features from past windows only), accuracy vs last
value where a signal leads speed, exactness, state, errors."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hpc_jabas.core.balancing import LastValuePredictor, NarxPredictor, RankPredictors
from hpc_jabas.errors import ConfigError

T = 300


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


def score(speeds, exos, n_ranks=1, **kw) -> dict:
    """Run the predict -> observe -> update protocol over a series; return the error report."""
    rp = RankPredictors(n_ranks, **kw)
    for t in range(len(speeds)):
        if t:
            rp.predict()                  # nothing of window t is available here
        rp.update(speeds[t], exos[t])
    return rp.error_report()


def linear_series(seed=0, noise=0.5, periodic=False, lead=1):
    """speed_t = 100 - 60 cpu_{t-lead} + noise: the signal leads speed by `lead` windows."""
    rng = np.random.default_rng(seed)
    if periodic:
        cpu = 0.5 + 0.4 * np.sin(np.arange(T + lead) * 2 * np.pi / 17)
    else:
        cpu = rng.uniform(0.0, 1.0, T + lead)
    speed = 100.0 - 60.0 * cpu[:T] + rng.normal(0.0, noise, T)
    cpu = cpu[lead:]                       # cpu reported in window t is the one speed reacts to at t+lead
    return [[float(v)] for v in speed], [[{"cpu": float(c)}] for c in cpu]


@pytest.mark.parametrize("periodic", [False, True])
def test_narx_beats_last_value_when_a_signal_leads_speed_by_one_window(periodic):
    speeds, exos = linear_series(periodic=periodic)
    rep = score(speeds, exos)
    assert rep["scored"] == T - 1
    assert rep["predictor_error"] < 0.5 * rep["lastvalue_error"], rep
    base = score(speeds, exos, kind="last")
    assert base["predictor_error"] == pytest.approx(rep["lastvalue_error"])
    assert base["lastvalue_error"] == pytest.approx(rep["lastvalue_error"])


def test_periodic_bursts_with_exo_flag_predicted_better_than_last_value():
    """A co-located job that shows on a host signal one window before it slows this rank down."""
    rng = np.random.default_rng(1)
    k = 5
    burst = [float((t // k) % 2) for t in range(T + 1)]
    speed = [(40.0 if b else 100.0) * (1 + rng.normal(0, 0.01)) for b in burst[:T]]
    warn = burst[1:]                       # measured in window t, about window t+1
    rep = score([[v] for v in speed], [[{"burst": w, "mem_util": 55.0}] for w in warn])
    assert rep["predictor_error"] < 0.5 * rep["lastvalue_error"], rep
    # the transitions themselves are anticipated: look at the windows right after a flip
    p = NarxPredictor()
    errs = []
    for t in range(T):
        if t > 100 and burst[t] != burst[t - 1]:
            errs.append(abs(p.predict() - speed[t]) / speed[t])
        p.update(speed[t], {"burst": warn[t]})
    assert max(errs) < 0.1          # last value is off by 60% / 150% there


def test_constant_series_is_exact():
    for exo in (None, {"cpu": 0.3, "gpu_clock_mhz": 1380.0}):
        p = NarxPredictor()
        for _ in range(40):
            p.update(7.25, exo)
        assert p.ready
        assert p.predict() == 7.25
        assert np.all(p.theta == 0.0)


def test_step_change_followed_within_a_few_windows():
    rng = np.random.default_rng(2)
    p = NarxPredictor()
    series = [100.0 * (1 + rng.normal(0, 0.005)) for _ in range(60)] + \
             [50.0 * (1 + rng.normal(0, 0.005)) for _ in range(20)]
    preds = []
    for v in series:
        preds.append(p.predict() if p.last is not None else None)
        p.update(v)
    for t in range(62, 80):               # from the third window after the step on
        assert abs(preds[t] - 50.0) / 50.0 < 0.05, (t, preds[t])


def test_random_walk_is_no_worse_than_last_value_by_much():
    """No exploitable structure: the model must not hurt much (it starts at the last-value prior)."""
    rng = np.random.default_rng(3)
    speed = 100 * np.exp(np.cumsum(rng.normal(0, 0.02, T)))
    noise_exo = rng.uniform(0, 1, T)
    rep = score([[float(v)] for v in speed], [[{"cpu": float(c)}] for c in noise_exo])
    assert rep["predictor_error"] < 1.1 * rep["lastvalue_error"], rep


def test_scale_free_in_speed_and_signal_units():
    speeds, exos = linear_series(seed=4)
    a, b = NarxPredictor(), NarxPredictor()
    for t in range(120):
        v, x = speeds[t][0], exos[t][0]["cpu"]
        if t > 20:
            pa = a.predict()
            pb = b.predict()
            assert pb / 1000.0 == pytest.approx(pa, rel=1e-7)
        a.update(v, {"cpu": x})
        b.update(1000.0 * v, {"cpu_pct": 100.0 * x})


def test_missing_and_non_finite_signals_hold_the_last_value():
    rng = np.random.default_rng(5)
    p = NarxPredictor()
    for t in range(100):
        cpu = float(rng.uniform(0, 1))
        exo = {"cpu": cpu}
        if t % 7 == 0:
            exo = {}                                  # missing this window
        elif t % 11 == 0:
            exo = {"cpu": math.nan}                   # telemetry failed
        if t == 50:
            exo["gpu_power_w"] = 250.0                # a signal that appears late
        p.update(100.0 - 60.0 * cpu, exo)
        assert math.isfinite(p.predict())
    assert p.names == ["cpu", "gpu_power_w"]
    assert p.dim == 1 + 3 + 2 * 2
    # the same result when a missing value is given as its held value
    q = NarxPredictor(exo_names=["cpu"])
    q.update(10.0, {"cpu": 0.2, "other": 1.0})
    assert q.names == ["cpu"]


def test_prediction_clipped_to_a_range_around_the_last_value():
    speeds, exos = linear_series(seed=6, noise=0.0)
    p = NarxPredictor()
    for t in range(100):
        p.update(speeds[t][0], exos[t][0])
    state = p.state_dict()
    v = speeds[100][0]

    def after(cpu):                        # the prediction after one more window reporting `cpu`
        q = NarxPredictor()
        q.load_state_dict(state)
        q.update(v, {"cpu": cpu})
        return q
    assert after(100.0).predict() == pytest.approx(0.25 * v)      # raw model: far below 0
    assert after(100.0).predict_raw() < 0
    assert after(-100.0).predict() == pytest.approx(4.0 * v)
    assert after(0.5).predict() == pytest.approx(70.0, rel=1e-3)


def test_warmup_falls_back_to_last_value():
    p = NarxPredictor(d=3, d_exo=1)
    for t in range(5):
        p.update(100.0 + 10 * t, {"cpu": 0.1 * t})
        assert not p.ready
        assert p.predict() == p.last
    assert p.warmup == 2 * p.dim == 12


def test_state_round_trip_through_json():
    speeds, exos = linear_series(seed=7)
    p = NarxPredictor(d=2, d_exo=2, forgetting=0.95)
    for t in range(80):
        p.update(speeds[t][0], exos[t][0])
    st = json.loads(json.dumps(p.state_dict()))
    q = NarxPredictor()
    q.load_state_dict(st)
    assert (q.d, q.d_exo, q.forgetting) == (2, 2, 0.95)
    for t in range(80, 120):
        x = exos[t][0]
        assert q.predict() == p.predict()
        p.update(speeds[t][0], x)
        q.update(speeds[t][0], x)
    last = LastValuePredictor()
    last.update(3.0)
    l2 = LastValuePredictor()
    l2.load_state_dict(json.loads(json.dumps(last.state_dict())))
    assert l2.predict() == 3.0


def test_rank_predictors_state_round_trip_and_errors_survive():
    rng = np.random.default_rng(8)
    rp = RankPredictors(3, d=2, clip=(0.5, 2.0))
    for t in range(40):
        load = [float(rng.uniform(0, 1)) for _ in range(3)]
        if t:
            rp.predict()
        rp.update([100 - 50 * x for x in load], [{"load": x} for x in load])
    st = json.loads(json.dumps(rp.state_dict()))
    rq = RankPredictors(1, kind="last")
    rq.load_state_dict(st)
    assert rq.n_ranks == 3 and rq.kind == "narx"
    assert rq.error_report() == rp.error_report()
    assert rq.predict() == rp.predict()
    assert rq[0].clip == (0.5, 2.0)


def test_rank_predictors_unmeasured_ranks_and_shared_signals():
    rp = RankPredictors(3)
    with pytest.raises(ConfigError) as e:
        rp.predict()
    assert "rank 0" in one_line(e)
    assert rp.predict(default=1.0) == [1.0, 1.0, 1.0]
    rp.update([1.0, None, 2.0], {"cpu": 0.1})          # rank 1 dropped; one dict for all ranks
    out = rp.predict(default=1.5)
    assert out == [1.0, 1.5, 2.0]
    rp.update([1.0, 3.0, 2.0])
    assert rp.n_scored == 2                            # rank 1 had no prediction to score
    assert rp.mean_abs_rel_error == 0.0 and rp.lastvalue_error == 0.0
    rp.update([2.0, 3.0, 2.0])                         # no predict() before: not scored
    assert rp.n_scored == 2
    assert math.isnan(RankPredictors(2).mean_abs_rel_error)


@pytest.mark.parametrize("make, needle", [
    (lambda: NarxPredictor(d=0), "d (speed lags)=0"),
    (lambda: NarxPredictor(d=2.5), "d (speed lags)=2.5"),
    (lambda: NarxPredictor(d_exo=-1), "d_exo"),
    (lambda: NarxPredictor(forgetting=1.5), "forgetting=1.5"),
    (lambda: NarxPredictor(forgetting=0.1), "forgetting=0.1"),
    (lambda: NarxPredictor(forgetting=math.nan), "forgetting=nan"),
    (lambda: NarxPredictor(delta=0), "delta=0"),
    (lambda: NarxPredictor(clip=(2.0, 4.0)), "clip lo=2.0"),
    (lambda: NarxPredictor(clip=3), "clip=3"),
    (lambda: NarxPredictor(exo_names=["a", "a"]), "exo_names"),
    (lambda: NarxPredictor(max_exo=1).update(1.0, {"a": 1, "b": 2}), "max_exo=1"),
    (lambda: NarxPredictor().update(-1.0), "speed=-1.0"),
    (lambda: NarxPredictor().update(math.inf), "speed=inf"),
    (lambda: NarxPredictor().update("fast"), "speed='fast'"),
    (lambda: NarxPredictor().update(1.0, {"cpu": "high"}), "'cpu'='high'"),
    (lambda: NarxPredictor().update(1.0, [0.5]), "exo=[0.5]"),
    (lambda: NarxPredictor().predict(), "no speed observed"),
    (lambda: LastValuePredictor().predict(), "no speed observed"),
    (lambda: RankPredictors(0), "n_ranks=0"),
    (lambda: RankPredictors(2, kind="lstm"), "kind='lstm'"),
    (lambda: RankPredictors(2, kind="last", d=3), "takes no options"),
    (lambda: RankPredictors(2, d=0), "d (speed lags)=0"),
    (lambda: RankPredictors(2).update([1.0]), "list of 2 speeds"),
    (lambda: RankPredictors(2).update([1.0, 0.0]), "speed of rank 1=0.0"),
    (lambda: RankPredictors(2).update([1.0, 1.0], [{}]), "list of 2 dicts"),
    (lambda: NarxPredictor().load_state_dict(LastValuePredictor().state_dict()), "kind 'last'"),
    (lambda: NarxPredictor().load_state_dict({"kind": "narx", "version": 2}), "malformed"),
    (lambda: NarxPredictor().load_state_dict({**NarxPredictor().state_dict(), "version": 1}), "version 1"),
    (lambda: NarxPredictor().load_state_dict({**NarxPredictor().state_dict(), "theta": [0.0]}),
     "does not match"),
])
def test_bad_input_is_one_clear_config_error(make, needle):
    with pytest.raises(ConfigError) as e:
        make()
    assert needle in one_line(e)


def test_failed_load_leaves_the_predictor_unchanged():
    p = NarxPredictor()
    p.update(5.0)
    bad = {**p.state_dict(), "P": [[1.0]]}
    with pytest.raises(ConfigError):
        p.load_state_dict(bad)
    assert p.predict() == 5.0


def test_the_predictor_cannot_see_the_window_it_predicts():
    """The features of window t are built from windows < t; window t's own signal never enters."""
    rng = np.random.default_rng(11)
    v = [float(x) for x in rng.uniform(50, 100, 30)]
    x = [float(c) for c in rng.uniform(0, 1, 31)]
    p = NarxPredictor(d=2, d_exo=1)
    for t in range(30):
        p.update(v[t], {"cpu": x[t]})
    S, E = max(v), max(x[:30])
    want = [1.0, v[29] / S, (v[29] - v[28]) / S, x[29] / E, (x[29] - x[28]) / E]
    assert np.allclose(p.features(), want, rtol=0, atol=1e-12)
    # and the speed of a window that depends only on its own signal is not predictable from it
    cpu = rng.uniform(0, 1, T)
    speed = 100.0 - 60.0 * cpu
    rep = score([[float(s)] for s in speed], [[{"cpu": float(c)}] for c in cpu])
    assert rep["predictor_error"] > 0.15, rep          # an oracle would be exact here (noise 0)


def test_a_signal_of_the_predicted_window_changes_nothing():
    """Two runs that differ only in the signal of the last window predict that window identically."""
    rng = np.random.default_rng(12)
    speeds, exos = linear_series(seed=12)
    a, b = NarxPredictor(), NarxPredictor()
    for t in range(100):
        a.update(speeds[t][0], exos[t][0])
        b.update(speeds[t][0], exos[t][0])
    pa, pb = a.predict(), b.predict()
    assert pa == pb
    a.update(speeds[100][0], {"cpu": float(rng.uniform(0, 1))})
    b.update(speeds[100][0], {"cpu": float(rng.uniform(0, 1))})
    assert not np.allclose(a.features(), b.features())          # the signal matters for the NEXT window
