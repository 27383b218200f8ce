"""Overhead benchmark: 3 ranks of equal speed and equal batches, no emulation,
a ~5M-parameter MLP (512 -> 2048 -> 2048 -> 10, fp32), b = 32 samples per rank and iteration.

Each figure is the wall clock of a WHOLE loop of ITERS iterations (after WARM warm-up ones, rank 0's
clock): data selection, forward/backward, allreduce, step, the metrics' flushes, the controller and its
decision protocol, all included (not the per-iteration ``iter_s``). The three loops live side by side
and run in chunks of CHUNK iterations, alternating (each chunk between barriers, the chunks of a loop
summed), so that all three see the same load of this shared machine.
- theirs: a hand-written ``hvd.DistributedOptimizer`` loop (one seeded permutation per epoch, b samples
  per rank per iteration), the strongest simple alternative;
- ours: the Trainer's ``train_step`` (no safe point: ``fit()`` adds it) with the fixed policy, plan b=32 n=1,1,1
  -> ``overhead_ratio`` = ours / theirs;
- adaptive: the Trainer with policy = "similarity" at p = 100 and the defaults otherwise (batch_min =
  batch_max = batch: B stays at 96), planner lbbsp (equal speeds: the same b=32 n=1,1,1 plan; the fixed
  planner refuses an adaptive policy); ITERS = 100 holds one measurement iteration and one decision
  round -> ``overhead_ratio_adaptive`` = adaptive / theirs.
- ``measure_iteration_ratio``: the Trainer with a controller that measures every other iteration; each
  iteration timed alone between barriers; median(measurement iterations) / median(normal ones).
REPEATS rounds (fresh loops each), the order of the three loops rotated every round; each ratio's
median over the rounds with its min/max. Shared 2-core machine (3 ranks oversubscribe it): noisy, see the load note.
- whole loops, the ones a user runs: ``Trainer.fit(max_iterations=100)`` (setup collectives, the safe point's
  agreement at every iteration boundary, metrics, controller), fixed and similarity at p = 100, each against the
  hand-written loop's 100 iterations as one block (its broadcast included), order rotated each round ->
  ``overhead_ratio_fit``, ``overhead_ratio_fit_adaptive``.
- the safe point (runtime/safepoint.py) in the same whole-loop rounds: the fixed-plan ``fit()`` with its
  agreement overlapped (the default), blocking (an allreduce waited for at every boundary, the earlier safe
  point) and off (no agreement: no stop, for measuring only) -> ``safepoint_ratio`` = overlapped / off,
  ``safepoint_blocking_ratio`` = blocking / off, ``overhead_ratio_fit_safepoint_off`` = off / theirs (what
  ``fit()`` adds besides the safe point).

- the two backends (runtime/comm/seam.py, docs/backends.md), in the same rounds, the order of four whole loops rotated
  each round: the Horovod backend's ``fit()`` and its hand-written ``hvd.DistributedOptimizer`` loop, the torch
  backend's ``fit()`` (Gloo here) and a hand-written ``DistributedDataParallel`` loop (the strongest simple thing
  a torch user writes; its construction broadcasts rank 0's parameters, as ``hvd.broadcast_parameters`` does in
  the other), all on the same batches, fixed plan b=32 n=1,1,1 -> ``fit_vs_own_loop_horovod``,
  ``fit_vs_own_loop_torch`` (goal <= 1.03), ``fit_torch_vs_horovod`` (torch fit() / Horovod fit()) and
  ``ddp_vs_hvd_loop`` (the two hand-written loops); and a fifth, the DDP loop built as the torch backend's fit()
  builds DDP (``gradient_as_bucket_view=True``, the same bucket size) -> ``fit_vs_ddp_loop`` (goal <= 1.03, the
  last figure of the last line) and ``fit_minus_ddp_loop_ms`` (the time fit() adds per iteration, in ms). The
  process switches backends between loops
  (``comm.shutdown()``, not timed); a first round, not counted, runs each loop once (first connections).
- the keep-your-loop API (``hpc_jabas.Jabas``, runtime/loop.py; bench/common/overhead_loops.py) in the same rounds,
  on each backend, the loop as examples/porting/*_loop.py write it (setup, ``for step in loader``, ``backward``,
  step; B = b x ranks in micro-batches of b: the same split) -> ``loop_vs_ddp_loop`` (Jabas on torch / the DDP
  loop built as fit() builds it, goal <= 1.03), ``loop_vs_hvd_loop`` (Jabas on Horovod / the
  ``hvd.DistributedOptimizer`` loop, goal <= 1.03), ``fit_vs_loop`` (torch fit() / Jabas on torch, goal <= 1.01)
  and ``loop_minus_ddp_ms`` (what Jabas adds per iteration over the DDP loop, ms). Each is printed with its median
  and [min, max] over the rounds, "not separated" when that range holds parity (1, or 0 ms).
- Python calls per iteration (``sys.setprofile``, rank 0; (calls of 2k iterations - calls of k) / k, k = 5: set-up
  cancels; Horovod's polls of a wait left out): the same on a loaded machine -> ``ddp_loop_calls_per_it``,
  ``loop_calls_per_it``, ``fit_calls_per_it`` (torch), ``hvd_loop_calls_per_it``, ``loop_hvd_calls_per_it``
  (Horovod). fit()'s count moves a little with speed (its safe point and metrics act every ``safe_point_s``
  seconds, not every iteration: 396 and 407.8 in two loaded 2-rank runs); the loops' counts repeated exactly.
- ``--ranks N`` (default 3): the ranks (mpirun, 2 is not oversubscribed on 2 cores). The issue's protocol runs
  ``--backends-only --ranks 2`` and ``--backends-only --ranks 3``.

Last line: ``overhead_ratio=X overhead_ratio_adaptive=Y measure_iteration_ratio=Z overhead_ratio_fit=F
overhead_ratio_fit_adaptive=G overhead_ratio_fit_safepoint_off=H safepoint_ratio=S safepoint_blocking_ratio=T
fit_vs_own_loop_horovod=.. fit_vs_own_loop_torch=.. fit_torch_vs_horovod=.. ddp_vs_hvd_loop=..
fit_minus_ddp_loop_ms=.. fit_vs_ddp_loop=.. loop_vs_ddp_loop=.. loop_vs_hvd_loop=.. fit_vs_loop=..
loop_minus_ddp_ms=.. (the calls per iteration) ranks=N``.

    python -m bench.overhead                   # everything (about 15 minutes here)
    python -m bench.overhead --backends-only   # only the two backends' loops (hand-written, fit(), Jabas)
    python -m bench.overhead --backends-only --ranks 2
    python -m bench.overhead --quick           # a smoke run: 10 iterations, one round (figures meaningless)
"""
import statistics
import sys
import time

from bench.common.launch import ensure_ranks, load_note
from bench.common.overhead_loops import calls_per_iteration, jabas_loop
from bench.common.overhead_mlp import data, ddp_loop, model


def ranks_arg() -> int:
    """``--ranks N`` (default 3); anything else: one line, exit code 2."""
    if "--ranks" not in sys.argv:
        return 3
    i = sys.argv.index("--ranks")
    v = sys.argv[i + 1] if i + 1 < len(sys.argv) else ""
    if not v.isdigit() or int(v) < 2:
        print(f"bench.overhead: --ranks {v!r} must be an integer >= 2", file=sys.stderr)
        sys.exit(2)
    return int(v)


WORLD = ranks_arg()
ensure_ranks(WORLD)

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402,F401  (MPI initialised here: Horovod can shut down and start again)
from torch import nn  # noqa: E402

from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

QUICK, BACKENDS_ONLY = "--quick" in sys.argv, "--backends-only" in sys.argv
b, ITERS, CHUNK, WARM, REPEATS, MEASURE_PAIRS = (32, 10, 5, 1, 1, 2) if QUICK else (32, 100, 10, 3, 3, 15)
B = WORLD * b
ONES = ",".join(["1"] * WORLD)
torch.set_num_threads(1)
HOROVOD = comm.horovod_importable()[0]
comm.use("horovod" if HOROVOD else "torch")
comm.init()
rank = comm.rank()
N = B * (ITERS + WARM + 10)                      # no epoch end inside a loop
X, y, ds = data(N)

PARAMS = sum(p.numel() for p in model().parameters())


def barrier(tag: str) -> None:
    comm.allgather_object(None, name=f"oh.{tag}")


def timed_chunk(step, n: int) -> float:
    """Seconds for n iterations of ``step``, between barriers, as rank 0 measured them."""
    barrier("t0")
    t0 = time.perf_counter()
    for _ in range(n):
        step()
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
    return step, lambda: None


def trainer(policy: str, controller=None) -> Trainer:
    m = model()
    kw = {"planner": "fixed", "plan": f"b={b} n={ONES}"} if policy == "fixed" else {"planner": "lbbsp", "p": 100}
    cfg = JobConfig(batch=B, policy=policy, checkpoint=False, run_dir=f"/tmp/hj-bench-overhead-{policy}",
                    epochs=1000, backend=comm.backend(), **kw)
    return Trainer(m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), ds, nn.CrossEntropyLoss(),
                   config=cfg, controller=controller)


def ours(policy: str):
    tr = trainer(policy)
    assert str(tr.plan) == f"b={b} n={ONES}", tr.plan

    def close() -> None:
        tr.flush_metrics()
        tr.opt.remove_hooks()
    return tr.train_step, close


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


def theirs_whole() -> float:
    """The hand-written loop as one block: broadcast, ITERS iterations, between barriers (rank 0's seconds)."""
    barrier("w0")
    t0 = time.perf_counter()
    step, _ = theirs()
    for _ in range(ITERS):
        step()
    barrier("w1")
    return comm.broadcast_object(time.perf_counter() - t0, name="oh.wdt")


def fit_whole(policy: str, safe_points: str = "overlap") -> float:
    """``Trainer.fit(max_iterations=ITERS)`` as one block: setup collectives, safe points at every boundary,
    metrics and the controller included; the Trainer is built before the clock, as the model is for theirs.
    ``safe_points``: the agreement's mode (runtime/safepoint.py: "overlap" the default, "blocking", "off")."""
    tr = trainer(policy)
    tr.safe_points.mode = safe_points
    barrier("f0")
    t0 = time.perf_counter()
    out = tr.fit(max_iterations=ITERS, resume=False)
    barrier("f1")
    dt = comm.broadcast_object(time.perf_counter() - t0, name="oh.fdt")
    assert out["iterations"] == ITERS, out
    tr.opt.remove_hooks()
    return dt


def use_backend(name: str) -> None:
    """Run the next loop on backend ``name`` (a shutdown and a fresh start when the other one runs)."""
    if comm.backend() != name:
        comm.shutdown()
        comm.use(name)
        comm.init()


def ddp_whole(bucket_view: bool = False) -> float:
    """The hand-written DistributedDataParallel loop as one block (the torch backend's process group): DDP's
    construction (it broadcasts rank 0's parameters), ITERS iterations of the same batches as theirs.
    ``bucket_view``: as the torch backend's fit() builds it (gradient_as_bucket_view=True, the same bucket size)."""
    barrier("d0")
    t0 = time.perf_counter()
    ddp_loop(X, y, b, rank, WORLD, ITERS, bucket_view)
    barrier("d1")
    return comm.broadcast_object(time.perf_counter() - t0, name="oh.ddt")


def jabas_whole() -> float:
    """The keep-your-loop API on the backend in use as one block: Jabas's setup (DDP's construction or Horovod's
    broadcast), ITERS iterations."""
    barrier("j0")
    t0 = time.perf_counter()
    jabas_loop(ds, b, WORLD, ITERS, comm.backend())
    barrier("j1")
    return comm.broadcast_object(time.perf_counter() - t0, name="oh.jdt")


BACKEND_LOOPS = {"hvd_loop": ("horovod", theirs_whole), "hvd_fit": ("horovod", lambda: fit_whole("fixed")),
                 "ddp_loop": ("torch", ddp_whole), "torch_fit": ("torch", lambda: fit_whole("fixed")),
                 "ddp_bv_loop": ("torch", lambda: ddp_whole(bucket_view=True)),
                 "loop_torch": ("torch", jabas_whole), "loop_hvd": ("horovod", jabas_whole)}
#: the keep-your-loop figures: (numerator, denominator) of each ratio
LOOP_RATIOS = {"loop_vs_ddp_loop": ("loop_torch", "ddp_bv_loop"), "loop_vs_hvd_loop": ("loop_hvd", "hvd_loop"),
               "fit_vs_loop": ("torch_fit", "loop_torch")}


def backend_rounds() -> dict[str, list[float]]:
    """REPEATS rounds of the four whole loops (both backends), their order rotated every round."""
    names = [n for n, (be, _) in BACKEND_LOOPS.items() if HOROVOD or be == "torch"]
    out: dict[str, list[float]] = {k: [] for k in ("fit_vs_own_loop_horovod", "fit_vs_own_loop_torch",
                                                   "fit_torch_vs_horovod", "ddp_vs_hvd_loop", "fit_minus_ddp_loop_ms",
                                                   "fit_vs_ddp_loop") if HOROVOD or
                                   k in ("fit_vs_own_loop_torch", "fit_minus_ddp_loop_ms", "fit_vs_ddp_loop")}
    out.update({k: [] for k, (a, c) in LOOP_RATIOS.items() if a in names and c in names})
    out["loop_minus_ddp_ms"] = []
    for r in range(-1, REPEATS):       # round -1: each loop once untimed (first connections, lazy start-up)
        k = r % len(names)
        order = names[k:] + names[:k]
        w: dict[str, float] = {}
        for name in order:
            be, run = BACKEND_LOOPS[name]
            use_backend(be)
            w[name] = run()
        if r < 0:
            continue
        out["fit_vs_own_loop_torch"].append(w["torch_fit"] / w["ddp_loop"])
        out["fit_minus_ddp_loop_ms"].append((w["torch_fit"] - w["ddp_bv_loop"]) / ITERS * 1e3)   # added per iteration
        out["fit_vs_ddp_loop"].append(w["torch_fit"] / w["ddp_bv_loop"])
        for k, (a, c) in LOOP_RATIOS.items():
            if k in out:
                out[k].append(w[a] / w[c])
        out["loop_minus_ddp_ms"].append((w["loop_torch"] - w["ddp_bv_loop"]) / ITERS * 1e3)
        if HOROVOD:
            out["fit_vs_own_loop_horovod"].append(w["hvd_fit"] / w["hvd_loop"])
            out["fit_torch_vs_horovod"].append(w["torch_fit"] / w["hvd_fit"])
            out["ddp_vs_hvd_loop"].append(w["ddp_loop"] / w["hvd_loop"])
        if rank == 0:
            print(f"backends round {r} (order {', '.join(order)}): " + ", ".join(
                f"{n} {w[n]:.2f} s" for n in order), flush=True)
    return out


def hvd_loop_n(n: int) -> None:
    step, _ = theirs()
    for _ in range(n):
        step()


def fit_n(n: int) -> None:
    tr = trainer("fixed")
    tr.fit(max_iterations=n, resume=False)
    tr.opt.remove_hooks()


#: the loops whose Python calls per iteration are counted: name -> (backend, run(iterations))
CALL_LOOPS = {"ddp_loop": ("torch", lambda n: ddp_loop(X, y, b, rank, WORLD, n, True)),
              "loop": ("torch", lambda n: jabas_loop(ds, b, WORLD, n, "torch")), "fit": ("torch", fit_n),
              "hvd_loop": ("horovod", hvd_loop_n), "loop_hvd": ("horovod", lambda n: jabas_loop(ds, b, WORLD, n,
                                                                                                 "horovod"))}


def call_counts(k: int = 5) -> dict[str, float]:
    """Python calls per iteration of each loop (rank 0's count; deterministic, load does not move it)."""
    out = {}
    for name, (be, run) in CALL_LOOPS.items():
        if be == "horovod" and not HOROVOD:
            continue
        use_backend(be)
        out[f"{name}_calls_per_it"] = comm.broadcast_object(calls_per_iteration(run, k), name="oh.calls")
    return out


def interval_note(res: dict[str, list[float]]) -> str:
    """The keep-your-loop figures as median [min, max] over the rounds, "not separated" where that range holds
    parity (a ratio's 1, a difference's 0 ms)."""
    parts = []
    for k in (*LOOP_RATIOS, "loop_minus_ddp_ms"):
        if res.get(k):
            v, par = res[k], 0.0 if k.endswith("_ms") else 1.0
            sep = ("one round: no interval" if len(v) < 2 else
                   "not separated" if min(v) <= par <= max(v) else "separated")
            parts.append(f"{k} {statistics.median(v):.3f} [{min(v):.3f}, {max(v):.3f}] {sep}")
    return "; ".join(parts)


setups = {"theirs": theirs, "ours": lambda: ours("fixed"), "adaptive": lambda: ours("similarity")}
order = list(setups)
res: dict[str, list[float]] = {"overhead_ratio": [], "overhead_ratio_adaptive": [], "measure_iteration_ratio": [],
                               "overhead_ratio_fit": [], "overhead_ratio_fit_adaptive": [],
                               "overhead_ratio_fit_safepoint_off": [], "safepoint_ratio": [],
                               "safepoint_blocking_ratio": []}
whole = {"theirs": theirs_whole, "fit": lambda: fit_whole("fixed"), "fit_adaptive": lambda: fit_whole("similarity"),
         "fit_blocking": lambda: fit_whole("fixed", "blocking"), "fit_off": lambda: fit_whole("fixed", "off")}
if rank == 0:
    print(f"model: {PARAMS / 1e6:.2f}M parameters, b={b} per rank, {ITERS} iterations per loop, run in chunks of "
          f"{CHUNK} alternating between the loops", flush=True)
for r in range(0 if BACKENDS_ONLY or not HOROVOD else REPEATS):
    k = r % len(order)
    names = order[k:] + order[:k]
    loops = {name: setups[name]() for name in names}
    for name in names:
        for _ in range(WARM):
            loops[name][0]()
    t = dict.fromkeys(names, 0.0)
    for _ in range(ITERS // CHUNK):
        for name in names:
            t[name] += timed_chunk(loops[name][0], CHUNK)
    for name in names:
        loops[name][1]()
    res["overhead_ratio"].append(t["ours"] / t["theirs"])
    res["overhead_ratio_adaptive"].append(t["adaptive"] / t["theirs"])
    res["measure_iteration_ratio"].append(measure_ratio())
    wnames = list(whole)[k:] + list(whole)[:k]
    w = {name: whole[name]() for name in wnames}
    res["overhead_ratio_fit"].append(w["fit"] / w["theirs"])
    res["overhead_ratio_fit_adaptive"].append(w["fit_adaptive"] / w["theirs"])
    res["overhead_ratio_fit_safepoint_off"].append(w["fit_off"] / w["theirs"])
    res["safepoint_ratio"].append(w["fit"] / w["fit_off"])
    res["safepoint_blocking_ratio"].append(w["fit_blocking"] / w["fit_off"])
    if rank == 0:
        print(f"round {r} (order {', '.join(names)}): hvd.DistributedOptimizer "
              f"{t['theirs'] / ITERS * 1e3:.1f} ms/it  hpc-jabas fixed {t['ours'] / ITERS * 1e3:.1f} ms/it  "
              f"similarity p=100 {t['adaptive'] / ITERS * 1e3:.1f} ms/it  measurement/normal iteration "
              f"{res['measure_iteration_ratio'][-1]:.3f}; whole loops (order {', '.join(wnames)}): theirs "
              f"{w['theirs']:.2f} s, fit() fixed {w['fit']:.2f} s, fit() similarity p=100 {w['fit_adaptive']:.2f} s, "
              f"fit() fixed with the blocking safe point {w['fit_blocking']:.2f} s, without one {w['fit_off']:.2f} s",
              flush=True)
res = {k: v for k, v in res.items() if v}
res.update(backend_rounds())
calls = call_counts()
if rank == 0:
    print(f"rounds={REPEATS} ({load_note()}) " + " ".join(f"{k}_min={min(v):.3f} {k}_max={max(v):.3f}"
                                                          for k, v in res.items()))
    print(f"keep-your-loop on {WORLD} ranks (median [min, max] over {REPEATS} rounds): {interval_note(res)}")
    print(" ".join(f"{k}={statistics.median(v):.3f}" for k, v in res.items()) + " "
          + " ".join(f"{k}={v:.1f}" for k, v in calls.items()) + f" ranks={WORLD}")
