"""The ramp policy (a batch-size warm-up schedule) and the optional weight-decay rule."""
import pytest
import torch
from fake_trainer import FakeTrainer

from hpc_jabas.core.adaptive.policy import (
    AUTO_LR_RULE,
    LinearScaling,
    NoScaling,
    PolicyState,
    RampPolicy,
    canonical_policy,
    make_lr_rule,
    make_policy,
    make_wd_rule,
)
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning import BatchSpace, optimal_space
from hpc_jabas.errors import ConfigError


def test_ramp_doubles_at_the_default_fractions_up_to_B_max():
    pol = make_policy("ramp", B0=64, B_min=16, B_max=384)
    assert isinstance(pol, RampPolicy) and pol.at == (0.25, 0.5, 0.75) and pol.factor == 2.0
    space = BatchSpace.integers(16, 384)
    got = [pol.decide(PolicyState(B=64, progress=f), space).B for f in (0.0, 0.2, 0.25, 0.49, 0.5, 0.8, 1.0)]
    assert got == [64, 64, 128, 128, 256, 384, 384]                # 512 clipped to B_max
    d = pol.decide(PolicyState(B=128, progress=0.6), space)
    assert (d.B, d.direction) == (256, "set") and "stage 2 of 3" in d.reason
    d = pol.decide(PolicyState(B=128), space)                        # no progress known: keep
    assert (d.B, d.moved) == (128, False) and "progress unknown" in d.reason


def test_ramp_is_mix_independent_and_snaps_to_the_nearest_realisable_B():
    gpus_a, gpus_b = ["v100", "p100", "rtx2060"], ["a100", "a100", "v100"]
    spaces = [optimal_space(g, PerfModel.emulated(g), 24, 1024, [24]) for g in (gpus_a, gpus_b)]
    pol = RampPolicy(B0=100, at=[0.1, 0.3], factor=1.5, B_min=24, B_max=1024)
    for f in (0.0, 0.1, 0.3):
        Bs = {pol.decide(PolicyState(B=96, progress=f), sp).B for sp in spaces}
        want = 100 * 1.5 ** pol.stage(f)
        assert len(Bs) == 1 and abs(Bs.pop() - want) <= 12     # multiples of 24 from 72 (b = 24, 3 ranks)


@pytest.mark.parametrize("cfg,needle", [
    ({"at": [0.5, 0.25]}, "increasing fractions"),
    ({"at": [0.0, 0.5]}, "increasing fractions"),
    ({"at": "0.5"}, "fractions of the run"),
    ({"factor": 1.0}, "factor=1.0"),
    ({"factor": -2}, "factor=-2"),
])
def test_ramp_validation(cfg, needle):
    with pytest.raises(ConfigError, match=needle):
        make_policy("ramp", B_max=512, **cfg)


def test_ramp_config_keys_and_lr_rule():
    cfg = JobConfig(batch=32, batch_max=256, policy="batch-ramp").validate()
    assert cfg.policy == "ramp" == canonical_policy("ramp")
    assert cfg.ramp_at == [0.25, 0.5, 0.75] and cfg.ramp_factor == 2.0 and cfg.wd_rule == "none"
    assert AUTO_LR_RULE["ramp"] == "sqrt" and make_lr_rule("auto", 32, policy="ramp").lr_scale(128) == 2.0
    with pytest.raises(ConfigError):
        JobConfig(batch=32, batch_max=256, policy="ramp", ramp_at=[1.5]).validate()
    with pytest.raises(ConfigError):
        JobConfig(batch=32, wd_rule="sqrt").validate()


def test_wd_rule_default_off_and_linear():
    assert isinstance(make_wd_rule("none", 64), NoScaling) and make_wd_rule("none", 64).lr_scale(256) == 1.0
    lin = make_wd_rule("linear", 64)
    assert isinstance(lin, LinearScaling) and lin.lr_scale(256) == 4.0
    with pytest.raises(ConfigError, match="valid rules: none, linear"):
        make_wd_rule("sqrt", 64)


class _Opt:
    def __init__(self, opt):
        self.optimizer = opt


def test_controller_scales_weight_decay_with_B_and_survives_a_resume():
    from hpc_jabas.runtime.controller import AdaptiveController
    cfg = JobConfig(batch=32, batch_max=256, policy="ramp", wd_rule="linear").validate()
    ctrl = AdaptiveController(cfg, space=BatchSpace.integers(32, 256))
    p = torch.nn.Parameter(torch.ones(3))
    opt = _Opt(torch.optim.AdamW([p], lr=0.1, weight_decay=0.01))

    tr = FakeTrainer(cfg, B=32)
    ctrl.trainer = tr
    ctrl._apply_wd(opt)
    assert opt.optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.01)
    tr.B = 128
    ctrl._apply_wd(opt)
    ctrl._apply_wd(opt)                                              # no compounding
    assert opt.optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.04)
    # a resume: the optimizer's saved state holds the scaled value, the controller its base
    again = AdaptiveController(cfg, space=BatchSpace.integers(32, 256))
    again.load_state_dict(ctrl.state_dict())
    again.trainer = tr
    tr.B = 64
    again._apply_wd(opt)
    assert opt.optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.02)
    opt.optimizer.param_groups[0]["weight_decay"] = 0.5              # the user changes it: the new base
    again._apply_wd(opt)
    assert opt.optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.5 * 64 / 32)
    off = AdaptiveController(JobConfig(batch=32, batch_max=256, policy="ramp").validate(),
                             space=BatchSpace.integers(32, 256))
    assert off.wd_rule.name == "none"
