"""Worker-side random draws (augmentation) are seeded per micro-batch, so a resume is exact with
persistent DataLoader workers too: 2 epochs straight and 1 + resume + 1 end with the same weights, at an epoch
boundary and inside an epoch, and the draws do not depend on the number of workers."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.trainer import Trainer


class Augmented(torch.utils.data.Dataset):
    """Random noise from torch, numpy and Python's random on every read (a CPU augmentation)."""

    def __init__(self, n: int = 96) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = torch.randn(8) + float(np.random.standard_normal()) + random.random()
        return self.x[i] + 0.3 * noise, self.y[i]


def _fit(run_dir, epochs: int, workers: int = 2, persistent: bool = True, max_iterations=None) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    dl = torch.utils.data.DataLoader(Augmented(), num_workers=workers, persistent_workers=persistent and workers > 0)
    cfg = JobConfig(batch=16, epochs=epochs, run_dir=str(run_dir), metrics_period=4)
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), dl, nn.CrossEntropyLoss(),
                 config=cfg, world=World(rank=0, size=1, gpu_types=("v100",)))
    tr.fit(max_iterations=max_iterations)
    out = torch.cat([p.detach().flatten() for p in model.parameters()])
    tr.feed.close()
    return out


@pytest.mark.parametrize("persistent", [True, False])
def test_resume_at_an_epoch_boundary_with_workers_is_exact(tmp_path, persistent):
    straight = _fit(tmp_path / "a", 2, persistent=persistent)
    _fit(tmp_path / "b", 1, persistent=persistent)
    resumed = _fit(tmp_path / "b", 2, persistent=persistent)
    assert torch.equal(straight, resumed), (straight - resumed).abs().max()


def test_resume_inside_an_epoch_and_another_worker_count_give_the_same_run(tmp_path):
    straight = _fit(tmp_path / "a", 2, workers=2)
    _fit(tmp_path / "b", 2, workers=2, max_iterations=9)        # stops (and checkpoints) inside epoch 2
    resumed = _fit(tmp_path / "b", 2, workers=3)
    assert torch.equal(straight, resumed), (straight - resumed).abs().max()
    other = _fit(tmp_path / "c", 2, workers=0)                   # read on the training thread: its own draws
    assert not torch.equal(straight, other)
