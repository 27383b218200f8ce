"""Profiler: measure what the perf model (perfmodel.py) needs, for one model on this device.

For a model given as ``module:callable`` (returning ``(model, loss_fn, sample_batch)``, see
examples/models.py) the profiler measures, on the current device:

* **micro-batch time** t(b) for a list of micro-batch sizes b: what the Trainer does per
  micro-batch - take b samples, move them to the device, forward, ``(loss * b).backward()``
  (gradients accumulate), read the loss - after ``warmup`` untimed runs, the median of
  ``repeats`` timed runs. Timed with CUDA events on a GPU, ``time.perf_counter`` on the CPU.
* **update time** ``update_s``: ``zero_grad`` + ``optimizer.step()`` (median, same way);
* **memory cap** ``max_b``: on CUDA by probing - double b until an out-of-memory error (or the
  probe limit), then bisect - with ``torch.cuda.max_memory_allocated`` giving the bytes per
  sample; on the CPU from a memory limit (``memory_gb``, else the catalog memory of the GPU
  type) and *estimated* bytes: per sample = growth of the tensors autograd saves for backward
  (measured at two sizes) + the input; fixed = parameters x (weights, gradients, optimizer
  state). Both are capped at ``b_limit``;
* **gradient size** ``grad_bytes``: bytes of the parameters that require gradients;
* **allreduce** (only inside a Horovod world of >= 2 ranks): seconds of an ``op=Sum``
  allreduce of several message sizes (after a tiny allreduce as barrier; per repeat the
  slowest rank; median over repeats), fitted by :meth:`AllreduceModel.fit`. The fitted
  ``bandwidth`` is rescaled so that ``a == 1``: it is then the measured effective bytes/s.

Emulated GPU types (``emulate=True``): a CPU rank that emulates type T runs the real compute and
then sleeps until t(b) = (base_s + per_sample_s * b) / speed (emulate.py), so T's profile is that
formula (``emulated=True``, ``formula`` set, ``source`` says so) as long as the CPU compute
measured here stays below it; where it does not (the emulator overruns) the profile keeps the
larger measured time at those b and drops the formula, and the source says so. ``update_s`` is
the optimizer step measured on this CPU (the emulator does not slow it down); ``max_b`` comes
from T's catalog memory and the bytes per sample estimated here.

Only the allreduce part touches Horovod (``comm`` is imported lazily there).
"""
from __future__ import annotations

import gc
import importlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hpc_jabas.core import gpus as _gpus
from hpc_jabas.core.perfmodel import EMU_BANDWIDTH, AllreduceModel, ComputeProfile, PerfModel, emulated_time
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.emulate import DEFAULT_BASE_S, DEFAULT_PER_SAMPLE_S

DEFAULT_B_LIST = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_B_LIMIT = 4096          # largest micro-batch the memory probe / estimate reports
DEFAULT_ALLREDUCE_SIZES = (4 << 10, 64 << 10, 1 << 20, 8 << 20)
OPTIMIZERS = ("sgd", "adam")


# ---------------------------------------------------------------------------------------------
# the model under test
# ---------------------------------------------------------------------------------------------

@dataclass
class ModelBundle:
    """What a model callable returns, checked."""
    model: torch.nn.Module
    loss_fn: Callable
    sample: tuple[torch.Tensor, ...]
    spec: str = ""

    @property
    def n_samples(self) -> int:
        return int(self.sample[0].shape[0])


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


def load_model(spec: str) -> ModelBundle:
    """Import ``module:callable`` (the current directory is importable, as with ``python -m``),
    call it, and check that it returned (nn.Module, loss_fn, (x, y, ...)). Any problem is one
    ConfigError line."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ConfigError(f"model {spec!r} must be MODULE:CALLABLE, e.g. examples.models:digits_mlp")
    mod_name, attr = spec.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:
        raise ConfigError(f"model {spec!r}: cannot import module {mod_name!r} ({_one_line(e)}); "
                          "give an importable MODULE:CALLABLE, e.g. examples.models:digits_mlp") from None
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"model {spec!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"model {spec!r}: {attr!r} is a {type(obj).__name__}, not a callable")
    try:
        out = obj()
    except Exception as e:
        raise ConfigError(f"model {spec!r}: calling {attr}() failed ({_one_line(e)})") from None
    return check_bundle(out, spec)


def check_bundle(out: Any, spec: str = "model") -> ModelBundle:
    want = "it must return (model, loss_fn, sample_batch)"
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise ConfigError(f"{spec}: returned a {type(out).__name__}; {want}")
    model, loss_fn, sample = out
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{spec}: model is a {type(model).__name__}, not a torch.nn.Module; {want}")
    if not callable(loss_fn):
        raise ConfigError(f"{spec}: loss_fn is a {type(loss_fn).__name__}, not callable; {want}")
    if isinstance(sample, torch.Tensor) or not isinstance(sample, (tuple, list)) or len(sample) < 2 \
            or not all(isinstance(t, torch.Tensor) for t in sample):
        raise ConfigError(f"{spec}: sample_batch must be a tuple (x, y) of tensors; {want}")
    n = {int(t.shape[0]) if t.dim() else 0 for t in sample}
    if len(n) != 1 or min(n) < 1:
        raise ConfigError(f"{spec}: the sample_batch tensors must share a first dimension >= 1 "
                          f"(got sizes {sorted(n)})")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"{spec}: the model has no parameter that requires a gradient")
    return ModelBundle(model, loss_fn, tuple(sample), spec)


def grad_bytes(model: torch.nn.Module) -> int:
    """Bytes of the gradients the allreduce moves (parameters that require a gradient)."""
    return int(sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad))


def _index(n: int, b: int) -> torch.Tensor:
    return torch.arange(b, dtype=torch.long) % n


def make_batch(sample: Sequence[torch.Tensor], b: int) -> tuple[torch.Tensor, ...]:
    """A micro-batch of b samples, cycling through the sample batch."""
    idx = _index(int(sample[0].shape[0]), b)
    return tuple(t[idx] for t in sample)


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    raise ConfigError(f"optimizer {name!r} is unknown; valid: {', '.join(OPTIMIZERS)}")


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------

class _Timer:
    """perf_counter on the CPU, CUDA events on a GPU (start/stop -> seconds)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._a = torch.cuda.Event(enable_timing=True)
            self._b = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self.cuda:
            self._a.record()
        else:
            self._t = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self._b.record()
            self._b.synchronize()
            return self._a.elapsed_time(self._b) / 1e3
        return time.perf_counter() - self._t


class _Runner:
    """One micro-batch exactly as the Trainer runs it, on a device."""

    def __init__(self, bundle: ModelBundle, device: torch.device, optimizer: str):
        self.device = device
        self.model = bundle.model.to(device)
        self.model.train()
        self.loss_fn = bundle.loss_fn
        self.sample = bundle.sample              # stays on the host, like a dataset
        self.opt = make_optimizer(optimizer, [p for p in self.model.parameters() if p.requires_grad])

    def micro(self, idx: torch.Tensor) -> float:
        batch = tuple(t[idx].to(self.device, non_blocking=True) for t in self.sample)
        loss = self.loss_fn(self.model(batch[0]), batch[1])
        (loss * float(len(idx))).backward()
        return float(loss.detach())

    def update(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)


def time_micro(runner: _Runner, b: int, warmup: int, repeats: int) -> tuple[float, list[float]]:
    """Median seconds of one micro-batch of b (forward + backward + accumulate), and all repeats."""
    timer = _Timer(runner.device)
    idx = _index(int(runner.sample[0].shape[0]), b)
    out = []
    for i in range(warmup + repeats):
        timer.start()
        runner.micro(idx)
        dt = timer.stop()
        if i >= warmup:
            out.append(dt)
    runner.opt.zero_grad(set_to_none=False)
    return statistics.median(out), out


def time_update(runner: _Runner, warmup: int, repeats: int) -> float:
    """Median seconds of optimizer.step() + zero_grad()."""
    timer = _Timer(runner.device)
    idx = _index(int(runner.sample[0].shape[0]), 1)
    runner.micro(idx)                     # gradients (and optimizer state) exist
    out = []
    for i in range(warmup + repeats):
        timer.start()
        runner.update()
        dt = timer.stop()
        if i >= warmup:
            out.append(dt)
    return statistics.median(out)


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------

def _saved_bytes(runner: _Runner, b: int) -> int:
    """Bytes of the distinct storages autograd saves for backward, plus the input, at b."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        try:
            st = t.untyped_storage()
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        except Exception:           # pragma: no cover - exotic tensor subclasses
            seen[id(t)] = t.numel() * t.element_size()
        return t

    idx = _index(int(runner.sample[0].shape[0]), b)
    batch = tuple(t[idx].to(runner.device) for t in runner.sample)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = runner.loss_fn(runner.model(batch[0]), batch[1])
    loss.backward()
    runner.opt.zero_grad(set_to_none=False)
    params = {p.untyped_storage().data_ptr() for p in runner.model.parameters()}
    act = sum(v for k, v in seen.items() if k not in params)
    return act + sum(t.numel() * t.element_size() for t in batch)


def estimate_bytes(runner: _Runner, optimizer: str, b1: int = 8, b2: int = 64) -> tuple[float, float]:
    """(bytes per sample, fixed bytes): the growth of saved activations + input between b1 and
    b2, and parameters x (weights + gradients + optimizer state slots)."""
    s1, s2 = _saved_bytes(runner, b1), _saved_bytes(runner, b2)
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


def _is_oom(e: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


def probe_max_b_cuda(runner: _Runner, b_limit: int) -> tuple[int, dict[int, int], bool]:
    """Largest b whose micro-batch + update fit on the GPU: doubling to the first OOM (or
    b_limit), then bisection. Returns (max_b, {b: peak bytes}, hit_limit)."""
    dev = runner.device
    peaks: dict[int, int] = {}

    def fits(b: int) -> bool:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        try:
            runner.micro(_index(int(runner.sample[0].shape[0]), b))
            runner.update()
            torch.cuda.synchronize(dev)
            peaks[b] = int(torch.cuda.max_memory_allocated(dev))
            return True
        except Exception as e:  # noqa: BLE001 - only OOM is expected
            if not _is_oom(e):
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


# ---------------------------------------------------------------------------------------------
# compute measurement -> profiles
# ---------------------------------------------------------------------------------------------

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

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _check_b_list(b_list: Iterable[int]) -> list[int]:
    try:
        bl = sorted({int(b) for b in b_list})
    except (TypeError, ValueError):
        raise ConfigError(f"micro-batch sizes {b_list!r} must be integers >= 1, e.g. 1,2,4,8") from None
    if not bl or bl[0] < 1:
        raise ConfigError(f"micro-batch sizes {bl} must be integers >= 1, e.g. 1,2,4,8")
    return bl


def _device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device {name!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available here; use cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {name!r}: only cpu and cuda are supported")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


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
    bl = _check_b_list(b_list)
    if warmup < 0 or repeats < 1:
        raise ConfigError(f"warmup={warmup} must be >= 0 and repeats={repeats} >= 1")
    if b_limit < 1:
        raise ConfigError(f"b_limit={b_limit} must be >= 1")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer {optimizer!r} is unknown; valid: {', '.join(OPTIMIZERS)}")
    dev = _device(device)
    runner = _Runner(bundle, dev, optimizer)
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
    update_s = time_update(runner, warmup, repeats)
    ts, reps = [], []
    for b in todo:
        med, all_ = time_micro(runner, b, warmup, repeats)
        ts.append(med)
        reps.append(all_)
        log(f"hpc-jabas profile: {dev.type} b={b:<5d} t={med * 1e3:9.3f} ms (median of {repeats})")
    runner.opt.zero_grad(set_to_none=True)
    return ComputeMeasurement(device=str(dev) if dev.type == "cpu" else f"{dev} ({torch.cuda.get_device_name(dev)})",
                              b=todo, t=ts, update_s=update_s, grad_bytes=gb, bytes_per_sample=per,
                              fixed_bytes=fixed, max_b=max_b, max_b_how=how, threads=torch.get_num_threads(),
                              repeats=reps)


def _catalog_cap(gpu: str, m: ComputeMeasurement, memory_gb: float | None, b_limit: int) -> tuple[int, str]:
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
        cap, how = _catalog_cap(gpu, m, memory_gb, b_limit)
    pts = [(b, t) for b, t in zip(m.b, m.t) if b <= cap]
    if not pts:
        raise ConfigError(f"{gpu}: no measured micro-batch size {m.b} fits max_b={cap}; "
                          f"measure sizes <= {cap}")
    src = (f"measured on {m.device} ({m.threads} threads): median forward+backward per micro-batch; "
           f"max_b={cap}: {how}")
    return ComputeProfile(gpu=gpu, b=[p[0] for p in pts], t=[p[1] for p in pts], update_s=m.update_s,
                          max_b=cap, emulated=False, source=src)


def _emu_speed(info: _gpus.GpuType, speed: float | None) -> float:
    sp = info.relative_speed if speed is None else float(speed)
    if not (sp > 0 and math.isfinite(sp)):
        raise ConfigError(f"emulated speed {speed!r} must be > 0")
    return sp


def _check_emu_times(base_s: float, per_sample_s: float) -> None:
    if not (base_s >= 0 and per_sample_s >= 0 and base_s + per_sample_s > 0):
        raise ConfigError(f"emulation times base_s={base_s}, per_sample_s={per_sample_s} must be >= 0, not both 0")


@dataclass
class EmulationOverhead:
    """What an emulated micro-batch really takes on this CPU beyond the formula."""
    gpu: str
    overhead_s: float                      # median over every (b, repeat) of actual - target
    per_b: dict[int, float]                # b -> median excess (s)
    threads: int
    excess: list[float] = field(default_factory=list)   # every timed micro-batch's excess (s)


def measure_emulation_overhead(bundle: ModelBundle, gpu: str, *, base_s: float = DEFAULT_BASE_S,
                               per_sample_s: float = DEFAULT_PER_SAMPLE_S, speed: float | None = None,
                               b_list: Iterable[int] = (4, 16, 64), warmup: int = 2, repeats: int = 10,
                               optimizer: str = "sgd") -> EmulationOverhead:
    """Run emulated micro-batches of type ``gpu`` back to back on the CPU as the Trainer does
    (take the samples, forward, backward, read the loss, then ``Emulator.wait_until`` the target)
    and time each from its start to the next one's start; the sizes take turns, so that a burst
    of load elsewhere does not fall on one size only. The excess over the formula (median over
    every micro-batch) is the sleep overshoot plus the loop's own work, which the emulator does
    not hide."""
    from hpc_jabas.runtime.emulate import Emulator
    info = _gpus.get(gpu)
    sp = _emu_speed(info, speed)
    _check_emu_times(base_s, per_sample_s)
    emu = Emulator(info.key, speed=sp, base_s=base_s, per_sample_s=per_sample_s, allow_cuda=True,
                   log=lambda m: None)
    runner = _Runner(bundle, torch.device("cpu"), optimizer)
    bl = _check_b_list(b_list)
    idx = {b: _index(bundle.n_samples, b) for b in bl}
    seq = [b for _ in range(warmup + repeats) for b in bl]      # the sizes take turns
    starts = []
    for b in seq + [bl[0]]:
        t0 = time.perf_counter()
        starts.append(t0)
        runner.micro(idx[b])
        emu.wait_until(t0, b)
    ex: dict[int, list[float]] = {b: [] for b in bl}
    for k, b in enumerate(seq):
        if k >= warmup * len(bl):
            ex[b].append(starts[k + 1] - starts[k] - emu.target(b))
    per_b = {b: statistics.median(v) for b, v in ex.items()}
    every = [x for v in ex.values() for x in v]
    runner.opt.zero_grad(set_to_none=True)
    return EmulationOverhead(info.key, max(statistics.median(every), 0.0), per_b, torch.get_num_threads(), every)


def emulated_profile(gpu: str, m: ComputeMeasurement | None = None, *, base_s: float = DEFAULT_BASE_S,
                     per_sample_s: float = DEFAULT_PER_SAMPLE_S, speed: float | None = None,
                     b_list: Iterable[int] | None = None, update_s: float | None = None,
                     memory_gb: float | None = None, b_limit: int = DEFAULT_B_LIMIT,
                     overhead: EmulationOverhead | None = None) -> ComputeProfile:
    """Profile of emulated type ``gpu``: t(b) = (base_s + per_sample_s * b) / speed (emulate.py).

    ``m``: the CPU measurement of the model (its times show whether the emulator would overrun
    the formula; its update time and bytes per sample give update_s and max_b). Without it,
    ``b_list`` and ``update_s`` (default 0) are used and max_b comes from the catalog memory at
    16 samples per GiB (the PerfModel.emulated default).

    ``overhead`` (from :func:`measure_emulation_overhead`): the measured per-micro-batch excess
    d is added to every time - the formula's base_s becomes base_s + d * speed, so t(b) is
    formula(b) + d - and the source says so. Without it the profile is exactly the formula."""
    info = _gpus.get(gpu)
    sp = _emu_speed(info, speed)
    _check_emu_times(base_s, per_sample_s)
    d = 0.0
    if overhead is not None:
        if _gpus.normalize(overhead.gpu) != info.key:
            raise ConfigError(f"emulation overhead measured for {overhead.gpu}, not {info.key}")
        d = float(overhead.overhead_s)
    how_speed = "catalog FP32 speed vs V100" if speed is None else "given speed"
    if m is not None:
        cap, how = _catalog_cap(info.key, m, memory_gb, b_limit)
        bs = [b for b in m.b if b <= cap] or [min(m.b)]
        cpu = dict(zip(m.b, m.t))
        upd = m.update_s if update_s is None else float(update_s)
        meas = f"CPU measurement on {m.device} ({m.threads} threads)"
    else:
        from hpc_jabas.core.perfmodel import EMU_MEM_SAMPLES_PER_GB
        mem = info.memory_gb if memory_gb is None else float(memory_gb)
        cap = max(1, min(int(mem * EMU_MEM_SAMPLES_PER_GB), b_limit))
        how = f"{mem:g} GiB x {EMU_MEM_SAMPLES_PER_GB:g} samples/GiB (no measurement)"
        bs = [b for b in _check_b_list(b_list or DEFAULT_B_LIST) if b <= cap] or [1]
        cpu = {}
        upd = 0.0 if update_s is None else float(update_s)
        meas = "no CPU measurement"
    eff_base = float(base_s) + d * sp
    formula = {"base_s": eff_base, "per_sample_s": float(per_sample_s), "speed": sp}
    target = [emulated_time(b, eff_base, per_sample_s, sp) for b in bs]
    over = [b for b, tt in zip(bs, target) if cpu.get(b, 0.0) > tt]
    src = (f"emulated {info.key}: t(b) = ({base_s:g} + {per_sample_s:g} * b) / {sp:.4g} ({how_speed}); "
           f"update_s = optimizer step measured on the CPU; max_b={cap}: {how}; {meas}")
    if overhead is not None:
        src += (f"; plus a measured emulation overhead of {d * 1e3:.4g} ms per micro-batch (sleep overshoot "
                f"and loop work on this CPU, {overhead.threads} threads), i.e. formula base_s = "
                f"{base_s:g} + {d:.4g} * {sp:.4g}")
    if over:
        ts = [max(tt, cpu.get(b, 0.0)) for b, tt in zip(bs, target)]
        src += (f"; the CPU compute exceeds the emulated time at b={','.join(map(str, over))} (the emulator "
                "overruns there), so the profile holds the measured times and no exact formula")
        return ComputeProfile(gpu=info.key, b=bs, t=ts, update_s=upd, max_b=cap, emulated=True, source=src)
    return ComputeProfile(gpu=info.key, b=bs, t=target, update_s=upd, max_b=cap, emulated=True,
                          source=src, formula=formula)


# ---------------------------------------------------------------------------------------------
# allreduce
# ---------------------------------------------------------------------------------------------

def measure_allreduce(sizes: Iterable[int], *, warmup: int = 3, repeats: int = 10,
                      device: str | None = None) -> list[tuple[int, int, float]]:
    """(nbytes, N, seconds) per message size, over the current Horovod world (all ranks call).

    Each timed allreduce starts after a one-element allreduce (a barrier); its time is the
    slowest rank's; the result per size is the median over repeats. The sizes take turns
    within every repeat, so a burst of load elsewhere on the machine does not fall on one size
    only. Needs ``comm.init()`` done."""
    from hpc_jabas.runtime import comm
    dev = _device(device)
    N = comm.size()
    tick = torch.zeros(1, device=dev)
    sz = sorted({int(s) for s in sizes})
    if len(sz) < 2:
        raise ConfigError(f"allreduce sizes {sz}: give at least 2 different message sizes")
    for nbytes in sz:
        if nbytes < 4:
            raise ConfigError(f"allreduce message size {nbytes} B is below one float32 (4 B)")
    bufs = {nb: torch.ones(nb // 4, dtype=torch.float32, device=dev) for nb in sz}
    mine: dict[int, list[float]] = {nb: [] for nb in sz}
    for i in range(warmup + repeats):
        for nb in sz:
            comm.allreduce_sum(tick, name=f"hj.prof.bar.{nb}")
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            comm.allreduce_sum(bufs[nb], name=f"hj.prof.ar.{nb}")
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            dt = time.perf_counter() - t0
            if i >= warmup:
                mine[nb].append(dt)
    every = comm.allgather_object(mine, name="hj.prof.ar.times")
    out = []
    for nb in sz:
        slowest = [max(col) for col in zip(*(e[nb] for e in every))]
        out.append((4 * (nb // 4), N, statistics.median(slowest)))
    return out


def fit_allreduce(samples: Sequence[Sequence[float]]) -> AllreduceModel:
    """AllreduceModel.fit, with the bandwidth rescaled to the measured effective one (a == 1)."""
    m = AllreduceModel.fit(samples, bandwidth=EMU_BANDWIDTH)
    if m.a > 0:
        return AllreduceModel(1.0, m.c, EMU_BANDWIDTH / m.a)
    return m


# ---------------------------------------------------------------------------------------------
# the whole run (what `hpc-jabas profile` does)
# ---------------------------------------------------------------------------------------------

def _world() -> int:
    for k in ("OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        v = os.environ.get(k)
        if v and v.isdigit():
            return int(v)
    return 1


def parse_types(text: str | Sequence[str] | None) -> list[str]:
    if text is None:
        return []
    parts = text.split(",") if isinstance(text, str) else list(text)
    return [_gpus.normalize(p) for p in parts if str(p).strip()]


@dataclass
class ProfileResult:
    model: PerfModel
    written: list[str]
    notes: list[str]
    allreduce_samples: list[tuple[int, int, float]]
    rank: int = 0


def run_profile(model_spec: str, out_dir: str, *, gpu_types: str | Sequence[str] | None = None,
                emulate: bool = False, b_list: Iterable[int] = DEFAULT_B_LIST, warmup: int = 3,
                repeats: int = 10, optimizer: str = "sgd", memory_gb: float | None = None,
                b_limit: int = DEFAULT_B_LIMIT, device: str | None = None,
                base_s: float = DEFAULT_BASE_S, per_sample_s: float = DEFAULT_PER_SAMPLE_S,
                speed: float | None = None, allreduce_sizes: Iterable[int] | None = None,
                allreduce_repeats: int = 10, overlap: float | None = None,
                emulation_overhead: bool = False,
                log: Callable[[str], None] | None = None) -> ProfileResult:
    """Profile ``model_spec`` and write ``<gpu>.json`` + ``allreduce.json`` into ``out_dir``.

    Single process: measures compute on this device. Under mpirun / horovodrun with N >= 2 ranks:
    the lowest rank of every GPU type measures it (ranks take turns, so that ranks sharing a node
    do not disturb each other), every rank joins the allreduce measurement, rank 0 writes.
    Profiles of other GPU types already in ``out_dir`` are kept; so is its allreduce fit when
    this run measures none (one rank). ``emulation_overhead`` (with ``emulate``): also run the
    emulator on this CPU and add its measured per-micro-batch excess to the profiles (see
    :func:`measure_emulation_overhead`).
    """
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    bundle = load_model(model_spec)            # every rank: the same errors everywhere
    types = parse_types(gpu_types)
    bl = _check_b_list(b_list)
    if memory_gb is not None and not (memory_gb > 0 and math.isfinite(memory_gb)):
        raise ConfigError(f"--memory-gb {memory_gb!r} must be > 0")
    if overlap is not None and not 0 <= overlap <= 1:
        raise ConfigError(f"--overlap {overlap!r} must be in [0, 1]")
    world = _world()
    comm = None
    rank = 0
    if emulate and not types:
        raise ConfigError("--emulate needs --gpu-type TYPE[,TYPE...] (the emulated GPU types)")
    if emulation_overhead and not emulate:
        raise ConfigError("--emulation-overhead applies to --emulate only")
    if world > 1:
        from hpc_jabas.runtime import comm as _comm
        comm = _comm
        comm.init()
        rank, world = comm.rank(), comm.size()
    if emulate:
        dev_name = "cpu"
        mine = list(dict.fromkeys(types)) if rank == 0 else []
    else:
        if comm is not None and device in (None, "auto") and torch.cuda.is_available():
            dev = comm.device()                # one GPU per local rank
        else:
            dev = _device(device)
        if len(types) > 1 and len(types) != world:
            raise ConfigError(f"--gpu-type lists {len(types)} types for {world} rank(s); give one type, "
                              "or one per rank")
        if types:
            t = types[rank] if len(types) == world and len(types) > 1 else types[0]
        elif dev.type == "cuda":
            name = torch.cuda.get_device_name(dev)
            try:
                t = _gpus.normalize(name)
            except ConfigError:
                raise ConfigError(f"GPU {name!r} is not in the catalog; give --gpu-type with a known type "
                                  f"({', '.join(_gpus.known())})") from None
        else:
            raise ConfigError("no CUDA device here: give --gpu-type TYPE to store this CPU measurement under, "
                              "or --emulate --gpu-type TYPE for an emulated GPU type")
        every = comm.allgather_object(t, name="hj.prof.types") if comm else [t]
        mine = [t] if every.index(t) == rank else []
        dev_name = str(dev)

    profiles: list[dict] = []
    meas: ComputeMeasurement | None = None
    for turn in range(world):
        if turn == rank and mine:
            meas = measure_compute(bundle, bl, device=dev_name, warmup=warmup, repeats=repeats,
                                   optimizer=optimizer, memory_gb=memory_gb, b_limit=b_limit, log=log)
            for g in mine:
                if emulate:
                    ov = None
                    if emulation_overhead:
                        ov = measure_emulation_overhead(bundle, g, base_s=base_s, per_sample_s=per_sample_s,
                                                        speed=speed, optimizer=optimizer)
                        log(f"hpc-jabas profile: emulated {g}: {ov.overhead_s * 1e3:.3f} ms per micro-batch "
                            "beyond the formula")
                    p = emulated_profile(g, meas, base_s=base_s, per_sample_s=per_sample_s, speed=speed,
                                         memory_gb=memory_gb, b_limit=b_limit, overhead=ov)
                else:
                    p = measured_profile(g, meas, memory_gb=memory_gb, b_limit=b_limit)
                profiles.append(p.to_dict())
        if comm:
            comm.allgather_object(None, name=f"hj.prof.turn.{turn}")
    gb = grad_bytes(bundle.model)
    samples: list[tuple[int, int, float]] = []
    if comm:
        sizes = sorted(set(allreduce_sizes or DEFAULT_ALLREDUCE_SIZES) | {max(4, gb)})
        samples = measure_allreduce(sizes, repeats=allreduce_repeats,
                                    device=dev_name)
        profiles = [p for part in comm.allgather_object(profiles, name="hj.prof.profiles") for p in part]
    if rank != 0:
        return ProfileResult(None, [], [], samples, rank)  # type: ignore[arg-type]

    notes: list[str] = []
    old = _existing(out_dir)
    profs = dict(old.profiles) if old else {}
    for d in profiles:
        p = ComputeProfile.from_dict(d)
        if p.gpu in profs:
            notes.append(f"replaced the existing profile of {p.gpu} in {out_dir}")
        profs[p.gpu] = p
    if samples:
        ar = fit_allreduce(samples)
        notes.append(f"allreduce fitted from {len(samples)} sizes over {world} ranks: "
                     f"{ar.c * 1e3:.3f} ms + ideal at {ar.bandwidth / 1e9:.3f} GB/s effective")
    elif old is not None:
        ar = old.allreduce
        notes.append(f"allreduce not measured (1 rank); kept the fit already in {out_dir}")
    else:
        ar = AllreduceModel()
        notes.append("allreduce not measured (1 rank): wrote the default model (10 GB/s, no latency); "
                     "run under mpirun -np N (N >= 2) to measure it")
    ov = overlap if overlap is not None else (old.overlap if old else 0.0)
    model = PerfModel(profs, ar, gb, ov)
    written = model.save(out_dir)
    return ProfileResult(model, written, notes, samples, rank)


def _existing(out_dir: str) -> PerfModel | None:
    from hpc_jabas.core.perfmodel import ALLREDUCE_FILE
    if not os.path.isfile(os.path.join(out_dir, ALLREDUCE_FILE)):
        return None
    try:
        return PerfModel.load(out_dir)
    except ConfigError as e:
        raise ConfigError(f"--out {out_dir!r} holds an unreadable profile ({e}); use an empty directory") from None
