"""Overhead benchmark (issue 3): 3 ranks of equal speed and equal batches, no emulation.

hpc-jabas's loop (Trainer with plan b=64 n=1,1,1: sampler, weighted allreduce from backward
hooks, metrics) against a hand-written hvd.DistributedOptimizer loop on the same model and data,
alternating runs in one process run (6 runs, the order swapped every run). Each run's figure is the
wall time of its whole loop of 25 iterations (after 3 warm-up ones, between barriers, on rank 0) /
25: data selection, step and synchronisation included. Last line: overhead_ratio=<median over runs of
ours / theirs, both from the same run>; the line before: min/max. Shared 2-core machine: noisy.
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _launch import ensure_ranks, load_note  # noqa: E402

ensure_ranks(3)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hpc_jabas.core.config import JobConfig  # noqa: E402
from hpc_jabas.runtime import comm  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

b, ITERS, RUNS, WARM = 64, 25, 6, 3
torch.set_num_threads(1)
comm.init()
rank = comm.rank()
torch.manual_seed(0)
X = torch.randn(8192, 256)
y = (X[:, :8].sum(1) > 0).long()
ds = torch.utils.data.TensorDataset(X, y)


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2))


def theirs() -> float:
    m = model()
    opt = comm.distributed_optimizer(torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), m.named_parameters())
    comm.broadcast_parameters(m.state_dict())
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)

    def step():
        idx = torch.randperm(len(ds), generator=g)[: 3 * b][rank * b:(rank + 1) * b]
        xb, yb = X[idx], y[idx]
        opt.zero_grad()
        loss_fn(m(xb), yb).backward()
        opt.step()
    return loop(step)


def loop(step) -> float:
    """Seconds per iteration: the whole loop after warm-up, between barriers, as rank 0 sees it."""
    for _ in range(WARM):
        step()
    comm.allgather_object(None, name="oh.t0")
    t0 = time.perf_counter()
    for _ in range(ITERS):
        step()
    comm.allgather_object(None, name="oh.t1")
    return comm.broadcast_object((time.perf_counter() - t0) / ITERS, name="oh.dt")


def ours() -> float:
    m = model()
    cfg = JobConfig(batch=3 * b, planner="fixed", plan=f"b={b} n=1,1,1", checkpoint=False,
                    run_dir="/tmp/hj-bench-overhead", epochs=1000)
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), ds, nn.CrossEntropyLoss(), config=cfg)
    dt = loop(tr.train_step)
    tr.flush_metrics()
    tr.opt.remove_hooks()
    return dt


ratios = []
for r in range(RUNS):
    t_theirs, t_ours = (theirs(), ours()) if r % 2 == 0 else tuple(reversed((ours(), theirs())))
    ratios.append(t_ours / t_theirs)
    if rank == 0:
        print(f"run {r}: hvd.DistributedOptimizer {t_theirs * 1e3:.2f} ms/it  hpc-jabas {t_ours * 1e3:.2f} ms/it  "
              f"ratio {ratios[-1]:.3f}", flush=True)
if rank == 0:
    print(f"runs={RUNS} (shared machine, {load_note()}) overhead_ratio_min={min(ratios):.3f} "
          f"overhead_ratio_max={max(ratios):.3f}")
    print(f"overhead_ratio={statistics.median(ratios):.3f}")
