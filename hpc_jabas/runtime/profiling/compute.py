"""Compute: time every micro-batch size, the update, the memory cap; the measured profile of a GPU type."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from hpc_jabas.core.config import gpus as _gpus
from hpc_jabas.core.perf.perfmodel import ComputeProfile
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import current_rank
from hpc_jabas.runtime import progress
from hpc_jabas.runtime.profiling.defaults import DEFAULT_B_LIMIT, DEFAULT_B_LIST, OPTIMIZERS
from hpc_jabas.runtime.profiling.load import ModelBundle, grad_bytes, resolve_device
from hpc_jabas.runtime.profiling.memory import estimate_bytes, max_b_from_memory, probe_max_b_cuda
from hpc_jabas.runtime.profiling.timing import Runner, time_micro, time_update


@dataclass
class ComputeMeasurement:
    """Raw result of :func:`measure_compute` on one device."""
    device: str
    b: list[int]
    t: list[float]
    update_s: float
    grad_bytes: int
    bytes_per_sample: float
    fixed_bytes: float
    max_b: int | None           # measured cap (CUDA probe or memory_gb); None: not determined yet
    max_b_how: str
    threads: int
    repeats: list[list[float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def check_b_list(b_list: Iterable[int]) -> list[int]:
    try:
        bl = sorted({int(b) for b in b_list})
    except (TypeError, ValueError):
        raise ConfigError(f"micro-batch sizes {b_list!r} must be integers >= 1, e.g. 1,2,4,8") from None
    if not bl or bl[0] < 1:
        raise ConfigError(f"micro-batch sizes {bl} must be integers >= 1, e.g. 1,2,4,8")
    return bl

def trains_on_one_sample(runner: Runner) -> bool:
    """False when a BatchNorm layer of the model gets one value per channel from one sample (its input is
    1 x 1 there, e.g. ResNet-18's last stage on 24-32 pixel images): PyTorch refuses to train on that."""
    from hpc_jabas.runtime.batchnorm import batchnorm_modules
    if not batchnorm_modules(runner.model):
        return True
    try:
        runner.micro(runner.batch(1))
    except ValueError as e:
        if "more than 1 value per channel" in str(e):
            return False
        raise
    finally:
        runner.opt.zero_grad(set_to_none=False)
    return True


def measure_compute(bundle: ModelBundle, b_list: Iterable[int] = DEFAULT_B_LIST, *, device: str | None = None,
                    warmup: int = 3, repeats: int = 10, optimizer: str = "sgd",
                    memory_gb: float | None = None, b_limit: int = DEFAULT_B_LIMIT,
                    log: Callable[[str], None] | None = None) -> ComputeMeasurement:
    """Time every b of b_list (that fits), the update, and find the memory cap (see module doc).

    On CUDA the cap is probed (and further limited by memory_gb when given); on the CPU it is
    computed from memory_gb when given, else left to the caller (``max_b=None``): the catalog
    memory of the GPU type the measurement is stored under.
    """
    log = log or (lambda m: None)
    bl = check_b_list(b_list)
    if warmup < 0 or repeats < 1:
        raise ConfigError(f"warmup={warmup} must be >= 0 and repeats={repeats} >= 1")
    if b_limit < 1:
        raise ConfigError(f"b_limit={b_limit} must be >= 1")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer {optimizer!r} is unknown; valid: {', '.join(OPTIMIZERS)}")
    dev = resolve_device(device)
    runner = Runner(bundle, dev, optimizer)
    gb = grad_bytes(runner.model)
    per, fixed = estimate_bytes(runner, optimizer)
    max_b, how = None, ""
    if dev.type == "cuda":
        max_b, peaks, hit = probe_max_b_cuda(runner, b_limit)
        how = (f"probed on {torch.cuda.get_device_name(dev)}: largest b without OOM"
               + (f" (probe stopped at the limit b={b_limit})" if hit else ""))
        if len(peaks) >= 2:
            ks = sorted(peaks)
            per = max((peaks[ks[-1]] - peaks[ks[0]]) / (ks[-1] - ks[0]), 1.0)
            fixed = max(peaks[ks[0]] - per * ks[0], 0.0)
        if memory_gb is not None:
            cap = max_b_from_memory(float(memory_gb) * 2**30, per, fixed, b_limit)
            if cap < max_b:
                max_b, how = cap, f"declared memory {memory_gb:g} GiB / {per:.0f} B per sample (max_memory_allocated)"
    elif memory_gb is not None:
        max_b = max_b_from_memory(float(memory_gb) * 2**30, per, fixed, b_limit)
        how = (f"declared memory {memory_gb:g} GiB, estimated {per:.0f} B per sample + {fixed:.0f} B fixed"
               + (f", capped at b_limit={b_limit}" if max_b == b_limit else ""))
    todo = [b for b in bl if max_b is None or b <= max_b]
    if not todo:
        raise ConfigError(f"no micro-batch size in {bl} fits (max_b={max_b}); give smaller sizes")
    if len(todo) < len(bl):
        log(f"hpc-jabas profile: skipping b={[b for b in bl if b not in todo]} (above max_b={max_b})")
    if todo[0] == 1 and not trains_on_one_sample(runner):
        log("hpc-jabas profile: skipping b=1: a BatchNorm layer of this model sees one value per channel "
            "at b=1, which it cannot train on")
        todo = todo[1:]
        if not todo:
            raise ConfigError(f"micro-batch sizes {bl}: this model's BatchNorm cannot train on b=1; "
                              "give sizes >= 2, e.g. 2,4,8")
    update_s = time_update(runner, warmup, repeats, b=todo[0])
    ts, reps = [], []
    for b in progress.iterate(todo, "profile", "size", rank=current_rank()):
        med, all_ = time_micro(runner, b, warmup, repeats)
        ts.append(med)
        reps.append(all_)
        log(f"hpc-jabas profile: {dev.type} b={b:<5d} t={med * 1e3:9.3f} ms (median of {repeats})")
    runner.close()
    return ComputeMeasurement(device=str(dev) if dev.type == "cpu" else f"{dev} ({torch.cuda.get_device_name(dev)})",
                              b=todo, t=ts, update_s=update_s, grad_bytes=gb, bytes_per_sample=per,
                              fixed_bytes=fixed, max_b=max_b, max_b_how=how, threads=torch.get_num_threads(),
                              repeats=reps)


def catalog_cap(gpu: str, m: ComputeMeasurement, memory_gb: float | None, b_limit: int) -> tuple[int, str]:
    if memory_gb is not None:
        mem, what = float(memory_gb), f"declared memory {float(memory_gb):g} GiB"
    else:
        mem, what = _gpus.get(gpu).memory_gb, f"catalog memory {_gpus.get(gpu).memory_gb:g} GiB of {gpu}"
    cap = max_b_from_memory(mem * 2**30, m.bytes_per_sample, m.fixed_bytes, b_limit)
    return cap, (f"{what}, estimated {m.bytes_per_sample:.0f} B per sample + {m.fixed_bytes:.0f} B fixed"
                 + (f", capped at b_limit={b_limit}" if cap == b_limit else ""))


def measured_profile(gpu: str, m: ComputeMeasurement, *, memory_gb: float | None = None,
                     b_limit: int = DEFAULT_B_LIMIT) -> ComputeProfile:
    """The measured profile stored under GPU type ``gpu``."""
    gpu = _gpus.normalize(gpu)
    if m.max_b is not None:
        cap, how = m.max_b, m.max_b_how
    else:
        cap, how = catalog_cap(gpu, m, memory_gb, b_limit)
    pts = [(b, t) for b, t in zip(m.b, m.t) if b <= cap]
    if not pts:
        raise ConfigError(f"{gpu}: no measured micro-batch size {m.b} fits max_b={cap}; "
                          f"measure sizes <= {cap}")
    src = (f"measured on {m.device} ({m.threads} threads): median forward+backward per micro-batch; "
           f"max_b={cap}: {how}")
    return ComputeProfile(gpu=gpu, b=[p[0] for p in pts], t=[p[1] for p in pts], update_s=m.update_s,
                          max_b=cap, emulated=False, source=src)
