"""The smallest micro-batch (``min_micro_batch``; 8 for a model with BatchNorm when unset): the trainer's
planner, the controller's batch space and the auto-scaler's pricing use the same sizes, from it up.

Found by bench/adaptive_tta.py --image: on ResNet-18 the similarity policy's B near 36-52 ran as micro-batches
of 2 and 4 samples, BatchNorm normalised each over those few, and the run's accuracy collapsed (22-52% final,
against 72-83% for fixed B = 32 at b = 8)."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning import Plan
from hpc_jabas.core.planning.planner import COUPLED_MIN_MICRO_BATCH, candidate_sizes, make_planner
from hpc_jabas.runtime.trainer import Trainer

GPUS = ["v100", "p100", "rtx2060"]
B_LIST = [1, 2, 4, 8, 16, 32, 64]


def _bs(plan: Plan) -> set[int]:
    return {b for b, n in zip(plan.bs, plan.n) if n}


@settings(max_examples=30, deadline=None)
@given(lo=st.sampled_from([None, 1, 2, 4, 8, 16]), b_min=st.integers(24, 60), width=st.integers(8, 80))
def test_every_realised_B_uses_only_sizes_from_the_minimum_up_and_the_pricing_agrees(lo, b_min, width):
    model = PerfModel.emulated(GPUS, b_list=B_LIST)
    cfg = JobConfig(batch=b_min, batch_min=b_min, batch_max=b_min + width, min_micro_batch=lo).validate()
    planner = make_planner(cfg, GPUS, model, identical_b=True)
    space = planner.batch_space(cfg.B_min, cfg.B_max)
    rows = [B for B, _ in space.table()]
    # every rank runs at least one micro-batch: exactly the multiples of the smallest allowed size with 3 or more
    smallest = min(b for b in B_LIST if b >= (lo or 1))
    assert rows == [B for B in range(cfg.B_min, cfg.B_max + 1) if B % smallest == 0 and B >= 3 * smallest], rows
    if not rows:
        return
    for B in rows:
        plan = planner.plan(B)
        assert plan.B == B and min(_bs(plan)) >= (lo or 1), (B, str(plan))
    # the auto-scaler prices the same B on the job's mix: a forecast of every realisable B is snapped to itself
    fn = autoscale.epoch_time_fn(model, {"g0": "v100", "g1": "p100", "g2": "rtx2060"}, rows, 1, sum(rows),
                                 B_min=cfg.B_min, B_max=cfg.B_max, min_micro_batch=lo)
    assert fn({"g0": 1, "g1": 1, "g2": 1}) is not None


def test_candidate_sizes_pinned_minimum_and_fallback():
    model = PerfModel.emulated(GPUS, b_list=B_LIST)
    assert candidate_sizes(12, 8, GPUS, model) == [12]                     # a pinned micro_batch wins
    assert candidate_sizes(None, None, GPUS, model) is None                # the planner's default
    assert candidate_sizes(None, 8, GPUS, model) == [8, 16, 32, 64]
    assert candidate_sizes(None, 100, GPUS, model) == [64]                 # none that large: the largest measured


def _trainer(model: torch.nn.Module, **kw) -> Trainer:
    ds = torch.utils.data.TensorDataset(torch.randn(96, 4), torch.randint(0, 2, (96,)))
    cfg = JobConfig(batch=40, epochs=1, checkpoint=False, emulate=True, gpu_types=["v100"], **kw)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), ds, torch.nn.CrossEntropyLoss(), config=cfg)


def test_a_batchnorm_model_gets_the_minimum_and_a_plain_one_does_not(tmp_path):
    bn = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    t = _trainer(bn, run_dir=str(tmp_path / "bn"))
    assert t.cfg.min_micro_batch == COUPLED_MIN_MICRO_BATCH and min(_bs(t.planner_fn(40, None))) >= 8
    mine = JobConfig(batch=40, epochs=1, checkpoint=False, emulate=True, gpu_types=["v100"],
                     run_dir=str(tmp_path / "mine"))
    ds = torch.utils.data.TensorDataset(torch.randn(96, 4), torch.randint(0, 2, (96,)))
    bn2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    t = Trainer(bn2, torch.optim.SGD(bn2.parameters(), lr=0.1), ds, torch.nn.CrossEntropyLoss(), config=mine)
    assert t.cfg.min_micro_batch == 8 and mine.min_micro_batch is None      # the caller's config is not changed
    t = _trainer(torch.nn.Linear(4, 2), run_dir=str(tmp_path / "plain"))
    assert t.cfg.min_micro_batch is None
    t = _trainer(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)),
                 run_dir=str(tmp_path / "own"), min_micro_batch=2)
    assert t.cfg.min_micro_batch == 2                                       # the user's value is kept
