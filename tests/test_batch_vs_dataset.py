"""A batch larger than the dataset is refused in one line before training (it would make every iteration the
whole epoch, cut short: not a batch of B samples); a batch of exactly the dataset trains."""
from __future__ import annotations

import pytest
import torch

from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.trainer import Trainer


def _trainer(batch: int, tmp_path) -> Trainer:
    x = torch.randn(64, 4)
    ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    m = torch.nn.Linear(4, 2)
    return Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), ds, torch.nn.CrossEntropyLoss(),
                   config=JobConfig(batch=batch, epochs=1, run_dir=str(tmp_path / "run")),
                   world=World(rank=0, size=1, gpu_types=("v100",)))


def test_a_batch_larger_than_the_dataset_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        _trainer(65, tmp_path)
    assert "\n" not in str(e.value) and "batch=65 is larger than the dataset (64 samples)" in str(e.value)
    assert "batch = 64 (the config key; --batch 64 as a flag) or less" in str(e.value)   # no flags: the key
    run = tmp_path / "run"                       # checked (and made) before the dataset is: nothing written in it
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").read_bytes().strip()


def test_a_batch_of_the_whole_dataset_trains(tmp_path):
    out = _trainer(64, tmp_path).fit()
    assert out["iterations"] == 1 and out["samples"] == 64
