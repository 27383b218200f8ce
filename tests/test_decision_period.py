"""The decision period p: set, it is kept; unset, about ten decisions per epoch at the initial B, within [1, 100],
the same on every mix, and what the controller, the epoch-end forecast and the simulator all use."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc_jabas.core.adaptive.policy import DEFAULT_P, decision_period
from hpc_jabas.errors import ConfigError


@given(st.integers(1, 10**8), st.integers(1, 10**5))
def test_unset_p_gives_about_ten_decisions_per_epoch_within_its_bounds(n, b):
    p = decision_period(None, n, b)
    ipe = math.ceil(n / b)
    assert 1 <= p <= DEFAULT_P and isinstance(p, int)
    if 15 <= ipe <= 10 * DEFAULT_P:                           # neither clipped: ten decisions, rounded
        assert abs(ipe / p - 10) <= 10 * 0.5 / p + 1e-9
    elif ipe > 10 * DEFAULT_P:
        assert p == DEFAULT_P                                 # JABAS's p where epochs are long enough for it


@given(st.integers(1, 10**6), st.integers(1, 10**6), st.integers(1, 4096))
def test_a_set_p_is_kept_whatever_the_epoch(p, n, b):
    assert decision_period(p, n, b) == p


def test_examples_and_refusals():
    assert decision_period(None, 6000, 32) == 19             # 188 iterations per epoch
    assert decision_period(None, 1_281_167, 256) == 100      # ImageNet at B = 256: 5,005 iterations, JABAS's p
    assert decision_period(None, 100, 64) == 1
    for bad in (0, 2.5, True, "10"):
        with pytest.raises(ConfigError, match="p="):
            decision_period(bad, 100, 8)


def test_the_trainer_controller_and_the_simulator_resolve_the_same_p(tmp_path):
    import torch

    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.sim import simconfig
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.controller import AdaptiveController
    from hpc_jabas.runtime.trainer import Trainer

    n, B = 1200, 16
    ds = torch.utils.data.TensorDataset(torch.randn(n, 4), torch.randint(0, 2, (n,)))
    model = torch.nn.Linear(4, 2)
    cfg = JobConfig(policy="similarity", batch=B, batch_min=8, batch_max=64, epochs=1, checkpoint=False,
                    run_dir=str(tmp_path / "run"))
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), ds, torch.nn.CrossEntropyLoss(), config=cfg,
                 world=World(rank=0, size=1, gpu_types=("v100",)))
    assert isinstance(tr.controller, AdaptiveController)
    tr.controller.attach(tr)
    assert tr.controller.p == tr.controller.policy.p == decision_period(None, n, B) == 8
    job = simconfig.job_from_dict({"samples": n, "batch": B, "batch_min": 8, "batch_max": 64})
    assert decision_period(job.p, job.samples, job.batch) == 8
