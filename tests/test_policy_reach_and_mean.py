"""The goodput policy's trust region widening toward a confirmed argmax, and the similarity policy's mean over the
measurements since its last decision (a trainer run, the cosines read back from its own iteration records)."""
from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import make_data, make_model

from hpc_jabas.core.adaptive.policy import GoodputPolicy, PolicyState, SimilarityPolicy, default_measure_every
from hpc_jabas.core.planning.space import BatchSpace
from hpc_jabas.errors import ConfigError


def linear_space(lo: int, hi: int, base: float, per: float, step: int = 16) -> BatchSpace:
    """Every multiple of step in range, t_iter(B) = base + per * B."""
    return BatchSpace(lo, hi, lambda a, b: [(B, base + per * B) for B in range(a, b + 1) if B % step == 0])


def test_the_region_widens_after_two_edge_stops_on_one_side_and_resets_inside():
    # B_noise 1e12: E = 1 everywhere, the argmax is the fastest B, B_max (throughput grows with B here)
    space = linear_space(16, 4096, 0.1, 0.0001)
    pol = GoodputPolicy(B0=16, B_min=16, B_max=4096, warmup=0)
    Bs, B = [], 16
    for _ in range(6):
        B = pol.decide(PolicyState(B=B, b_noise=1e12), space).B
        Bs.append(B)
    # x2, x2 (the second edge stop on the same side), x4, x8, then the argmax lies inside: x2 again would be the cap
    assert Bs == [32, 64, 256, 2048, 4096, 4096]
    assert pol.reach == 2.0 and pol.edge == 0
    capped = GoodputPolicy(B0=16, B_min=16, B_max=4096, warmup=0, max_reach=2.0)   # max_reach = max_step: never
    B, seen = 16, []
    for _ in range(4):
        B = capped.decide(PolicyState(B=B, b_noise=1e12), space).B
        seen.append(B)
    assert seen == [32, 64, 128, 256]


def test_the_wider_side_is_only_the_confirmed_one_and_unresolved_never_widens():
    space = linear_space(16, 4096, 0.1, 0.0001)
    pol = GoodputPolicy(B0=16, B_min=16, B_max=4096, warmup=0)
    B = 16
    for _ in range(3):
        B = pol.decide(PolicyState(B=B, b_noise=1e12), space).B
    assert B == 256 and pol.reach == 8.0
    # now B_noise = 0: E(B) = B0 / B, goodput falls with B, the argmax is B_min: down at most max_step = 2
    assert pol.decide(PolicyState(B=B, b_noise=0.0), space).B == 128
    un = GoodputPolicy(B0=16, B_min=16, B_max=4096, warmup=0)
    B = 16
    for _ in range(4):                                  # |G|^2 <= 0 (B_noise inf): grows, one factor 2 at a time
        B = un.decide(PolicyState(B=B, g2=-1.0, s=5.0), space).B
    assert B == 256 and un.reach == 2.0


@settings(max_examples=60, deadline=None)
@given(noise=st.lists(st.sampled_from([0.0, 5.0, 50.0, 500.0, 1e12]), min_size=1, max_size=12),
       max_step=st.sampled_from([1.5, 2.0, 3.0]), max_reach=st.sampled_from([2.0, 8.0, 16.0, 64.0]))
def test_a_decision_moves_past_max_step_only_after_two_edge_stops_and_never_past_max_reach(noise, max_step,
                                                                                          max_reach):
    space = linear_space(16, 4096, 0.05, 0.0002)
    pol = GoodputPolicy(B0=16, B_min=16, B_max=4096, warmup=0, max_step=max_step, max_reach=max_reach)
    B = 256
    for bn in noise:
        reach_before, edge_before = pol.reach, pol.edge
        d = pol.decide(PolicyState(B=B, b_noise=bn), space)
        f = d.B / B
        assert f <= max(max_reach, max_step) * (1 + 1e-9) and 1 / f <= max(max_reach, max_step) * (1 + 1e-9)
        if f > max_step * (1 + 1e-9) or 1 / f > max_step * (1 + 1e-9):
            # a wide move goes the way the region was widened, after two decisions whose argmax lay past that edge
            assert reach_before > max_step and (f > 1) == (edge_before > 0)
        B = d.B


def test_max_reach_is_checked():
    for bad in (1.0, 0.5, float("nan"), "x"):
        with pytest.raises(ConfigError, match="max_reach"):
            GoodputPolicy(B0=16, max_reach=bad)


def test_the_similarity_decision_reads_the_mean_of_the_periods_cosines():
    pol = SimilarityPolicy(gamma=0.1, alpha=0.1, B_min=16, B_max=1024)
    space = BatchSpace.integers(16, 1024)
    for v in (0.5, -0.5, float("nan"), None):
        pol.observe(v)
    d = pol.decide(PolicyState(B=100, similarity=-0.2), space)     # mean of 0.5, -0.5, -0.2 = -0.0667 < 0.1
    assert d.direction == "grow" and d.B == 110 and "mean similarity of 3 measurements=-0.067" in d.reason
    assert pol.pending == [] and pol.last_mean == (pytest.approx(-0.2 / 3), 3)
    pol.observe(0.9)
    back = SimilarityPolicy(gamma=0.1, alpha=0.1, B_min=16, B_max=1024)
    back.load_state_dict(json.loads(json.dumps(pol.state_dict())))
    assert back.pending == [0.9]
    d = back.decide(PolicyState(B=110, similarity=None), space)    # its own measurement missing: the one kept
    assert d.direction == "shrink" and "similarity=0.900" in d.reason


def test_default_measure_every():
    assert default_measure_every("goodput", None, 100) == 10 and default_measure_every("noise-scale", None, 4) == 1
    assert default_measure_every("noise-scale", None, 19) == 2 and default_measure_every("noise-scale", 7, 19) == 7
    assert default_measure_every("similarity", None, 19) is None and default_measure_every("jabas", 5, 19) == 5
    assert default_measure_every("ramp", 5, 19) is None and default_measure_every("fixed", None, 19) is None


def test_a_trainer_with_similarity_and_measure_every_decides_on_the_mean_of_its_measurements(tmp_path):
    """One GPU, similarity, p = 6, measure_every = 2: iterations 1, 3, 5 (0-based) measure the cosine (the one
    micro-batch split in two); each decision's similarity_mean is the mean of the cosines its iteration records
    carry since the previous decision (a reference from the records, not from the policy)."""
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer
    model = make_model()
    cfg = JobConfig(policy="similarity", batch=16, batch_min=8, batch_max=64, epochs=2, checkpoint=False, p=6,
                    measure_every=2, lr_rule="none", run_dir=str(tmp_path / "run"))
    Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), make_data(192), torch.nn.CrossEntropyLoss(),
            config=cfg, world=World(rank=0, size=1, gpu_types=("rtx2060",))).fit()
    recs = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    its = {r["it"]: r for r in recs if r["type"] == "iteration"}
    decisions = [r for r in recs if r["type"] == "decision"]
    assert len(decisions) >= 3
    prev = -1
    for d in decisions:
        end = d["at_iteration"] - 1                      # the decision's own measuring iteration
        sims = [its[i]["stats"]["similarity"] for i in range(prev + 1, end + 1) if "stats" in its.get(i, {})]
        assert len(sims) == 3 and all(math.isfinite(x) for x in sims)
        assert d["stats"]["similarity_count"] == 3
        assert d["stats"]["similarity_mean"] == pytest.approx(sum(sims) / 3, rel=1e-12)
        prev = end
