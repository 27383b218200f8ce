"""What the goodput policy's measuring costs, with real compute (no emulation), on 2 and 3 ranks of the torch backend
(DistributedDataParallel over Gloo here): a ~5M-parameter MLP (512 -> 2048 -> 2048 -> 10, fp32), b = 32 samples per
rank and iteration, ITERS iterations per loop.

Three whole loops, each ``ITERS`` iterations between barriers (rank 0's clock), in REPEATS rounds with their order
rotated every round (a first round, not counted, runs each once):
- ``ddp``: a hand-written DistributedDataParallel loop built as the torch backend builds DDP
  (gradient_as_bucket_view=True, 25 MB buckets), the same batches: the strongest simple thing a DDP user writes;
- ``fixed``: ``Trainer.fit(max_iterations=ITERS)`` with the fixed plan b=32 on every rank;
- ``goodput``: ``fit()`` with the goodput policy at a job's defaults (p = 100, a noise-only measurement every
  p/10 = 10 iterations, its decisions and their broadcast), in the range [B, 2B], held at the same B: the policy prices
  every B and makes its wish, which the bench then replaces by "keep B" (a range of one B measures nothing; a tiny
  kappa does not hold B where the |G|^2 estimate averages <= 0, which grows B), so that only the measuring and
  deciding differ from ``fixed``. The run asserts that B never moved and that it measured ITERS / 10 times.

Figures per rank count n (medians over the rounds, min/max beside them on the line before):
``goodput_vs_fixed_<n>r`` = goodput / fixed (goal <= 1.05), ``goodput_minus_fixed_ms_<n>r`` (ms added per
iteration by measuring), ``fit_vs_ddp_<n>r`` = fixed / ddp (goal <= 1.05), ``fit_minus_ddp_ms_<n>r``.

    python -m bench.measure_cost            # 2 then 3 ranks (a few minutes)
    python -m bench.measure_cost --small    # the same with a 9k-parameter MLP (64-64-64-10), 1000 iterations a loop
                                            # and 7 rounds: what fit() adds per iteration is most of an iteration
    python -m bench.measure_cost --quick    # a smoke run: 20 iterations, one round (figures meaningless)
"""
import statistics
import subprocess
import sys
import time

from bench.common.launch import _mpi_env, _mpirun, in_mpi_world, load_note, self_command

QUICK = "--quick" in sys.argv
SMALL = "--small" in sys.argv
RANK_COUNTS = (2, 3)


def driver() -> int:
    """Outside MPI: one mpirun per rank count, each printing its own last line; the combined last line."""
    figures: list[str] = []
    for n in RANK_COUNTS:
        cmd = [*_mpirun(n), *self_command(), "--ranks", str(n), *(a for a in sys.argv[1:] if a != "--ranks")]
        p = subprocess.run(cmd, env=_mpi_env(), capture_output=True, text=True)
        sys.stdout.write(p.stdout)
        if p.returncode != 0:
            sys.stderr.write(p.stderr[-3000:])
            print(f"measure_cost: {n} ranks failed (rc={p.returncode})", file=sys.stderr)
            return 1
        figures.append(p.stdout.strip().splitlines()[-1])
    print(" ".join(figures))
    return 0


if not in_mpi_world():
    sys.exit(driver())

import torch  # noqa: E402
from torch import nn  # noqa: E402

from bench.common.overhead_mlp import data, ddp_loop, model  # noqa: E402
from hpc_jabas.core.adaptive.policy import STAY, Wish  # noqa: E402
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

n_ranks = int(sys.argv[sys.argv.index("--ranks") + 1])
b, ITERS, REPEATS = (32, 20, 1) if QUICK else (32, 1000, 7) if SMALL else (32, 200, 5)
B = n_ranks * b
P = 100                                            # JABAS's p, goodput's measure_every then p/10 = 10
torch.set_num_threads(1)
comm.use("torch")
comm.init()
rank = comm.rank()
assert comm.size() == n_ranks, (comm.size(), n_ranks)
X, y, ds = data(B * (ITERS + 10), SMALL)                  # no epoch end inside a loop


def barrier(tag: str) -> None:
    comm.allgather_object(None, name=f"mc.{tag}")


def clocked(run) -> float:
    barrier("t0")
    t0 = time.perf_counter()
    run()
    barrier("t1")
    return comm.broadcast_object(time.perf_counter() - t0, name="mc.dt")


def trainer(policy: str) -> Trainer:
    m = model(SMALL)
    kw = ({"planner": "fixed", "plan": f"b={b} n=" + ",".join(["1"] * n_ranks)} if policy == "fixed" else
          {"planner": "lbbsp", "p": P, "batch_min": B, "batch_max": 2 * B})
    cfg = JobConfig(batch=B, policy=policy, checkpoint=False, run_dir=f"/tmp/hj-bench-measure-{policy}-{n_ranks}",
                    epochs=1000, backend="torch", **kw)
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), ds, nn.CrossEntropyLoss(), config=cfg)
    if policy != "fixed":
        pol = tr.controller.policy
        wish = pol.wish

        def held(state, space):                    # the policy's whole decision is made; B is kept
            return Wish(STAY, float(state.B), "held by bench.measure_cost: " + wish(state, space).reason)
        pol.wish = held
    return tr


def fit(policy: str) -> float:
    tr = trainer(policy)                           # built before the clock, as the model is for the DDP loop
    dt = clocked(lambda: tr.fit(max_iterations=ITERS, resume=False))
    if policy == "noise-scale":
        ctl = tr.controller
        assert all(Bt == B for _, Bt in ctl.trajectory), ctl.trajectory
        if rank == 0:
            assert ctl._fed >= ITERS // 10, ctl._fed        # measured as a job's defaults do
    return dt


loops = {"ddp": lambda: clocked(lambda: ddp_loop(X, y, b, rank, n_ranks, ITERS, small=SMALL)),
         "fixed": lambda: fit("fixed"), "goodput": lambda: fit("noise-scale")}
res: dict[str, list[float]] = {f"{k}_{n_ranks}r": [] for k in ("goodput_vs_fixed", "goodput_minus_fixed_ms",
                                                                "fit_vs_ddp", "fit_minus_ddp_ms")}
for r in range(-1, REPEATS):
    names = list(loops)[r % 3:] + list(loops)[:r % 3]
    w = {name: loops[name]() for name in names}
    if rank == 0:
        print(f"{n_ranks} ranks, round {r} (order {', '.join(names)}): " +
              ", ".join(f"{k} {w[k] / ITERS * 1e3:.1f} ms/it" for k in names), flush=True)
    if r < 0 and not QUICK:
        continue
    res[f"goodput_vs_fixed_{n_ranks}r"].append(w["goodput"] / w["fixed"])
    res[f"goodput_minus_fixed_ms_{n_ranks}r"].append((w["goodput"] - w["fixed"]) / ITERS * 1e3)
    res[f"fit_vs_ddp_{n_ranks}r"].append(w["fixed"] / w["ddp"])
    res[f"fit_minus_ddp_ms_{n_ranks}r"].append((w["fixed"] - w["ddp"]) / ITERS * 1e3)
if rank == 0:
    print(f"rounds={len(next(iter(res.values())))} ({load_note()}) " +
          " ".join(f"{k}_min={min(v):.3f} {k}_max={max(v):.3f}" for k, v in res.items()))
    tag = "_small" if SMALL else ""
    print(" ".join(f"{k}{tag}={statistics.median(v):.3f}" for k, v in res.items()), flush=True)
comm.shutdown()
