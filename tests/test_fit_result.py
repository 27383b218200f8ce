"""``fit()``'s result counts the run and this call alike: after a resume, ``iterations`` and ``samples`` are the
run's totals (over every job and resume of it), ``iterations_here`` and ``samples_here`` this call's."""
from __future__ import annotations

import torch

from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.trainer import Trainer


def _fit(run_dir, epochs: int) -> dict:
    x = torch.randn(100, 4, generator=torch.Generator().manual_seed(0))
    ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), ds, torch.nn.CrossEntropyLoss(),
                 config=JobConfig(batch=32, epochs=epochs, run_dir=str(run_dir)),
                 world=World(rank=0, size=1, gpu_types=("v100",)))
    return tr.fit()


def test_after_a_resume_the_result_counts_the_run_and_this_call(tmp_path):
    first = _fit(tmp_path / "run", 1)
    assert (first["iterations"], first["samples"], first["iterations_here"], first["samples_here"]) == (4, 100, 4, 100)
    again = _fit(tmp_path / "run", 3)                     # resumes at epoch 1, trains epochs 2 and 3
    assert (again["iterations"], again["samples"]) == (12, 300)
    assert (again["iterations_here"], again["samples_here"]) == (8, 200)
