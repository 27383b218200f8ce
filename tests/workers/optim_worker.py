"""HeterogeneousOptimizer scenarios on every rank, one after the other, in one mpirun (tests/test_optim_mpi.py).

Rank r writes rank<r>.json with one entry per scenario:
- stats / stats_weighted / stats_bf16: one measurement iteration over mixed micro-batch sizes (plain and
  token-weighted losses, fp16 parameters): GradStats and the reduced gradient;
- memory: peak allocated bytes of a normal and of a measurement iteration (torch.profiler memory events);
- clip: three iterations: the Horovod recipe (synchronize twice, clip, skip_synchronize step), the
  clip_grad_norm key with a pre-step hook, synchronize + clip + a plain step();
- fp16: amp fp16 with an inf injected into one rank's loss, then a nan injected into one rank's reduced
  gradient right after its allreduce: skip decisions, scales, statistics, parameters;
- tokens: the Trainer with (loss, weight) forwards over sequences of varying lengths;
- bf16: the Trainer with amp = "bf16".
"""
import gc
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model  # noqa: E402

from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.optim import HeterogeneousOptimizer  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

SIZES = [[5, 3], [7], [2, 4, 6]]          # per rank: micro-batch sizes (S = 27, M = 6)
HALVES = [[0, 1], [0], [1, 0, 1]]
WEIGHTS = [[3.0, 11.0], [2.5], [7.0, 1.0, 4.0]]

spec = json.loads(Path(sys.argv[1]).read_text())
comm.init()
rank = comm.rank()
out: dict = {}
ce = nn.CrossEntropyLoss()


def micro_batches(X, y):
    off = sum(sum(s) for s in SIZES[:rank])
    for s in SIZES[rank]:
        yield X[off:off + s], y[off:off + s], s
        off += s


def grads(model):
    return {n: p.grad.tolist() for n, p in model.named_parameters()}


def params(model):
    return {n: p.detach().tolist() for n, p in model.named_parameters()}


# ---- statistics vs a float64 reference ------------------------------------------------------------
X, y = make_data(64).tensors
for name, weighted, dt in (("stats", False, torch.float64), ("stats_weighted", True, torch.float64),
                           ("stats_half", False, torch.float16)):
    model = make_model().to(dt)
    opt = HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    opt.begin(len(SIZES[rank]), 27, measure=True, halves=HALVES[rank])
    for k, (xb, yb, s) in enumerate(micro_batches(X.to(dt), y)):
        loss = ce(model(xb), yb)
        opt.backward(loss, s, weight=WEIGHTS[rank][k] if weighted else None)
    opt.synchronize()
    out[name] = {"stats": opt.last_stats.to_dict(), "grads": grads(model)}
    opt.remove_hooks()

# ---- memory of a measurement iteration ------------------------------------------------------------
from torch.profiler import ProfilerActivity, profile  # noqa: E402

torch.manual_seed(0)
big = nn.Sequential(nn.Linear(256, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 10))
pbytes = sum(p.numel() * p.element_size() for p in big.parameters())
opt = HeterogeneousOptimizer(torch.optim.SGD(big.parameters(), lr=0.01), big.named_parameters())
Xb, yb = torch.randn(32, 256), torch.randint(0, 10, (32,))


def iteration(measure: bool) -> None:
    opt.begin(4, 96, measure=measure, halves=[0, 1, 0, 1] if measure else None)
    for k in range(4):
        opt.backward(ce(big(Xb[8 * k:8 * k + 8]), yb[8 * k:8 * k + 8]), 8)
    opt.step()


def peaks() -> dict:
    """Peak allocated bytes over a normal and over a measurement iteration, each above its start level, from
    the allocator's events in one profiling session (a first profiled iteration makes every later free visible:
    the CPU allocator reports the frees of allocations made while profiling only)."""
    from torch.profiler import record_function
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        iteration(False)
        for name, measure in (("normal", False), ("measure", True)):
            # each from a collected heap: a buffer of the iteration before, garbage in a reference cycle, was
            # otherwise freed whenever the collector next ran (inside the measured iteration when it ran less
            # often: the suite's own threshold, tests/conftest.py), which hid the buffer the test looks for
            gc.collect()
            with record_function(f"hj.{name}"):
                iteration(measure)
    events = prof.profiler.kineto_results.events()
    mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    out = {}
    for name in ("normal", "measure"):
        rng = next(e for e in events if e.name() == f"hj.{name}")
        level = sum(b for t, b in mem if t < rng.start_ns())
        cur = top = 0
        for t, b in mem:
            if rng.start_ns() <= t <= rng.end_ns():
                cur += b
                top = max(top, cur)
        out[name] = top
        out[f"{name}_start_level"] = level
    return out


for m in (False, True):                 # warm-up: optimizer state, Horovod's buffers
    iteration(m)
out["memory"] = {"param_bytes": pbytes, **peaks()}
opt.remove_hooks()

# ---- clipping -------------------------------------------------------------------------------------
model = make_model()
norms: list = []
opt = HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), model.named_parameters())
clip = spec["clip"]
traj = []
for it in range(3):
    if it > 0:                                              # it 1: the config key and a hook; it 2: neither
        opt.remove_hooks()
        opt = HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), model.named_parameters(),
                                     clip_grad_norm=clip if it == 1 else None)
    if it == 1:
        opt.add_pre_step_hook(lambda o: norms.append(
            float(torch.stack([p.grad.norm() for _, p in o.named]).norm())))
    opt.begin(len(SIZES[rank]), 27)
    for xb, yb_, s in micro_batches(X, y):
        opt.backward(ce(model(xb), yb_), s)
    if it == 0:
        opt.synchronize()
        opt.synchronize()                                   # idempotent: no second allreduce
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        with opt.skip_synchronize():
            opt.step()
    elif it == 1:
        opt.step()
    else:
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()                                          # no skip_synchronize: still one allreduce
    traj.append(params(model))
out["clip"] = {"params": traj, "hook_norms": norms}
opt.remove_hooks()

# ---- fp16: the skip decision is the same on every rank --------------------------------------------
X32, y32 = make_data(64, dtype=torch.float32).tensors
model = make_model(dtype=torch.float32)
opt = HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), amp="fp16")
rec = []
corrupt = [False]
_sync = comm.synchronize


def corrupting_synchronize(handle):
    res = _sync(handle)
    if corrupt[0]:
        next(model.parameters()).grad.view(-1)[0] = float("nan")
    return res


comm.synchronize = corrupting_synchronize
for it in range(4):
    opt.begin(len(SIZES[rank]), 27, measure=True, halves=HALVES[rank])
    for xb, yb_, s in micro_batches(X32, y32):
        with opt.autocast():
            loss = ce(model(xb), yb_)
        if it == 1 and rank == 1:
            loss = loss * float("inf")                      # an overflow on one rank only
        opt.backward(loss, s)
    corrupt[0] = it == 2 and rank == 1       # a reduced gradient that differs on one rank (non-identical reduction)
    opt.step()
    corrupt[0] = False
    rec.append({"skipped": opt.last_step_skipped, "stats": opt.last_stats is not None,
                "scale": float(opt.amp.scaler.get_scale()), "params": params(model),
                "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters())})
sd = opt.state_dict()
fresh = HeterogeneousOptimizer(torch.optim.SGD(make_model(dtype=torch.float32).parameters(), lr=0.1),
                               [], amp="fp16")
fresh.load_state_dict(sd)
comm.synchronize = _sync
out["fp16"] = {"iterations": rec, "saved_scale": sd["hj_grad_scaler"]["scale"],
               "loaded_scale": float(fresh.amp.scaler.get_scale())}
opt.remove_hooks()


# ---- Trainer runs: token-weighted losses, bf16 ----------------------------------------------------
def token_data(n: int, T: int = 6, d: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    Xs = torch.randn(n, T, d, generator=g, dtype=torch.float64)
    Ys = torch.randint(0, 4, (n, T), generator=g)
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    return torch.utils.data.TensorDataset(Xs, Ys, mask)


def token_forward(m, batch):
    xs, ys, mask = batch
    logits = m(xs)                                             # (b, T, C)
    per_tok = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ys.reshape(-1), reduction="none")
    w = mask.reshape(-1).sum()
    return (per_tok * mask.reshape(-1)).sum() / w, w


def trainer_run(name: str, model, ds, forward_fn, sc: dict) -> None:
    cfg = JobConfig(planner="fixed", plan=sc["plan"], batch=1, run_dir=f"{spec['out_dir']}/{name}", checkpoint=False,
                    epochs=1000, metrics_period=1, amp=sc.get("amp", "off"))
    from hpc_jabas.core.planning import Plan
    cfg.batch = Plan.parse(sc["plan"]).B
    cfg.batch_min, cfg.batch_max = 1, 10**9
    opt = torch.optim.SGD(model.parameters(), lr=sc["lr"], momentum=0.9)
    tr = Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg, forward_fn=forward_fn)
    tr.fit(max_iterations=sc["steps"], resume=False)
    tr.opt.remove_hooks()
    losses = []
    if rank == 0:
        recs = [json.loads(ln) for ln in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in recs if r["type"] == "iteration"]
    out[name] = {"params": params(model), "losses": losses}


torch.manual_seed(3)
trainer_run("tokens", nn.Linear(5, 4).to(torch.float64), token_data(spec["tokens"]["n"]), token_forward,
            spec["tokens"])
logit_dtypes: set = set()


def bf16_forward(m, batch):
    logits = m(batch[0])
    logit_dtypes.add(str(logits.dtype))
    return ce(logits, batch[1])


trainer_run("bf16", make_model(dtype=torch.float32), make_data(spec["bf16"]["n"], dtype=torch.float32), bf16_forward,
            spec["bf16"])
out["bf16"]["logit_dtypes"] = sorted(logit_dtypes)
out["backend"] = comm.backend()          # the backend this run really took
(Path(spec["out_dir"]) / f"rank{rank}.json").write_text(json.dumps(out))
