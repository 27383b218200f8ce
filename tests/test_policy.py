import math

import pytest

from hpc_jabas.core.policy import (
    AdaScale,
    FixedPolicy,
    LinearScaling,
    NoiseScalePolicy,
    NoScaling,
    PolicyState,
    SimilarityPolicy,
    SqrtScaling,
    make_lr_rule,
    make_policy,
)
from hpc_jabas.errors import ConfigError


def one_line(excinfo):
    msg = str(excinfo.value)
    assert msg and "\n" not in msg
    return msg


# ---------------------------------------------------------------- similarity policy

def test_similarity_grows_below_gamma_and_shrinks_above():
    pol = SimilarityPolicy(gamma=0.1, alpha=0.1, B_min=16, B_max=4096)
    assert pol.decide(PolicyState(B=1000, similarity=0.05)) == 1100
    assert pol.decide(PolicyState(B=1000, similarity=0.5)) == 900
    assert pol.decide(PolicyState(B=1000, similarity=0.1)) == 1000      # equal: keep
    assert pol.decide(PolicyState(B=1000, similarity=None)) == 1000     # no statistic: keep


def test_similarity_steps_at_least_one_sample():
    pol = SimilarityPolicy(gamma=0.1, alpha=0.1, B_min=1, B_max=100)
    assert pol.decide(PolicyState(B=4, similarity=-0.2)) == 5          # 4.4 would round back to 4
    assert pol.decide(PolicyState(B=4, similarity=0.9)) == 3


def test_similarity_repeated_growth_is_geometric_and_clipped():
    pol = SimilarityPolicy(gamma=0.3, alpha=0.1, B_min=64, B_max=200)
    B, seen = 64, []
    for it in range(1, 20):
        B = pol.decide({"B": B, "iteration": it * 100, "similarity": 0.0})
        seen.append(B)
    assert seen[:3] == [70, 77, 85]
    assert seen[-1] == 200 and max(seen) == 200
    assert all(b2 >= b1 for b1, b2 in zip(seen, seen[1:]))
    B = 64
    assert pol.decide(PolicyState(B=B, similarity=0.9)) == 64          # shrink clipped at B_min


def test_clip_pulls_out_of_range_current_B_back():
    pol = FixedPolicy(B_min=32, B_max=256)
    assert pol.decide(PolicyState(B=8)) == 32
    assert pol.decide(PolicyState(B=1000)) == 256
    assert pol.decide(PolicyState(B=100)) == 100


def test_snap_is_applied_after_clip():
    calls = []

    def snap(B):
        calls.append(B)
        return 8 * math.ceil(B / 8)           # round up to a multiple of b = 8

    pol = SimilarityPolicy(gamma=0.1, B_min=10, B_max=100, snap=snap)
    assert pol.decide(PolicyState(B=60, similarity=0.0)) == 72           # 66 -> 72
    assert pol.decide(PolicyState(B=100, similarity=0.0)) == 104         # clip to 100, snap to 104
    assert calls == [66, 100]


def test_snap_must_return_positive_integer():
    pol = FixedPolicy(B_min=1, B_max=10, snap=lambda B: 0)
    with pytest.raises(ConfigError) as e:
        pol.decide(PolicyState(B=5))
    assert "snap" in one_line(e)
    with pytest.raises(ConfigError):
        FixedPolicy(snap=5)


def test_noise_scale_policy():
    pol = NoiseScalePolicy(k=2.0, B_min=32, B_max=1024)
    assert pol.decide(PolicyState(B=100, b_noise=150.0)) == 300
    assert pol.decide(PolicyState(B=100, b_noise=5.0)) == 32
    assert pol.decide(PolicyState(B=100, b_noise=1e9)) == 1024
    assert pol.decide(PolicyState(B=100, b_noise=math.inf)) == 1024
    assert pol.decide(PolicyState(B=100, b_noise=None)) == 100
    assert pol.decide(PolicyState(B=100, b_noise=float("nan"))) == 100


def test_due_every_p():
    pol = make_policy("fixed", p=50)
    assert [i for i in range(0, 201) if pol.due(i)] == [50, 100, 150, 200]


def test_make_policy_names_and_config():
    assert isinstance(make_policy("similarity", gamma=0.1, B_max=512), SimilarityPolicy)
    assert isinstance(make_policy("SimiGrad", gamma=0.3, alpha=0.2, B_min=2, B_max=8), SimilarityPolicy)
    assert isinstance(make_policy("noise-scale", k=1.0, B_max=512), NoiseScalePolicy)
    assert isinstance(make_policy("noise_scale", B_max=512), NoiseScalePolicy)
    assert isinstance(make_policy("fixed"), FixedPolicy)
    pol = make_policy("similarity", gamma=0.1, B_max=512, p=20)
    assert pol.config() == {"name": "similarity", "B_min": 1, "B_max": 512, "p": 20, "gamma": 0.1, "alpha": 0.1}
    other = make_policy("similarity", gamma=0.1, B_max=512)
    other.load_state_dict(pol.state_dict())
    with pytest.raises(ConfigError):
        make_policy("fixed").load_state_dict(pol.state_dict())


@pytest.mark.parametrize("name,cfg,needle", [
    ("bogus", {}, "valid policies: fixed, similarity, noise-scale"),
    ("similarity", {"gamma": 0.1, "B_max": 64, "p": 0}, "p=0"),
    ("similarity", {"gamma": 0.1, "B_max": 64, "p": 2.5}, "p=2.5"),
    ("similarity", {"gamma": 0.1, "B_min": 128, "B_max": 64}, "B_min=128"),
    ("similarity", {"gamma": 0.1, "B_min": 0, "B_max": 64}, "B_min=0"),
    ("similarity", {"gamma": 1.0, "B_max": 64}, "gamma=1.0"),
    ("similarity", {"gamma": -1.0, "B_max": 64}, "gamma=-1.0"),
    ("similarity", {"gamma": "high", "B_max": 64}, "gamma='high'"),
    ("similarity", {"gamma": 0.1, "alpha": 0.0, "B_max": 64}, "alpha=0.0"),
    ("similarity", {"gamma": 0.1, "alpha": 1.0, "B_max": 64}, "alpha=1.0"),
    ("similarity", {"B_max": 64}, "gamma"),
    ("similarity", {"gamma": 0.1}, "B_max"),
    ("noise-scale", {"k": 0, "B_max": 64}, "k=0"),
    ("noise-scale", {"k": -1.0, "B_max": 64}, "k=-1.0"),
    ("noise-scale", {"gamma": 0.1, "B_max": 64}, "unknown option(s) gamma"),
    ("fixed", {"B_min": True}, "B_min=True"),
])
def test_make_policy_validation(name, cfg, needle):
    with pytest.raises(ConfigError) as e:
        make_policy(name, **cfg)
    assert needle in one_line(e)


def test_bad_state_is_one_line():
    pol = make_policy("fixed")
    with pytest.raises(ConfigError) as e:
        pol.decide({"B": 10, "simlarity": 0.3})
    one_line(e)
    with pytest.raises(ConfigError):
        pol.decide({"B": 0})


# ---------------------------------------------------------------- lr rules

def test_lr_rule_values():
    assert SqrtScaling(256).lr_scale(1024) == pytest.approx(2.0)
    assert SqrtScaling(256).lr_scale(64) == pytest.approx(0.5)
    assert LinearScaling(256).lr_scale(1024) == pytest.approx(4.0)
    assert LinearScaling(256).lr_scale(128) == pytest.approx(0.5)
    assert NoScaling(256).lr_scale(1024) == 1.0
    assert make_lr_rule("sqrt", 256).lr_scale(256) == pytest.approx(1.0)


def test_adascale_gain():
    rule = AdaScale(B_ref=1)
    # textbook r = (S + G2) / (S/s + G2) when B_ref = 1
    assert rule.lr_scale(4, G2=1.0, S=3.0) == pytest.approx((3 + 1) / (3 / 4 + 1))
    rule = AdaScale(B_ref=100)
    s = 8.0
    # pure noise (G2 = 0): gain = scale (linear scaling); pure signal (S = 0): gain = 1
    assert rule.lr_scale(800, G2=0.0, S=50.0) == pytest.approx(s)
    assert rule.lr_scale(800, G2=2.0, S=0.0) == pytest.approx(1.0)
    # S per sample -> var of a B_ref batch is S/B_ref
    G2, S = 1.0, 300.0
    var = S / 100
    assert rule.lr_scale(800, G2=G2, S=S) == pytest.approx((var + G2) / (var / s + G2))
    r = rule.lr_scale(800, G2=G2, S=S)
    assert 1.0 < r < s
    # below B_ref the gain lies in (s, 1)
    assert 0.5 < rule.lr_scale(50, G2=G2, S=S) < 1.0
    # missing stats: 1
    assert rule.lr_scale(800) == 1.0 and rule.lr_scale(800, G2=None, S=3.0) == 1.0
    assert rule.lr_scale(800, G2=0.0, S=0.0) == 1.0


def test_lr_rules_state_round_trip():
    rule = make_lr_rule("adascale", 128)
    rule.advance(512, G2=1.0, S=128.0)
    rule.advance(512, G2=1.0, S=128.0)
    other = make_lr_rule("adascale", 1)
    other.load_state_dict(rule.state_dict())
    assert other.B_ref == 128 and other.progress == pytest.approx(rule.progress) and rule.progress > 2.0
    sq = make_lr_rule("sqrt", 32)
    sq2 = make_lr_rule("sqrt", 1)
    sq2.load_state_dict(sq.state_dict())
    assert sq2.lr_scale(128) == pytest.approx(2.0)
    with pytest.raises(ConfigError):
        make_lr_rule("linear", 1).load_state_dict(sq.state_dict())


@pytest.mark.parametrize("name,B_ref,needle", [
    ("cosine", 256, "valid rules: sqrt, linear, adascale, none"),
    ("sqrt", 0, "B_ref=0"),
    ("linear", -4, "B_ref=-4"),
    ("sqrt", "big", "B_ref='big'"),
])
def test_make_lr_rule_validation(name, B_ref, needle):
    with pytest.raises(ConfigError) as e:
        make_lr_rule(name, B_ref)
    assert needle in one_line(e)


def test_lr_scale_rejects_bad_B():
    with pytest.raises(ConfigError):
        SqrtScaling(32).lr_scale(0)
