"""Memory: the largest micro-batch that fits (probed on CUDA, estimated from saved activations on the CPU)."""
from __future__ import annotations

import gc
from collections.abc import Callable

import torch

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.profiling.timing import Runner
from hpc_jabas.runtime.step import to_device


def saved_bytes(runner: Runner, b: int) -> int:
    """Bytes of the distinct storages autograd saves for backward, plus the input, at b."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            st = t.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        except Exception:           # pragma: no cover - exotic tensor subclasses
            seen[id(t)] = t.numel() * t.element_size()
        return t

    batch = to_device(runner.batch(b), runner.device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = runner.forward(runner.model, batch)
    loss.backward()
    runner.opt.zero_grad(set_to_none=False)
    params = {p.untyped_storage().data_ptr() for p in runner.model.parameters()}
    act = sum(v for k, v in seen.items() if k not in params)
    return act + sum(t.numel() * t.element_size() for t in batch)


def estimate_bytes(runner: Runner, optimizer: str, b1: int = 8, b2: int = 64) -> tuple[float, float]:
    """(bytes per sample, fixed bytes): the growth of saved activations + input between b1 and
    b2, and parameters x (weights + gradients + optimizer state slots)."""
    s1, s2 = saved_bytes(runner, b1), saved_bytes(runner, b2)
    per = max((s2 - s1) / (b2 - b1), 1.0)
    pbytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    slots = {"sgd": 1, "adam": 2}[optimizer]
    return per, float(pbytes * (2 + slots))


def max_b_from_memory(memory_bytes: float, per_sample: float, fixed: float, b_limit: int) -> int:
    """Largest b with fixed + b * per_sample <= memory_bytes, capped at b_limit (>= 1)."""
    room = memory_bytes - fixed
    if room < per_sample:
        raise ConfigError(f"memory {memory_bytes / 2**30:.3g} GiB holds no sample of this model "
                          f"(fixed {fixed / 2**30:.3g} GiB + {per_sample / 2**20:.3g} MiB per sample)")
    return max(1, min(int(room // per_sample), int(b_limit)))


def is_oom(e: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


def probe_max_b_cuda(runner: Runner, b_limit: int) -> tuple[int, dict[int, int], bool]:
    """Largest b whose micro-batch + update fit on the GPU: doubling to the first OOM (or
    b_limit), then bisection. Returns (max_b, {b: peak bytes}, hit_limit)."""
    dev = runner.device
    peaks: dict[int, int] = {}

    def fits(b: int) -> bool:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        try:
            runner.micro(runner.batch(b))
            runner.update()
            torch.cuda.synchronize(dev)
            peaks[b] = int(torch.cuda.max_memory_allocated(dev))
            return True
        except Exception as e:  # noqa: BLE001 - only OOM is expected
            if not is_oom(e):
                raise
        # outside the except block: the traceback (and the tensors its frames hold) is gone
        runner.opt.zero_grad(set_to_none=True)
        gc.collect()
        torch.cuda.empty_cache()
        return False

    good, hit = search_max_b(fits, b_limit)
    return good, peaks, hit


def search_max_b(fits: Callable[[int], bool], b_limit: int) -> tuple[int, bool]:
    """Largest b in [1, b_limit] with fits(b), assuming fits is monotone (True up to the cap):
    doubling from 1 to the first failure, then bisection. Returns (max_b, stopped at b_limit)."""
    if not fits(1):
        raise ConfigError("not even a micro-batch of 1 sample fits in this GPU's memory")
    good, bad = 1, None
    while bad is None and good < b_limit:
        b = min(good * 2, b_limit)
        if fits(b):
            good = b
        else:
            bad = b
    if bad is None:
        return good, True
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good, False
