"""Interference benchmark (issue: LB-BSP load balancing).

3 ranks (mpirun) emulating V100 / P100 / RTX 2060, fixed B = 384 (b = 8), rank 0 slowed 3x
by an injected periodic pattern (period 20 iterations, half of it slow) during the middle third
of the run. Side by side in one process run: static plan (profiles only), reactive rebalancing
(last observed speed), predictive rebalancing (NARX-style RLS on past speeds + load signals).
The ideal is the fluid optimum under the true speeds at each iteration:
T_ideal(it) = (B / b) / sum_i 1 / t_i(b, it), with t_i the emulated micro-batch time.
ideal_fraction = sum T_ideal / sum T_measured over the run. predictor_error / lastvalue_error:
the NARX model's and the last-value baseline's mean one-step relative error on the same windows.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _launch import ensure_ranks  # noqa: E402

ensure_ranks(3)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from hpc_jabas.core import gpus  # noqa: E402
from hpc_jabas.core.config import JobConfig  # noqa: E402
from hpc_jabas.runtime import comm  # noqa: E402
from hpc_jabas.runtime.emulate import Slowdown  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

TYPES = ["v100", "p100", "rtx2060"]
B, b, N = 384, 8, 300
BASE, PER = 0.001, 0.0005
SLOW = f"factor=3,start={N // 3},end={2 * N // 3},kind=periodic,period=20,duty=0.5"
torch.set_num_threads(1)
comm.init()
rank = comm.rank()
torch.manual_seed(0)
X = torch.randn(B * N, 16)
y = (X[:, :3].sum(1) > 0).long()
ds = torch.utils.data.TensorDataset(X, y)
speeds = [gpus.get(t).relative_speed for t in TYPES]
slow = Slowdown.parse(SLOW)


def t_micro(i, it):
    return (BASE + PER * b) / speeds[i] * (slow.at(it) if i == 0 else 1.0)


def run(mode):
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    cfg = JobConfig(batch=B, micro_batch=b, planner="optimal", emulate=True, gpu_types=TYPES, emulate_base_s=BASE,
                    emulate_per_sample_s=PER, slowdown={0: SLOW}, balance=mode, p_balance=5, checkpoint=False,
                    run_dir=f"/tmp/hj-bench-interference/{mode}", epochs=10, metrics_period=1000)
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01), ds, nn.CrossEntropyLoss(), config=cfg)
    its = []
    for _ in range(N):
        rec = tr.train_step()
        its.append(rec["iter_s"])
    tr._pending = []
    tr.opt.remove_hooks()
    times = comm.allgather_object(its)
    measured = [max(t[k] for t in times) for k in range(N)]
    ideal = [(B / b) / sum(1.0 / t_micro(i, k) for i in range(3)) for k in range(N)]
    err = tr.controller.predictors.error_report() if tr.controller and tr.controller.predictors else {}
    return sum(ideal) / sum(measured), err


res = {}
for mode in ("off", "reactive", "predictive"):
    res[mode] = run(mode)
    if rank == 0:
        print(f"{mode:<11} ideal_fraction={res[mode][0]:.3f} {res[mode][1]}", flush=True)
if rank == 0:
    e = res["predictive"][1]
    print(f"static_ideal_fraction={res['off'][0]:.3f} reactive_ideal_fraction={res['reactive'][0]:.3f} "
          f"predictive_ideal_fraction={res['predictive'][0]:.3f} "
          f"predictor_error={e.get('predictor_error', float('nan')):.3f} "
          f"lastvalue_error={e.get('lastvalue_error', float('nan')):.3f}")
