"""The Trainer's configuration is resolved once (runtime/resolve.py) and frozen: the default run directory, the
smallest micro-batch of a model with BatchNorm and an adaptive policy's range are decided together before the
parts are built; the caller's JobConfig is not changed; every method sees the same configuration, whatever order
it is called in; an assignment to it raises."""
from __future__ import annotations

import copy
import dataclasses
import sys

import pytest
import torch

from hpc_jabas.core.adaptive.policy import default_batch_range
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.planning.planner import COUPLED_MIN_MICRO_BATCH
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.resolve import resolve_config
from hpc_jabas.runtime.trainer import Trainer

N = 96


def _data(n=N):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 2))


def _trainer(cfg: JobConfig) -> Trainer:
    model = _model()
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(), torch.nn.CrossEntropyLoss(),
                   config=cfg, world=World(rank=0, size=1, gpu_types=("v100",)))


def _user_config() -> JobConfig:
    """An adaptive policy without a range or a run directory, a model with BatchNorm: three things to resolve."""
    return JobConfig(batch=32, epochs=1, policy="similarity", p=2)


def test_the_config_is_resolved_in_one_place_before_the_parts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "train.py")])
    user = _user_config()
    before = copy.deepcopy(user)
    tr = _trainer(user)
    cfg = tr.cfg
    assert user == before and user.run_dir is None and user.min_micro_batch is None     # the caller's: untouched
    assert cfg.run_dir is not None and str(tr.run_dir) == cfg.run_dir
    assert cfg.min_micro_batch == COUPLED_MIN_MICRO_BATCH == 8
    rng = default_batch_range("similarity", 32, None, None, samples_per_epoch=N, min_micro_batch=8)
    assert rng is not None
    assert (cfg.batch_min, cfg.batch_max) == (rng.lo, rng.hi)
    assert tr.batch_range == rng.to_dict()
    assert tr.resolved.coupled == ("BatchNorm1d",) and tr.resolved.min_split == 8
    assert tr.planner.spec.min_micro_batch == 8                          # the planner read the resolved config
    # the same resolution, called on its own
    again = resolve_config(user.validate(), _model(), N, rank=0)
    assert again.cfg.to_dict() == cfg.to_dict() and again.batch_range == tr.batch_range


def test_the_methods_see_one_config_whatever_their_order(tmp_path):
    def run(order: str) -> dict:
        cfg = _user_config()
        cfg.run_dir = str(tmp_path / order)
        tr = _trainer(cfg)
        built = tr.cfg.to_dict()
        steps = {"fit": lambda: tr.fit(max_iterations=2), "save": tr.save_checkpoint,
                 "resume": tr.maybe_resume, "step": tr.train_step, "setup": tr.setup}
        seen = []
        for name in order.split("-"):
            steps[name]()
            seen.append(tr.cfg.to_dict())
        assert all(s == built for s in seen), order
        assert tr.cfg is tr.resolved.cfg
        return built

    a, b, c = run("fit-save"), run("save-step-step"), run("resume-setup-step")
    for d in (a, b, c):
        d.pop("run_dir")
    assert a == b == c
    assert a["min_micro_batch"] == 8 and a["batch_min"] is not None and a["batch_max"] is not None


def test_the_resolved_config_refuses_assignment(tmp_path):
    cfg = _user_config()
    cfg.run_dir = str(tmp_path / "run")
    tr = _trainer(cfg)
    batch = tr.cfg.batch
    with pytest.raises(dataclasses.FrozenInstanceError):
        tr.cfg.batch = 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        tr.cfg.train.batch = 64                                   # through the section too
    with pytest.raises(dataclasses.FrozenInstanceError):
        tr.cfg.autoscale.margin = 0.5
    with pytest.raises(AttributeError):
        tr.cfg = JobConfig()                                      # type: ignore[misc]
    assert tr.cfg.batch == batch == 32
    changed = tr.cfg.replace(batch=64)                            # a changed copy is a plain, unfrozen config
    assert changed.batch == 64 and not changed.is_frozen and tr.cfg.batch == 32
    plain = copy.deepcopy(tr.cfg)
    plain.batch = 16
    assert plain.batch == 16 and tr.cfg.is_frozen
