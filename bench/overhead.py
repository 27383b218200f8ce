"""Overhead benchmark: 3 ranks of equal speed and equal batches, no emulation,
a ~5M-parameter MLP (512 -> 2048 -> 2048 -> 10, fp32), b = 32 samples per rank and iteration.

Each figure is the wall clock of a WHOLE run of ITERS iterations (after WARM warm-up ones, rank 0's clock,
between barriers): for hpc-jabas one ``Trainer.fit(max_iterations=...)`` call, so data selection,
forward/backward, allreduce, step, the metrics' flushes, the safe points, the controller and its decision
protocol and fit's own start and end are all included (not the per-iteration ``iter_s``).
- theirs: a hand-written ``hvd.DistributedOptimizer`` loop (one seeded permutation per epoch, b samples
  per rank per iteration), the strongest simple alternative;
- ours: ``fit()`` with the fixed policy, plan b=32 n=1,1,1 and the default safe points (the agreement
  started at a boundary and read at the next) -> ``overhead_ratio`` = ours / theirs;
- blocking: the same with the earlier safe point, a blocking allreduce at every boundary;
- off: the same with no agreement at all (no stop possible: measurement only)
  -> ``safepoint_ratio`` = ours / off and ``safepoint_blocking_ratio`` = blocking / off;
- adaptive: ``fit()`` with policy = "similarity" at p = 100 and the defaults otherwise (batch_min =
  batch_max = batch: B stays at 96), planner lbbsp (equal speeds: the same b=32 n=1,1,1 plan; the fixed
  planner refuses an adaptive policy); ITERS = 100 holds one measurement iteration and one decision
  round -> ``overhead_ratio_adaptive`` = adaptive / theirs.
- ``measure_iteration_ratio``: the Trainer with a controller that measures every other iteration; each
  iteration (``train_step``) timed alone between barriers; median(measurement iterations) / median(normal ones).
REPEATS rounds (fresh runs each), the order of the runs rotated every round; each ratio's median over the
rounds with its min/max, and "not separated" when [min, max] holds 1.0. Shared 2-core machine (3 ranks
oversubscribe it): noisy, see the load note.
Last line: ``overhead_ratio=.. overhead_ratio_adaptive=.. safepoint_ratio=.. safepoint_blocking_ratio=..
measure_iteration_ratio=..``, each followed by its ``_min``, ``_max`` and ``_vs_parity`` (separated or
not_separated), then ``rounds`` and the load.
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

b, ITERS, WARM, REPEATS, MEASURE_PAIRS = 32, 100, 3, 5, 15
B = 3 * b
torch.set_num_threads(1)
comm.init()
rank = comm.rank()
torch.manual_seed(0)
N = B * (ITERS + WARM + 10)                      # no epoch end inside a loop
X = torch.randn(N, 512)
y = (X[:, :8].sum(1) > 0).long()
ds = torch.utils.data.TensorDataset(X, y)


def model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))


PARAMS = sum(p.numel() for p in model().parameters())


def barrier(tag: str) -> None:
    comm.allgather_object(None, name=f"oh.{tag}")


def timed(fn) -> float:
    """Seconds of ``fn()`` on every rank, between barriers, as rank 0 measured them."""
    barrier("t0")
    t0 = time.perf_counter()
    fn()
    barrier("t1")
    return comm.broadcast_object(time.perf_counter() - t0, name="oh.dt")


def theirs():
    m = model()
    opt = comm.distributed_optimizer(torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), m.named_parameters())
    comm.broadcast_parameters(m.state_dict())
    loss_fn = nn.CrossEntropyLoss()
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    pos = [0]

    def step() -> None:
        idx = perm[pos[0] + rank * b:pos[0] + (rank + 1) * b]
        pos[0] += B
        opt.zero_grad()
        loss_fn(m(X[idx]), y[idx]).backward()
        opt.step()
    for _ in range(WARM):
        step()

    def run() -> None:
        for _ in range(ITERS):
            step()
    return run, lambda: None


def trainer(policy: str, controller=None) -> Trainer:
    m = model()
    kw = {"planner": "fixed", "plan": f"b={b} n=1,1,1"} if policy == "fixed" else {"planner": "lbbsp", "p": 100}
    cfg = JobConfig(batch=B, policy=policy, checkpoint=False, run_dir=f"/tmp/hj-bench-overhead-{policy}",
                    epochs=1000, **kw)
    return Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), ds, nn.CrossEntropyLoss(),
                   config=cfg, controller=controller)


def ours(policy: str, safe_points: str = "overlap"):
    tr = trainer(policy)
    tr.safe_points.mode = safe_points
    assert str(tr.plan) == f"b={b} n=1,1,1", tr.plan
    tr.fit(max_iterations=WARM, resume=False)

    def run() -> None:
        tr.fit(max_iterations=WARM + ITERS, resume=False)
        assert tr.iteration == WARM + ITERS and tr.stop_reason is None, (tr.iteration, tr.stop_reason)
    return run, tr.opt.remove_hooks


class EveryOther:
    """Measures the statistics on every other iteration, decides nothing (hooks.Controller)."""

    def attach(self, trainer) -> None: ...
    def wants_stats(self, iteration: int) -> bool: return iteration % 2 == 1
    def after_step(self, trainer, rec): return None
    def b_trajectory(self): return []
    def state_dict(self): return {}
    def load_state_dict(self, d) -> None: ...


def measure_ratio() -> float:
    tr = trainer("fixed", EveryOther())
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(WARM + 2 * MEASURE_PAIRS):
        barrier("m0")
        t0 = time.perf_counter()
        rec = tr.train_step()
        barrier("m1")
        dt = comm.broadcast_object(time.perf_counter() - t0, name="oh.mdt")
        if i >= WARM:
            times["stats" in rec].append(dt)
    tr.flush_metrics()
    tr.opt.remove_hooks()
    assert len(times[True]) == MEASURE_PAIRS, times
    return statistics.median(times[True]) / statistics.median(times[False])


setups = {"theirs": theirs, "ours": lambda: ours("fixed"), "blocking": lambda: ours("fixed", "blocking"),
          "off": lambda: ours("fixed", "off"), "adaptive": lambda: ours("similarity")}
order = list(setups)
res: dict[str, list[float]] = {"overhead_ratio": [], "overhead_ratio_adaptive": [], "safepoint_ratio": [],
                               "safepoint_blocking_ratio": [], "measure_iteration_ratio": []}
if rank == 0:
    print(f"model: {PARAMS / 1e6:.2f}M parameters, b={b} per rank, {ITERS} iterations per run, {REPEATS} rounds "
          "in rotated order", flush=True)
for r in range(REPEATS):
    k = r % len(order)
    names = order[k:] + order[:k]
    t = {}
    for name in names:                   # each run built (and warmed up) just before it is timed
        run, close = setups[name]()
        t[name] = timed(run)
        close()
    res["overhead_ratio"].append(t["ours"] / t["theirs"])
    res["overhead_ratio_adaptive"].append(t["adaptive"] / t["theirs"])
    res["safepoint_ratio"].append(t["ours"] / t["off"])
    res["safepoint_blocking_ratio"].append(t["blocking"] / t["off"])
    res["measure_iteration_ratio"].append(measure_ratio())
    if rank == 0:
        per_it = "  ".join(f"{n} {t[n] / ITERS * 1e3:.1f} ms/it" for n in order)
        print(f"round {r} (order {', '.join(names)}): {per_it}  measurement/normal iteration "
              f"{res['measure_iteration_ratio'][-1]:.3f}", flush=True)


def vs_parity(v: list[float]) -> str:
    return "not_separated" if min(v) <= 1.0 <= max(v) else "separated"


if rank == 0:
    for key, v in res.items():
        print(f"{key}: median {statistics.median(v):.4f} [{min(v):.4f}, {max(v):.4f}] over {len(v)} rounds"
              + ("" if key == "measure_iteration_ratio" else f", {vs_parity(v).replace('_', ' ')}"))
    print(" ".join(f"{key}={statistics.median(v):.4f} {key}_min={min(v):.4f} {key}_max={max(v):.4f} "
                   f"{key}_vs_parity={vs_parity(v)}" for key, v in res.items())
          + f" rounds={REPEATS} {load_note()}")
