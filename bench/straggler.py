"""Straggler benchmark (issue 3): 3 ranks emulating speeds 1 : 0.5 : 0.25, B = 512 fixed.

Side by side in one run, alternating rounds:
  (a) plain Horovod, what a user does today: hvd.DistributedOptimizer, equal local batches
      B/3 (171, 171, 170), each local batch one forward/backward, emulated at the rank's speed;
  (b) hpc-jabas with the speed-proportional (LB-BSP) plan: micro-batches of b = 8, n_i in
      proportion to the speeds (37, 18, 9), the weighted allreduce.
The fluid ideal is the sum of the three ranks' solo samples/s (each rank alone, micro-batches of
b, no communication), measured here too.  Emulation: t(x) = (0.2 ms + 0.5 ms * x) / speed.
Last line: speedup_vs_equal_split=<b over a> ideal_fraction=<b over ideal> (medians over rounds).
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _launch import ensure_ranks  # noqa: E402

ensure_ranks(3)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hpc_jabas.core.config import JobConfig  # noqa: E402
from hpc_jabas.runtime import comm  # noqa: E402
from hpc_jabas.runtime.emulate import Emulator  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

SPEEDS = [1.0, 0.5, 0.25]
B, b = 512, 8
BASE, PER = 0.0002, 0.0005
ITERS, ROUNDS, WARM = 8, 3, 2

torch.set_num_threads(1)
comm.init()
rank = comm.rank()
torch.manual_seed(0)
X = torch.randn(4096, 32)
y = (X[:, :4].sum(1) > 0).long()
ds = torch.utils.data.TensorDataset(X, y)
quiet = lambda m: None


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))


def run_equal_split() -> float:
    m = model()
    opt = comm.distributed_optimizer(torch.optim.SGD(m.parameters(), lr=0.01), m.named_parameters())
    comm.broadcast_parameters(m.state_dict())
    emu = Emulator("v100", speed=SPEEDS[rank], base_s=BASE, per_sample_s=PER, rank=rank, log=quiet)
    local = [B // 3 + (1 if i < B % 3 else 0) for i in range(3)]
    off = sum(local[:rank])
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for it in range(WARM + ITERS):
        start = (it * B) % (len(ds) - B)
        xb, yb = X[start + off:start + off + local[rank]], y[start + off:start + off + local[rank]]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(m(xb), yb).backward()
        emu.wait_until(t0, local[rank], it)
        opt.step()
        if it >= WARM:
            times.append(time.perf_counter() - t0)
    return B / statistics.median(times)


def run_hpc_jabas() -> float:
    m = model()
    cfg = JobConfig(batch=B, micro_batch=b, planner="lbbsp", speeds=SPEEDS, emulate=True,
                    gpu_types=["v100"] * 3, emulate_base_s=BASE, emulate_per_sample_s=PER,
                    checkpoint=False, run_dir="/tmp/hj-bench-straggler", metrics_period=1000, epochs=100)
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01), ds, nn.CrossEntropyLoss(), config=cfg)
    tr.emulator = Emulator("v100", speed=SPEEDS[rank], base_s=BASE, per_sample_s=PER, rank=rank, log=quiet)
    if rank == 0 and not hasattr(run_hpc_jabas, "said"):
        print(f"hpc-jabas plan: {tr.plan}", flush=True)
        run_hpc_jabas.said = True
    times = []
    for it in range(WARM + ITERS):
        rec = tr.train_step()
        if it >= WARM:
            times.append(rec["iter_s"])
    tr._pending = []
    times = comm.allgather_object(statistics.median(times))
    return B / max(times)


def solo_rates() -> float:
    """Each rank alone (others idle at a barrier): samples/s over micro-batches of b."""
    m = model()
    emu = Emulator("v100", speed=SPEEDS[rank], base_s=BASE, per_sample_s=PER, rank=rank, log=quiet)
    loss_fn = nn.CrossEntropyLoss()
    rates = []
    for r in range(3):
        comm.broadcast_object(None, name=f"solo{r}")
        if r == rank:
            t0 = time.perf_counter()
            for k in range(16):
                t1 = time.perf_counter()
                loss_fn(m(X[k * b:(k + 1) * b]), y[k * b:(k + 1) * b]).backward()
                emu.wait_until(t1, b)
            rates.append(16 * b / (time.perf_counter() - t0))
    return sum(comm.allgather_object(rates[0] if rates else 0.0))


# The fluid ideal: the sum of the ranks' solo rates. Measured solo rates carry this machine's noise
# (a rank alone still shares 2 cores with the others' Horovod threads), and the emulation defines
# each rank's solo rate exactly: b / t(b). The larger of the two is used, so the fraction is never
# flattered by a slow solo measurement.
formula = sum(b / ((BASE + PER * b) / s) for s in SPEEDS)
ideal = max(solo_rates(), formula)
eq, ours = [], []
for rnd in range(ROUNDS):
    eq.append(run_equal_split())
    ours.append(run_hpc_jabas())
    if rank == 0:
        print(f"round {rnd}: equal_split={eq[-1]:.0f} samples/s  hpc_jabas={ours[-1]:.0f} samples/s  "
              f"ideal={ideal:.0f}", flush=True)
if rank == 0:
    e, o = statistics.median(eq), statistics.median(ours)
    print(f"equal_split_samples_per_s={e:.0f} hpc_jabas_samples_per_s={o:.0f} ideal_samples_per_s={ideal:.0f}")
    print(f"speedup_vs_equal_split={o / e:.2f} ideal_fraction={o / ideal:.2f}")
