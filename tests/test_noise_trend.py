"""The noise scale priced ahead (``noise_trend``): the estimate with a memory in samples lags a noise scale that
grows, by a factor 1 + r tau for a growth rate r per sample and a memory tau; ``NoiseMemory.ahead`` removes the lag
with the average of the average and carries the value halfway to the next decision. References: closed forms for
an exponential trend, a constant noise scale (no correction), and the goodput argmax B* = sqrt(a B_ahead / c)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy import linear_space

from hpc_jabas.core.adaptive.policy import GoodputPolicy, PolicyState
from hpc_jabas.core.adaptive.stats import AHEAD_CAP, NoiseMemory
from hpc_jabas.errors import ConfigError

TAU = 20_000.0


def fed(rho_g: float, rho_s: float, every: float = 4.0, until: float = 20 * TAU, memory: float = TAU) -> NoiseMemory:
    """|G|^2 = exp(rho_g t), tr(Sigma) = 1000 exp(rho_s t), t in samples, measured every ``every`` samples."""
    est = NoiseMemory(memory)
    t = 0.0
    while t < until:
        t += every
        est.add(math.exp(rho_g * t), 1000.0 * math.exp(rho_s * t), every)
    return est


def truth(rho_g: float, rho_s: float, t: float) -> float:
    return 1000.0 * math.exp((rho_s - rho_g) * t)


@pytest.mark.parametrize("rho_g,rho_s", [(-0.5 / TAU, 0.0), (-0.3 / TAU, 0.2 / TAU), (0.0, 0.4 / TAU),
                                         (0.2 / TAU, 0.0)])
def test_an_exponential_trend_is_priced_exactly_now_and_ahead(rho_g, rho_s):
    """The plain estimate lags the truth by (1 + rho_s tau) / (1 + rho_g tau) (closed form of an average with memory
    tau); ``ahead(0)`` is the truth at the last measurement and ``ahead(h)`` the truth h samples later."""
    T = 20 * TAU
    est = fed(rho_g, rho_s)
    lag = (1 + rho_s * TAU) / (1 + rho_g * TAU)
    assert est.b_noise == pytest.approx(truth(rho_g, rho_s, T) / lag, rel=2e-3)
    assert est.ahead(0.0) == pytest.approx(truth(rho_g, rho_s, T), rel=2e-3)
    for h in (1_000.0, 5_000.0):
        assert est.ahead(h) == pytest.approx(truth(rho_g, rho_s, T + h), rel=3e-3)


@settings(max_examples=60, deadline=None)
@given(g2=st.floats(1e-3, 1e3), s=st.floats(1e-3, 1e5), ns=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
       h=st.floats(0, 1e6), memory=st.floats(100, 1e6))
def test_a_constant_noise_scale_is_not_corrected(g2, s, ns, h, memory):
    est = NoiseMemory(memory)
    for n in ns:
        est.add(g2, s, n)
    assert est.ahead(h) == pytest.approx(est.b_noise, rel=1e-9)


def test_the_correction_is_capped_and_an_unresolved_estimate_is_left_as_is():
    est = fed(-4.0 / TAU, 0.0, every=64.0)          # the noise scale grows e^4 per memory: far beyond the cap
    assert est.ahead(10 * TAU) == pytest.approx(AHEAD_CAP * est.b_noise)
    est = fed(4.0 / TAU, 0.0, every=64.0, until=2 * TAU)     # shrinking fast: capped below
    assert est.ahead(10 * TAU) == pytest.approx(est.b_noise / AHEAD_CAP)
    est = NoiseMemory(1000.0)
    est.add(-1.0, 5.0, 100)
    assert est.b_noise == math.inf and est.ahead(500.0) == math.inf


def test_the_second_level_survives_a_checkpoint_and_an_old_one_starts_without_trend():
    est = fed(-0.3 / TAU, 0.0, until=3 * TAU)
    back = NoiseMemory(1.0)
    back.load_state_dict(est.state_dict())
    assert back.ahead(5000.0) == est.ahead(5000.0) and back.b_noise == est.b_noise
    old = {k: v for k, v in est.state_dict().items() if k not in ("g2b", "sb")}
    back.load_state_dict(old)
    assert back.ahead(5000.0) == pytest.approx(back.b_noise, rel=1e-12)


def test_goodput_with_noise_trend_prices_at_the_noise_scale_ahead():
    """B* = sqrt(a B_ahead / c), B_ahead the estimate carried p B / 2 samples ahead; without the key, the plain
    estimate's argmax; the reason says both numbers, the config says the key."""
    a, c = 0.1, 0.001
    space = linear_space(1, 8192, a, c)
    got = {}
    for trend in (False, True):
        pol = GoodputPolicy(B0=32, B_min=1, B_max=8192, p=50, warmup=0, max_step=math.inf, min_gain=0.0,
                            noise_memory=TAU, noise_trend=trend)
        ref = NoiseMemory(TAU)
        t = 0.0
        for _ in range(200):                       # |G|^2 falls as e^(-t / 2 tau): the noise scale grows
            t += 320.0
            pol.observe(math.exp(-0.5 * t / TAU), 1000.0, 320.0)
            ref.add(math.exp(-0.5 * t / TAU), 1000.0, 320.0)
        d = pol.decide(PolicyState(B=32), space)
        bn = ref.ahead(50 * 32 / 2) if trend else ref.b_noise
        assert abs(d.B - math.sqrt(a * bn / c)) <= 1, (d.B, d.reason)
        assert ("priced ahead" in d.reason) == trend and (pol.config().get("noise_trend") is True) == trend
        got[trend] = d.B
    assert got[True] > got[False] * 1.1            # the lag made B too small


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_noise_trend_must_be_a_bool(bad):
    with pytest.raises(ConfigError) as e:
        GoodputPolicy(B0=32, B_min=1, B_max=512, noise_trend=bad)
    assert "noise_trend=" in str(e.value) and "\n" not in str(e.value)


def _trainer(tmp_path, name: str):
    import torch
    from reference import make_data, make_model

    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer

    cfg = JobConfig(policy="noise-scale", batch=8, batch_min=8, batch_max=96, epochs=50, p=4, measure_every=1,
                    noise_trend=True, lr_rule="linear", checkpoint_every=5, run_dir=str(tmp_path / name))
    model = make_model()
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.02), make_data(240), torch.nn.CrossEntropyLoss(),
                   config=cfg, world=World(rank=0, size=1, gpu_types=("v100",)))


def _decisions(tmp_path, name):
    import json
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [{"it": r["at_iteration"], "B": r["B"], **r["stats"]} for r in rows if r["type"] == "decision"]


def test_a_trainer_records_the_priced_noise_scale_and_resumes_exactly(tmp_path):
    """A one-GPU run with noise_trend: each decision with a noise scale records what B was priced with beside the
    plain estimate; a run stopped at a checkpoint and resumed makes the same decisions and weights as one straight
    run (the second level of the estimate is in the checkpoint)."""
    straight = _trainer(tmp_path, "a")
    straight.fit(max_iterations=24)
    ds = [d for d in _decisions(tmp_path, "a") if d.get("b_noise_window") not in (None, math.inf)]
    assert ds and all("b_noise_priced" in d for d in ds), ds[:2]
    assert any(d["b_noise_priced"] != d["b_noise_window"] for d in ds)
    first = _trainer(tmp_path, "b")
    first.fit(max_iterations=10)
    again = _trainer(tmp_path, "b")
    again.fit(max_iterations=24, resume=True)
    assert again.resumed_from is not None
    a, b = straight.model.state_dict(), again.model.state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) == 0.0
    tail = [(d["it"], d["B"], d.get("b_noise_priced")) for d in _decisions(tmp_path, "a") if d["it"] >= 10]
    assert tail == [(d["it"], d["B"], d.get("b_noise_priced")) for d in _decisions(tmp_path, "b") if d["it"] >= 10]
