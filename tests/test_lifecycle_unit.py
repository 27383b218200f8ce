"""Epoch-end auto-scaler adapter with a stub cluster view: forecast, pricing, choice, forecast error."""
from types import SimpleNamespace

import pytest

from hpc_jabas.core.config import JobConfig
from hpc_jabas.core.jobspec import JobSpec
from hpc_jabas.core.perfmodel import PerfModel
from hpc_jabas.core.sampler import HeterogeneousSampler
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.lifecycle import EpochEndAutoscaler, epoch_time_fn, expand_mix


class View:
    types = {"a100": "a100", "v100": "v100", "rtx2060": "rtx2060"}
    free = {"a100": 0, "v100": 2, "rtx2060": 4}
    billing = {"a100": 4.0, "v100": 2.0, "rtx2060": 1.0}


class Metrics:
    def __init__(self):
        self.recs = []

    def write(self, r):
        self.recs.append(r)


def stub_trainer(epochs=3, policy="similarity"):
    cfg = JobConfig(epochs=epochs, batch=64, batch_min=32, batch_max=256, policy=policy, p=5, planner="optimal",
                    emulate=True).validate()
    s = HeterogeneousSampler(1000)
    return SimpleNamespace(cfg=cfg, sampler=s, iteration=16, B=64, metrics=Metrics(), lifecycle_state={},
                           controller=SimpleNamespace(trajectory=[(0, 64), (5, 80), (10, 96), (15, 112)]))


def spec(objective, **kw):
    return JobSpec(task="examples.train_digits:build", config={"autoscale": {"objective": objective, **kw}},
                   chain_dir="/tmp/x", mix={"a100": 1, "v100": 2})


def test_expand_mix_sorted_partitions():
    assert expand_mix({"v100": 2, "a100": 1}, View.types) == ["a100", "v100", "v100"]


def test_epoch_time_more_gpus_is_faster_and_consumes_the_epoch():
    model = PerfModel.emulated(["a100", "v100", "rtx2060"], [4, 8, 16, 32, 64], 0.002, 0.0002)
    fn = epoch_time_fn(model, View.types, [64, 128], 5, 1000)
    t1, t3 = fn({"rtx2060": 1}), fn({"rtx2060": 3})
    assert t3 < t1
    # one rtx2060: 5 its of 64 + the rest at 128: exactly the model's iteration times
    from hpc_jabas.core.planner import plan_batch
    g = ["rtx2060"]
    expect = (5 * model.iteration_time(plan_batch(64, g, model), g)
              + 6 * model.iteration_time(plan_batch(128, g, model), g))
    assert t1 == pytest.approx(expect)


def test_cost_objective_moves_to_cheap_mix_and_time_objective_stays_or_grows():
    tr = stub_trainer()
    a = EpochEndAutoscaler(spec("cost", restart_prior_s=1.0), read_cluster=lambda pt: View())
    d = a._decide(tr, epoch=0)
    rec = tr.metrics.recs[-1]
    assert d["move"] and set(d["mix"]) == {"rtx2060"}
    assert rec["forecast"] and all(32 <= B <= 256 for B in rec["forecast"])
    assert any(r["feasible"] for r in rec["table"]) and rec["rates"] == View.billing
    tr2 = stub_trainer()
    d2 = EpochEndAutoscaler(spec("time", restart_prior_s=1e6), read_cluster=lambda pt: View())._decide(tr2, 0)
    assert d2 == {"move": False}      # a huge restart overhead never pays off


def test_last_epoch_does_not_move_and_forecast_error_is_scored():
    tr = stub_trainer(epochs=2)
    a = EpochEndAutoscaler(spec("cost"), read_cluster=lambda pt: View())
    a._decide(tr, epoch=0)
    fc = tr.lifecycle_state["forecast"]
    tr.iteration = fc["start"] + 3 * fc["p"]
    tr.controller.trajectory.append((fc["start"], 128))
    d = a._decide(tr, epoch=1)
    assert d == {"move": False} and tr.metrics.recs[-1]["reason"] == "last epoch"
    assert tr.metrics.recs[-1]["forecast_error"] >= 0.0


def test_unknown_autoscale_key_is_one_clear_line():
    with pytest.raises(ConfigError, match="unknown autoscale key 'objectiv'"):
        EpochEndAutoscaler(JobSpec(task="m:f", config={"autoscale": {"objectiv": "time"}}, chain_dir="/tmp/x",
                                   mix={"v100": 1}))
