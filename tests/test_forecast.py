import math

import numpy as np
import pytest

from hpc_jabas.core.autoscale.forecast import forecast_error, forecast_next_epoch, gp_forecast, holt_forecast
from hpc_jabas.errors import ConfigError

P = 100


def ramp(n, b0=100, slope=0.1):
    return [(i * P, b0 + slope * i * P) for i in range(n)]


def test_constant_history_gives_constant_forecast():
    hist = [(i * P, 256) for i in range(15)]
    assert forecast_next_epoch(hist, 1000, period_p=P) == [256] * 10


def test_short_history_falls_back_to_last_value():
    assert forecast_next_epoch([(0, 64)], 450, period_p=P) == [64] * 5
    assert forecast_next_epoch([(0, 64), (100, 80)], 300, period_p=P) == [80] * 3


def test_linear_ramp_is_followed():
    hist = ramp(21)                                   # B = 100 + iteration / 10
    out = forecast_next_epoch(hist, 1000, period_p=P)
    truth = [100 + 0.1 * t for t in range(2100, 3100, P)]
    assert len(out) == 10
    assert forecast_error(out, truth) < 0.05
    assert all(b2 >= b1 for b1, b2 in zip(out, out[1:]))


def test_noisy_ramp_is_followed_roughly():
    rng = np.random.default_rng(0)
    hist = [(t, b + rng.normal(0, 8)) for t, b in ramp(30)]
    out = forecast_next_epoch(hist, 600, period_p=P)
    truth = [100 + 0.1 * t for t in range(3000, 3600, P)]
    assert forecast_error(out, truth) < 0.15
    assert out[-1] > hist[0][1]


def test_plateau_stays_near_plateau():
    hist = [(t, min(b, 300)) for t, b in ramp(30, slope=0.2)]
    out = forecast_next_epoch(hist, 1000, period_p=P)
    assert forecast_error(out, [300] * 10) < 0.10


def test_clipping_to_bounds():
    hist = ramp(21, slope=1.0)                        # 100 .. 2100, rising fast
    out = forecast_next_epoch(hist, 1000, period_p=P, B_min=16, B_max=2500)
    assert max(out) == 2500 and all(16 <= b <= 2500 for b in out)
    down = [(t, 3000 - b) for t, b in hist]           # falling toward 900 and below
    out = forecast_next_epoch(down, 2000, period_p=P, B_min=500, B_max=4000)
    assert min(out) == 500 and all(500 <= b <= 4000 for b in out)


def test_periods_count_and_horizon_cap():
    hist = [(i * P, 128) for i in range(5)]
    assert len(forecast_next_epoch(hist, 1050, period_p=P)) == 11      # ceil(1050 / 100)
    assert len(forecast_next_epoch(hist, 1050, horizon_iters=300, period_p=P)) == 3


def test_callable_epoch_length_consumes_one_epoch_of_samples():
    N = 64_000
    hist = [(i * P, 128) for i in range(5)]
    out = forecast_next_epoch(hist, lambda B: math.ceil(N / B), period_p=P)
    assert len(out) == 5 and set(out) == {128}         # 500 iterations of 128 samples
    # growing B: fewer periods than at the starting B
    grow = forecast_next_epoch(ramp(21, b0=100, slope=1.0), lambda B: math.ceil(N / B), period_p=10)
    assert sum(10 * b for b in grow) >= N * 0.98
    assert sum(10 * b for b in grow[:-1]) < N
    with pytest.raises(ConfigError):
        forecast_next_epoch(hist, lambda B: 0, period_p=P)


def test_start_iter_shifts_forecast():
    hist = ramp(21)
    a = forecast_next_epoch(hist, 300, period_p=P)
    b = forecast_next_epoch(hist, 300, period_p=P, start_iter=2000 + 5 * P)
    assert b[0] > a[0]


def test_deterministic():
    rng = np.random.default_rng(3)
    hist = [(i * P, 200 + 50 * math.sin(i / 4) + rng.normal(0, 5)) for i in range(40)]
    assert forecast_next_epoch(hist, 2000, period_p=P) == forecast_next_epoch(list(hist), 2000, period_p=P)


def test_a_reused_fit_forecasts_as_a_refit(monkeypatch):
    from hpc_jabas.core.autoscale import forecast
    rng = np.random.default_rng(5)
    hist = [(i * P, 300 + 20 * i + rng.normal(0, 9)) for i in range(30)]
    forecast._fits.clear()
    for start in (3000, 3100, 5000):           # the same history forecast from later and later iterations
        fresh = forecast_next_epoch(hist, lambda b: 60_000 // b + 1, period_p=P, start_iter=start, reuse_fit=False)
        assert forecast_next_epoch(hist, lambda b: 60_000 // b + 1, period_p=P, start_iter=start) == fresh
    assert len(forecast._fits) == 1                 # one fit, reused
    monkeypatch.setattr(forecast, "FIT_CACHE_SIZE", 0)
    forecast._fits.clear()
    forecast_next_epoch(hist, 2000, period_p=P)
    assert not forecast._fits


def test_components():
    y = [10.0, 12.0, 14.0, 16.0, 18.0]
    assert holt_forecast(y, np.array([1.0, 2.0])) == pytest.approx([20.0, 22.0], abs=0.5)
    assert holt_forecast([5.0], np.array([3.0])) == pytest.approx([5.0])
    ts = np.arange(10) * 100.0
    assert gp_forecast(ts, 7.0 + 0 * ts, [1200.0]) == pytest.approx([7.0])


@pytest.mark.parametrize("kwargs,needle", [
    (dict(history=[], iters_per_epoch=10), "history is empty"),
    (dict(history=[(0, 8)], iters_per_epoch=10, period_p=0), "period_p=0"),
    (dict(history=[(0, 8)], iters_per_epoch=0), "iters_per_epoch=0"),
    (dict(history=[(0, 8)], iters_per_epoch=10, B_min=9, B_max=4), "B_min=9"),
    (dict(history=[(0, 8), (100, 0)], iters_per_epoch=10), "B > 0"),
    (dict(history=[(100, 8), (0, 9)], iters_per_epoch=10), "iteration order"),
    (dict(history=[(0,)], iters_per_epoch=10), "(iteration, B)"),
])
def test_validation(kwargs, needle):
    with pytest.raises(ConfigError) as e:
        forecast_next_epoch(**kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_forecast_error_values():
    assert forecast_error([100, 200], [100, 200]) == 0.0
    assert forecast_error([110, 180], [100, 200]) == pytest.approx(0.10)
    assert forecast_error([50], [100]) == pytest.approx(0.5)
    assert forecast_error([100, 100, 999], [200, 50]) == pytest.approx((0.5 + 1.0) / 2)   # common prefix
    with pytest.raises(ConfigError):
        forecast_error([], [1])
    with pytest.raises(ConfigError):
        forecast_error([1], [0])
