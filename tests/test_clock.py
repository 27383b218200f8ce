"""Iteration timing (runtime/clock.py): the optimizer step is counted in the iteration that runs it, not in the
next iteration's compute. On a GPU that takes CUDA events and a wait after opt.step() (scripts/gpu_check.sh
checks it there); what the CPU can show is the same bookkeeping: a slow step lands in its own iteration's
time and wait, and the next iteration's compute does not hold it."""
from __future__ import annotations

import json
import time

import torch

from hpc_jabas.runtime.clock import IterationClock, Timer

STEP_S = 0.4          # the injected slow step: far above a tiny model's micro-batch, so the split is unambiguous


def test_the_clock_keeps_the_step_out_of_compute_and_in_its_own_iteration():
    clock = IterationClock(torch.device("cpu"))
    spans = []
    for it in range(3):
        t0 = clock.begin()
        clock.compute_start()
        time.sleep(0.02)                                    # a micro-batch
        clock.compute_stop()
        t_sync = time.perf_counter()
        if it == 1:
            time.sleep(STEP_S)                              # a slow optimizer step
        t_end = clock.end()
        spans.append((clock.compute_s(), t_end - t_sync, t_end - t0))
    assert spans[1][1] >= STEP_S and spans[1][2] >= STEP_S + 0.02    # the step: in iteration 1's wait and time
    assert spans[2][0] < STEP_S and spans[1][0] < STEP_S             # and in nobody's compute
    assert Timer(torch.device("cpu")).cuda is False


class SlowStepSGD(torch.optim.SGD):
    """SGD whose second step takes STEP_S longer (e.g. a large optimizer state on a slow device)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.calls += 1
        if self.calls == 2:
            time.sleep(STEP_S)
        return super().step(closure)


def test_a_slow_optimizer_step_is_in_its_own_iterations_record(tmp_path):
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    ds = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    cfg = JobConfig(batch=16, epochs=1, checkpoint=False, run_dir=str(tmp_path / "run"))
    tr = Trainer(model, SlowStepSGD(model.parameters(), lr=0.1), ds, torch.nn.CrossEntropyLoss(), config=cfg,
                 world=World(rank=0, size=1, gpu_types=("v100",)))
    tr.fit(max_iterations=4)
    its = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
           if r["type"] == "iteration"]
    assert [r["it"] for r in its] == [0, 1, 2, 3]
    rank0 = [{k: (v[0] if isinstance(v, list) else v) for k, v in r.items()} for r in its]   # per-rank lists
    one, two = rank0[1], rank0[2]
    assert one["wait_s"] >= STEP_S and one["iter_s"] >= STEP_S + one["compute_s"], one
    assert two["compute_s"] < STEP_S and one["compute_s"] < STEP_S, (one, two)
    assert abs(tr.compute_local_s - sum(r["compute_s"] for r in rank0)) < 1e-6
