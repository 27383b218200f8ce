"""Issue 36, finding 5: run directories that cannot be confused. A config without run_dir gets one of its own
(the script's name and a hash of what the run computes); a resume with a changed --batch is refused in one line
naming both values, other changed keys are said (kept from the checkpoint, or applied); a checkpoint of another
model is one line naming both models, not a load_state_dict traceback."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from hpc_jabas.core.config.sections import JobConfig, default_run_dir
from hpc_jabas.errors import CheckpointError, ConfigError
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.trainer import Trainer


def _data(n=96):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())


def _trainer(model=None, **kw) -> Trainer:
    torch.manual_seed(0)
    model = model or torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    cfg = JobConfig(**{"batch": 32, "epochs": 1, **kw})
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(), torch.nn.CrossEntropyLoss(),
                   config=cfg, world=World(rank=0, size=1, gpu_types=("v100",)))


def test_the_default_run_dir_is_the_scripts_and_its_configurations(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/somewhere/train_mnist.py", "--batch", "32"])
    tr = _trainer()
    assert tr.run_dir.parent == __import__("pathlib").Path("runs")
    assert tr.run_dir.name.startswith("train_mnist-") and len(tr.run_dir.name) == len("train_mnist-") + 8
    assert f"run_dir {tr.cfg.run_dir} (this script and configuration" in capfd.readouterr().err
    same = {"batch": 32, "epochs": 1}
    name = default_run_dir(JobConfig(**same), "/somewhere/train_mnist.py")
    assert name == str(tr.run_dir)
    more = JobConfig(**{**same, "epochs": 9, "keep_checkpoints": 1})
    assert default_run_dir(more, "/somewhere/train_mnist.py") == name
    others = {default_run_dir(JobConfig(**{**same, "batch": 64}), "train_mnist.py"),
              default_run_dir(JobConfig(**{**same, "seed": 1}), "train_mnist.py"),
              default_run_dir(JobConfig(**{**same, "policy": "similarity"}), "train_mnist.py"),
              default_run_dir(JobConfig(**same), "train_cifar.py"),
              default_run_dir(JobConfig(**same), "/elsewhere/train_mnist.py")}
    assert name not in others and len(others) == 5
    assert JobConfig(run_dir="runs/mine").run_dir == "runs/mine"


def test_resuming_with_another_batch_or_model_is_one_line(tmp_path, capfd):
    run = str(tmp_path / "run")
    _trainer(run_dir=run).fit()
    ckpts = sorted((tmp_path / "run" / "checkpoints").iterdir())
    with pytest.raises(ConfigError) as e:
        _trainer(run_dir=run, batch=16, epochs=2).fit()
    msg = str(e.value)
    # a Trainer built without our flags: the keys are named as config keys (a script with them: --run-dir)
    assert "batch=32" in msg and "batch=16" in msg and "run_dir (the config key)" in msg and "\n" not in msg, msg
    with pytest.raises(CheckpointError) as e:
        _trainer(torch.nn.Sequential(torch.nn.Linear(8, 2)), run_dir=run, epochs=2).fit()
    msg = str(e.value)
    assert "another model" in msg and "Sequential (4 tensors, 178 values) vs Sequential (2" in msg, msg
    assert "\n" not in msg
    assert "'0.weight' is [16, 8] there, [2, 8] here" in msg, msg
    assert sorted((tmp_path / "run" / "checkpoints").iterdir()) == ckpts          # nothing written by the refusals
    capfd.readouterr()
    tr = _trainer(run_dir=run, epochs=2, seed=5)
    tr.fit()
    err = capfd.readouterr().err
    assert "kept from the checkpoint: seed=0 (not 5)" in err and "applied: epochs 1 -> 2" in err, err
    assert tr.resumed_from and tr.sampler.seed == 0 and tr.sampler.epoch == 2
    rec = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    resume = [r for r in rec if r["type"] == "resume"][-1]
    assert resume["changed"] == {"kept": {"seed": 0}, "applied": {"epochs": 2}}


def test_resuming_with_another_policy_starts_it_afresh(tmp_path, capfd):
    run = str(tmp_path / "run")
    _trainer(run_dir=run, policy="similarity", micro_batch=8).fit()
    capfd.readouterr()
    tr = _trainer(run_dir=run, policy="noise-scale", micro_batch=8, epochs=2)
    tr.fit()                                               # before: "policy state is for 'similarity'" (StateError)
    err = capfd.readouterr().err
    assert "applied: epochs 1 -> 2, policy 'similarity' -> 'noise-scale'" in err, err
    assert "the policy 'noise-scale' starts afresh" in err and tr.sampler.epoch == 2
