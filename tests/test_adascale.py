"""lr_rule = "adascale": the AdaScale gain against a Monte-Carlo reference, its limits, its checkpointed
state, the controller feeding it, and a per-iteration scheduler advancing r steps per iteration."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hpc_jabas.core.adaptive.policy import lr_rule_name, make_lr_rule
from hpc_jabas.core.adaptive.scaling import AdaScaleRule
from hpc_jabas.errors import ConfigError


def test_gain_is_the_ratio_of_mean_squared_batch_gradients():
    """AdaScale's definition, r = E|g_B_ref|^2 / E|g_B|^2, by Monte Carlo on linear regression whose
    per-sample gradients x (x.d - eps) have |G|^2 = |d|^2 and tr(Sigma) = (D + 1)|d|^2 + D s^2 (Isserlis)."""
    rng = np.random.default_rng(7)
    D, sig = 8, 1.0
    d = rng.standard_normal(D)
    d *= 0.3 / np.linalg.norm(d)
    g2, trace = float(d @ d), (D + 1) * float(d @ d) + D * sig ** 2

    def mean_sq(batch, reps=20000):
        x = rng.standard_normal((reps, batch, D))
        r = x @ d - sig * rng.standard_normal((reps, batch))
        g = np.einsum("rb,rbd->rd", r, x) / batch
        return float(np.mean(np.sum(g * g, axis=1)))

    rule = AdaScaleRule(B_ref=4)
    rule.observe(g2, trace)
    for B in (8, 32):
        want = mean_sq(4) / mean_sq(B)
        assert rule.lr_scale(B) == pytest.approx(want, rel=0.03), B


@given(B_ref=st.integers(1, 4096), B=st.integers(1, 1 << 16), g2=st.floats(1e-6, 1e3), S=st.floats(0.0, 1e6))
def test_gain_lies_between_one_and_the_linear_factor(B_ref, B, g2, S):
    rule = AdaScaleRule(B_ref)
    rule.observe(g2, S)
    s, r = B / B_ref, rule.lr_scale(B)
    assert min(1.0, s) * (1 - 1e-9) <= r <= max(1.0, s) * (1 + 1e-9)
    # Pollux's reading of it: the linear factor times the statistical efficiency E(B), B_0 = B_ref
    phi = S / g2
    assert r == pytest.approx(s * (phi + B_ref) / (phi + B), rel=1e-9)


def test_limits_state_and_names():
    rule = make_lr_rule("adascale", B_ref=64, policy="goodput")
    assert isinstance(rule, AdaScaleRule) and rule.lr_scale(256) == 1.0        # no estimate yet
    rule.observe(-1.0, 5.0)
    assert rule.lr_scale(256) == 4.0                                          # |G|^2 <= 0: noise dominates
    rule.observe(2.0, 0.0)
    assert rule.lr_scale(256) == 1.0                                          # no noise: no larger step
    rule.observe(float("nan"), 1.0)                                           # ignored
    rule.observe(1.0, 640.0)
    back = make_lr_rule("adascale", B_ref=64)
    back.load_state_dict(rule.state_dict())
    assert back.lr_scale(256) == rule.lr_scale(256) == pytest.approx((10 + 1) / (10 / 4 + 1))
    assert lr_rule_name("Ada-Scale") == "adascale" and lr_rule_name("auto", "noise-scale") == "linear"
    with pytest.raises(ConfigError, match="adascale"):
        make_lr_rule("ada", B_ref=64)


def test_a_per_iteration_scheduler_advances_r_steps_per_iteration(tmp_path):
    """On one rank with goodput and lr_rule = adascale: every decision's lr scale is the gain of the goodput
    policy's estimates (est_G2, est_S: its memory in samples, the one estimate B and the lr read) at its B, and a
    per-iteration scheduler has stepped sum(lr_scale) times (the fraction carried), not once per iteration."""
    from reference import make_data, make_model

    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer

    ds = make_data(480)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
    cfg = JobConfig(policy="goodput", batch=16, batch_min=16, batch_max=128, epochs=3, checkpoint=False, p=4,
                    lr_rule="adascale", batch_ref=4, run_dir=str(tmp_path / "run"))
    tr = Trainer(model, opt, ds, torch.nn.CrossEntropyLoss(), config=cfg, scheduler=sched,
                 scheduler_step="iteration", world=World(rank=0, size=1, gpu_types=("v100",)))
    tr.fit()
    recs = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    decisions = [r for r in recs if r["type"] == "decision"]
    its = [r for r in recs if r["type"] == "iteration"]
    assert decisions
    held = 0
    for prev, dec in zip([None, *decisions], decisions):
        st_ = dec["stats"]
        if st_["est_G2"] is None:
            assert dec["lr_scale"] == 1.0
            continue
        if "guard_blocked" in st_:      # a raise the divergence guard could not judge yet (< 5 losses): kept
            assert "divergence guard" in dec["reason"] and st_["guard_blocked"]["lr_scale"] > 2 * dec["lr_scale"]
            assert dec["lr_scale"] == (prev["lr_scale"] if prev is not None else 1.0)
            held += 1
            continue
        var = max(0.0, st_["est_S"]) / 4                  # batch_ref = 4: the lr was tuned at B = 4
        s = dec["B"] / 4
        want = s if st_["est_G2"] <= 0 else (var + st_["est_G2"]) / (var / s + st_["est_G2"])
        assert dec["lr_scale"] == pytest.approx(want, rel=1e-9)
    total = sum(r["lr_scale"] for r in its)
    assert sched.last_epoch == math.floor(total + 1e-9)
    assert any(1.0 < r["lr_scale"] < r["B"] / 4 for r in its), "the gain never left its limits here"
    assert total != len(its)                      # not once per iteration
    assert held <= 1 and len(decisions) - held >= 5
