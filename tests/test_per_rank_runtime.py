"""The runtime's choice of plan kind and its use of declared speeds, without Horovod ranks:
core/planning/planner.py (make_planner) builds the trainer's planner from the config, the model's
batch-coupled layers (runtime/batchnorm.py) and the GPU types."""
from __future__ import annotations

import pytest
import torch
from fake_trainer import FakeTrainer

from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.perf.perfmodel import ComputeProfile, PerfModel, job_perf_model
from hpc_jabas.core.planning import make_planner
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.batchnorm import batch_coupled_layers


def planner_of(model: torch.nn.Module, gpu_types: list[str], **cfg):
    """(planner_fn, what the trainer keeps) as Trainer._default_planner builds them."""
    c = JobConfig(**cfg).validate()
    pm: dict = {}

    def perf_model():
        if "m" not in pm:
            pm["m"] = job_perf_model(c, gpu_types)
        return pm["m"]
    planner = make_planner(c, gpu_types, perf_model, batch_coupled_layers(model))
    return planner.plan, FakeTrainer(c, gpu_types=gpu_types, identical_b=planner.identical_b,
                                     declared_speed_factors=planner.declared_factors, perf_model=perf_model,
                                     planner_fn=planner.plan)


def mlp(batchnorm: bool = False) -> torch.nn.Module:
    layers = [torch.nn.Linear(4, 8)] + ([torch.nn.BatchNorm1d(8)] if batchnorm else []) + [torch.nn.Linear(8, 2)]
    return torch.nn.Sequential(*layers)


MIX = ["v100", "p100", "rtx2060"]


def test_batchnorm_model_gets_identical_b_automatically():
    assert batch_coupled_layers(mlp(batchnorm=True)) == ["BatchNorm1d"] and batch_coupled_layers(mlp()) == []
    fn, t = planner_of(mlp(batchnorm=True), MIX, batch=480)
    assert t.identical_b and fn(480).identical_b
    fn, t = planner_of(mlp(), MIX, batch=480)
    p = fn(480)
    assert not t.identical_b and not p.identical_b and p.n == (1, 1, 1) and p.B == 480
    # pinned by the user: micro_batch, or the config key
    assert planner_of(mlp(), MIX, batch=480, micro_batch=8)[0](480).b == 8
    assert planner_of(mlp(), MIX, batch=480, identical_micro_batch="true")[0](480).identical_b
    # forced per-rank over BatchNorm: allowed (a warning), per-rank plans
    assert not planner_of(mlp(batchnorm=True), MIX, batch=480, identical_micro_batch="false")[0](480).identical_b
    with pytest.raises(ConfigError) as e:
        planner_of(mlp(), MIX, batch=480, micro_batch=8, identical_micro_batch="false")
    assert "micro_batch=8" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("identical", ["true", "false"])
def test_declared_speeds_change_the_optimal_plan(identical):
    same = ["v100"] * 3
    plain = planner_of(mlp(), same, batch=448, identical_micro_batch=identical)[0](448)
    fn, t = planner_of(mlp(), same, batch=448, identical_micro_batch=identical, speeds=[1.0, 0.5, 0.25])
    declared = fn(448)
    assert t.declared_speed_factors == [1.0, 0.5, 0.25]
    assert plain.xs[0] == plain.xs[1] == plain.xs[2] or max(plain.xs) - min(plain.xs) <= max(plain.bs)
    assert declared.xs[0] > declared.xs[1] > declared.xs[2]
    # the same plan as handing the planner the factors directly; balancing factors multiply them
    from hpc_jabas.core.planning import plan_batch
    m = t.perf_model()
    assert declared == plan_batch(448, same, m, speed_factors=[1.0, 0.5, 0.25], per_rank=identical == "false")
    assert fn(448, [0.25, 1.0, 1.0]) == plan_batch(448, same, m, speed_factors=[0.25, 0.5, 0.25],
                                                   per_rank=identical == "false")


def test_declared_speeds_are_refused_where_a_planner_cannot_use_them(tmp_path):
    with pytest.raises(ConfigError) as e:
        planner_of(mlp(), MIX, batch=24, planner="fixed", plan="b=4 n=1,2,3", speeds=[1, 0.5, 0.25])
    assert "planner='fixed'" in str(e.value) and "\n" not in str(e.value)
    # with emulation the fixed plan's ranks run at the declared speeds: accepted
    planner_of(mlp(), MIX, batch=24, planner="fixed", plan="b=4 n=1,2,3", speeds=[1, 0.5, 0.25], emulate=True)
    prof = PerfModel({"v100": ComputeProfile("v100", b=[1, 8], t=[0.01, 0.02], max_b=64)})
    prof.save(tmp_path)
    with pytest.raises(ConfigError) as e:
        planner_of(mlp(), ["v100"] * 2, batch=24, profile_dir=str(tmp_path), speeds=[1, 0.5])
    assert "measured profile" in str(e.value) and "\n" not in str(e.value)


def test_lbbsp_per_rank_is_plain_lbbsp_within_memory_caps():
    fn, _ = planner_of(mlp(), MIX, batch=700, planner="lbbsp", speeds=[1.0, 0.5, 0.25])
    p = fn(700)
    assert p.xs == (400, 200, 100) and p.n[0] == 1 and p.n[1] == 1
    assert p.n[2] == 2 and max(p.micro_sizes(2)) <= 96       # the rtx2060's memory cap forces two


def test_make_planner_plans_and_gives_the_controllers_batch_space():
    from hpc_jabas.core.planning import job_batch_space, plan_batch
    c = JobConfig(batch=480, batch_min=240, batch_max=960).validate()
    pm = job_perf_model(c, MIX)
    p = make_planner(c, MIX, pm)
    assert not p.identical_b and p.declared_factors is None
    assert p.plan(480) == plan_batch(480, MIX, pm, per_rank=True)
    assert p.batch_space(c.B_min, c.B_max).table() == job_batch_space(c, MIX, pm, per_rank=True).table()


def test_lbbsp_refuses_declared_speeds_that_do_not_fit_the_ranks():
    from hpc_jabas.core.planning import lbbsp_speeds
    c = JobConfig(batch=480, planner="lbbsp", speeds=[1.0, 0.5]).validate()
    with pytest.raises(ConfigError) as e:
        make_planner(c, MIX, lambda: job_perf_model(c, MIX))
    assert "2 values" in str(e.value) and "3 ranks" in str(e.value) and "\n" not in str(e.value)
    # another mix, priced by the auto-scaler: the catalog's speeds
    assert lbbsp_speeds(MIX, [1.0, 0.5]) == lbbsp_speeds(MIX)
