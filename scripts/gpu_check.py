"""The Python checks of scripts/gpu_check.sh, one subcommand per step; each prints one ``gpu_check: ...`` line
and writes ``OUT/<step>.json`` (the shell's last line sums them up).

    python scripts/gpu_check.py info OUT
    python -m torch.distributed.run --standalone --nproc_per_node=2 scripts/gpu_check.py equiv OUT
    python scripts/gpu_check.py nccl OUT           # one rank on the torch backend (NCCL on CUDA)
    python scripts/gpu_check.py stats OUT          # the half-batch statistics through the DDP reducer
    python scripts/gpu_check.py timing OUT
    python scripts/gpu_check.py amp OUT
    python scripts/gpu_check.py oom OUT

Every step runs on the CUDA device when there is one, else on the CPU (``gpu_check.sh --cpu``: the same logic,
cheaply, for tests/test_gpu_check.py). The trainer runs on the torch backend (``backend = "torch"``).

* ``equiv``: two ranks (torchrun) train 12 iterations of a fixed uneven plan (3 and 5 micro-batches of 4) and
  rank 0 compares the parameters with one process taking one big batch of the same 32 samples per iteration,
  replayed here on the CPU in float64 (an independent reference: plain torch, no hpc_jabas code in the loop).
  Two ranks on one GPU share it; NCCL refuses two ranks of one communicator on one device, so that case runs
  Gloo on the CUDA tensors, and ``nccl`` runs NCCL with one rank against the same reference.
* ``stats``: one rank on the torch backend (NCCL on CUDA: the model in torch's DistributedDataParallel) with the
  similarity policy measuring at every iteration: at least half the iterations measured, every statistic and
  loss finite, and the reducer is DDP's.
* ``timing``: the optimizer's step of iteration 2 queues a kernel that keeps the GPU busy for STEP_S
  (``torch.cuda._sleep``; on the CPU a sleep): with CUDA events and a wait after ``opt.step()``
  (runtime/clock.py) it is in iteration 2's time and in no iteration's compute.
* ``amp``: 30 iterations with ``amp = "bf16"`` and with ``amp = "fp16"`` (loss scaling): finite losses, the loss
  falls, few skipped steps.
* ``oom``: the profiler's out-of-memory probe (runtime/profiling/memory.py: ``probe_max_b_cuda``) under a
  memory cap (``torch.cuda.set_per_process_memory_fraction``): the largest micro-batch found fits, one more
  sample does not. CUDA only (on the CPU the step says so and passes nothing off as checked).
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PLAN = "b=4 n=3,5"                 # two ranks: 3 and 5 micro-batches of 4 (B = 32)
ONE_RANK_PLAN = "b=8 n=4"          # one rank, the same B
STEPS = 12
STEP_S = 0.3                       # the slow optimizer step of the timing check


OUT = Path(".")                    # set by run()


def say(step: str, ok: bool, **kv) -> None:
    (OUT / f"{step}.json").write_text(json.dumps(dict(kv, ok=int(ok))))
    words = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in kv.items())
    print(f"gpu_check: {step} ok={int(ok)} {words}", flush=True)


def cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def data(n: int = 256, d: int = 10, classes: int = 3):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    W = torch.randn(d, classes, generator=g, dtype=torch.float64)
    y = (X @ W + 0.5 * torch.randn(n, classes, generator=g, dtype=torch.float64)).argmax(1)
    return torch.utils.data.TensorDataset(X, y)


def model(d: int = 10, classes: int = 3) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(d, 16), nn.Tanh(), nn.Linear(16, classes)).to(torch.float64)


def config(plan: str, run_dir: Path, world: int, **kw):
    import shutil

    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.planning import Plan
    if int(os.environ.get("RANK", "0")) == 0:
        shutil.rmtree(run_dir, ignore_errors=True)                 # a fresh run each time (rank 0 writes it)
    keys = {"planner": "fixed", "plan": plan, "batch": Plan.parse(plan).B, "batch_min": 1, "batch_max": 10**9,
            "run_dir": str(run_dir), "checkpoint": False, "epochs": 1000, "backend": "torch",
            "gpu_types": ["v100"] * world}
    cfg = JobConfig(**{**keys, **kw})
    cfg.validate()
    return cfg


def reference(plan: str, steps: int) -> dict[str, torch.Tensor]:
    """One process, one big batch per iteration, the sampler's samples: plain torch on the CPU in float64."""
    from hpc_jabas.core.planning import Plan
    from hpc_jabas.core.planning.sampler import HeterogeneousSampler
    ds, m = data(), model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    sampler = HeterogeneousSampler(len(ds), seed=0, tail="shrink")
    X, y = ds.tensors
    p = Plan.parse(plan)
    for _ in range(steps):
        if sampler.epoch_done(p.B):
            sampler.new_epoch()
        idx = torch.as_tensor(sampler.next(p).all_indices(), dtype=torch.long)
        opt.zero_grad()
        nn.functional.cross_entropy(m(X[idx]), y[idx]).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def train(plan: str, out: Path, name: str, world: int, **kw):
    from hpc_jabas.runtime.trainer import Trainer
    m = model()
    tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), data(), nn.CrossEntropyLoss(),
                 config=config(plan, out / name, world, **kw))
    tr.fit(max_iterations=STEPS)
    return tr, {k: v.detach().cpu() for k, v in m.state_dict().items()}


def compare(params: dict[str, torch.Tensor], plan: str) -> tuple[float, float]:
    """(largest relative difference to the reference, how far the reference moved from the start)."""
    ref, init = reference(plan, STEPS), reference(plan, 0)
    err = max(float((params[k] - v).abs().max() / (v.abs().max() + 1e-12)) for k, v in ref.items())
    moved = max(float((v - init[k]).abs().max()) for k, v in ref.items())
    return err, moved


# ---- the steps ------------------------------------------------------------------------------------------
def step_info(out: Path) -> None:
    if cuda():
        p = torch.cuda.get_device_properties(0)
        say("info", True, torch=torch.__version__, cuda=torch.version.cuda, devices=torch.cuda.device_count(),
            gpu=p.name.replace(" ", "_"), memory_gib=round(p.total_memory / 2**30))
    else:
        say("info", True, torch=torch.__version__, cuda="none", devices=0, gpu="cpu")


def step_equiv(out: Path) -> None:
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    shared = cuda() and torch.cuda.device_count() < world
    if shared:              # NCCL refuses two ranks of one communicator on one device: Gloo on the CUDA tensors
        dist.is_nccl_available = lambda: False  # type: ignore[assignment]
    tr, params = train(PLAN, out, "equiv", world)
    from hpc_jabas.runtime.comm import seam as comm
    be = f"{comm.backend()}/{dist.get_backend()}"
    if tr.rank != 0:
        return
    err, moved = compare(params, PLAN)
    say("equiv", err <= 1e-9 and moved > 1e-3 and tr.iteration == STEPS, ranks=world, device=str(tr.device),
        backend=be, shared_device=int(shared), max_rel_err=err, moved=moved)


def step_nccl(out: Path) -> None:
    import torch.distributed as dist
    tr, params = train(ONE_RANK_PLAN, out, "nccl", 1)
    err, moved = compare(params, ONE_RANK_PLAN)
    say("nccl", err <= 1e-9 and moved > 1e-3, device=str(tr.device), backend=dist.get_backend(), max_rel_err=err)


def step_stats(out: Path) -> None:
    import torch.distributed as dist
    tr, _ = train(ONE_RANK_PLAN, out, "stats", 1, policy="similarity", p=4, measure_every=1, planner="optimal")
    recs = [json.loads(ln) for ln in (out / "stats" / "metrics.jsonl").read_text().splitlines()]
    its = [r for r in recs if r.get("type") == "iteration"]
    measured = [r for r in its if r.get("stats")]
    values = [v for r in measured for v in r["stats"].values() if isinstance(v, float)]
    finite = bool(values) and all(math.isfinite(v) for v in values) and all(math.isfinite(r["loss"]) for r in its)
    reducer = type(tr.opt.reducer).__name__ if getattr(tr.opt, "reducer", None) is not None else "none"
    say("stats", finite and len(measured) >= STEPS // 2 and "DDP" in reducer, device=str(tr.device),
        backend=dist.get_backend(), reducer=reducer, measured=len(measured), iterations=len(its),
        B=f"{its[0]['B']}->{its[-1]['B']}" if its else "none")


class SlowStep(torch.optim.SGD):
    """SGD whose second step queues STEP_S of device work (CUDA: a spinning kernel; CPU: a sleep)."""

    cycles_per_s = 0.0

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.calls += 1
        if self.calls == 3:
            if self.cycles_per_s:
                torch.cuda._sleep(int(STEP_S * self.cycles_per_s))    # returns at once; the GPU spins
            else:
                time.sleep(STEP_S)
        return super().step(closure)


def _cycles_per_s() -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(10**6)                                   # warm
    a.record()
    torch.cuda._sleep(50 * 10**6)
    b.record()
    b.synchronize()
    return 50e6 / (a.elapsed_time(b) / 1e3)


def step_timing(out: Path) -> None:
    from hpc_jabas.runtime.trainer import Trainer
    SlowStep.cycles_per_s = _cycles_per_s() if cuda() else 0.0
    m = model()
    tr = Trainer(m, SlowStep(m.parameters(), lr=0.05), data(), nn.CrossEntropyLoss(),
                 config=config(ONE_RANK_PLAN, out / "timing", 1))
    t0 = time.perf_counter()
    tr.fit(max_iterations=5)
    host_s = time.perf_counter() - t0
    its = [json.loads(ln) for ln in (out / "timing" / "metrics.jsonl").read_text().splitlines()]
    its = [{k: (v[0] if isinstance(v, list) else v) for k, v in r.items()} for r in its if r["type"] == "iteration"]
    slow, nxt = its[2], its[3]
    # the step's STEP_S is in iteration 2's wait and time; with the host clock alone (no events, no wait after the
    # step) a GPU would have put it into iteration 3's compute instead
    ok = slow["wait_s"] >= 0.8 * STEP_S and slow["iter_s"] >= 0.8 * STEP_S and nxt["compute_s"] < 0.8 * STEP_S \
        and slow["compute_s"] < 0.8 * STEP_S
    say("timing", ok, device=str(tr.device), events=int(tr._clock.cuda), step_s=STEP_S, slow_iter_s=slow["iter_s"],
        slow_wait_s=slow["wait_s"], slow_compute_s=slow["compute_s"], next_compute_s=nxt["compute_s"], fit_s=host_s)


def step_amp(out: Path) -> None:
    from hpc_jabas.runtime.trainer import Trainer
    res = {}
    ok = True
    for mode in ("bf16", "fp16"):
        torch.manual_seed(2)
        m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(256, 10))
        g = torch.Generator().manual_seed(3)
        side = 16 if cuda() else 8                                  # cheaper on the CPU (gpu_check.sh --cpu)
        X = torch.randn(512, 3, side, side, generator=g)
        y = (X.mean(dim=(1, 2, 3)) * 40).long().clamp(-5, 4) + 5
        tr = Trainer(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), torch.utils.data.TensorDataset(X, y),
                     nn.CrossEntropyLoss(), config=config("b=32 n=2", out / f"amp-{mode}", 1, amp=mode))
        tr.fit(max_iterations=30)
        its = [json.loads(ln) for ln in (out / f"amp-{mode}" / "metrics.jsonl").read_text().splitlines()]
        its = [{k: (v[0] if isinstance(v, list) else v) for k, v in r.items()} for r in its if r["type"] == "iteration"]
        loss = [r["loss"] for r in its]
        skipped = sum(not math.isfinite(v) for v in loss)           # an fp16 step the scaler skipped
        first, last = sum(loss[:5]) / 5, sum(loss[-5:]) / 5
        good = math.isfinite(first) and math.isfinite(last) and last < first and skipped <= 5
        ok = ok and good
        res[f"{mode}_loss"] = f"{first:.3f}->{last:.3f}"
        res[f"{mode}_nonfinite"] = skipped
        if tr.opt.amp.scaler is not None:
            res[f"{mode}_scale"] = float(tr.opt.amp.scaler.get_scale())
    say("amp", ok, device=str(tr.device), **res)


def step_oom(out: Path) -> None:
    if not cuda():
        say("oom", True, device="cpu", probe="skipped (CUDA only)")
        return
    from hpc_jabas.runtime.profiling.load import ModelBundle
    from hpc_jabas.runtime.profiling.memory import probe_max_b_cuda
    from hpc_jabas.runtime.profiling.timing import Runner
    dev = torch.device("cuda", 0)
    frac = 0.02                                                     # a cap, so that the search ends quickly
    torch.cuda.set_per_process_memory_fraction(frac, dev)
    m = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    sample = (torch.randn(8, 3, 256, 256), torch.randint(0, 10, (8,)))
    runner = Runner(ModelBundle(m, nn.CrossEntropyLoss(), sample, "gpu_check:oom"), dev, "sgd")
    t0 = time.perf_counter()
    max_b, peaks, hit = probe_max_b_cuda(runner, 4096)
    cap = frac * torch.cuda.get_device_properties(dev).total_memory
    ok = (not hit) and 1 <= max_b < 4096 and peaks.get(max_b, 0) <= cap and (max_b + 1) not in peaks
    say("oom", ok, device=str(dev), max_b=max_b, peak_gib=peaks.get(max_b, 0) / 2**30, cap_gib=cap / 2**30,
        probes=len(peaks), probe_s=time.perf_counter() - t0)


STEPS_BY_NAME = {"info": step_info, "equiv": step_equiv, "nccl": step_nccl, "stats": step_stats,
                 "timing": step_timing, "amp": step_amp, "oom": step_oom}


def run(step: str, out: Path) -> int:
    """One step: its line on stdout and OUT/<step>.json; 0 when it ran (its ok flag says how it went)."""
    global OUT
    OUT = Path(out)
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        STEPS_BY_NAME[step](OUT)
    except Exception as e:                                           # one line, the traceback in the log
        traceback.print_exc(file=sys.stderr)
        if int(os.environ.get("RANK", "0")) == 0:
            say(step, False, error=f"{type(e).__name__}:{' '.join(str(e).split())[:160]!r}")
        return 1
    return 0


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in STEPS_BY_NAME:
        print(f"usage: {sys.argv[0]} {{{','.join(STEPS_BY_NAME)}}} OUT_DIR", file=sys.stderr)
        return 2
    return run(sys.argv[1], Path(sys.argv[2]))


if __name__ == "__main__":
    sys.exit(main())
