"""Emulated GPU types: their profiles (the emulator's formula, checked against the CPU measurement)
and the emulator's measured overhead on this CPU."""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from hpc_jabas.core.config import gpus as _gpus
from hpc_jabas.core.perf.perfmodel import (
    EMU_BASE_S,
    EMU_MEM_SAMPLES_PER_GB,
    EMU_PER_SAMPLE_S,
    ComputeProfile,
    emulated_time,
)
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.emulate import Emulator
from hpc_jabas.runtime.profiling.compute import ComputeMeasurement, catalog_cap, check_b_list
from hpc_jabas.runtime.profiling.defaults import DEFAULT_B_LIMIT, DEFAULT_B_LIST
from hpc_jabas.runtime.profiling.load import ModelBundle
from hpc_jabas.runtime.profiling.timing import Runner


def emu_speed(info: _gpus.GpuType, speed: float | None) -> float:
    sp = info.relative_speed if speed is None else float(speed)
    if not (sp > 0 and math.isfinite(sp)):
        raise ConfigError(f"emulated speed {speed!r} must be > 0")
    return sp


def check_emu_times(base_s: float, per_sample_s: float) -> None:
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


def measure_emulation_overhead(bundle: ModelBundle, gpu: str, *, base_s: float = EMU_BASE_S,
                               per_sample_s: float = EMU_PER_SAMPLE_S, speed: float | None = None,
                               b_list: Iterable[int] = (4, 16, 64), warmup: int = 2, repeats: int = 10,
                               optimizer: str = "sgd") -> EmulationOverhead:
    """Run emulated micro-batches of type ``gpu`` back to back on the CPU as the Trainer does
    (take the samples, the micro-batch step, then ``Emulator.wait_until`` the target)
    and time each from its start to the next one's start; the sizes take turns, so that a burst
    of load elsewhere does not fall on one size only. The excess over the formula (median over
    every micro-batch) is the sleep overshoot plus the loop's own work, which the emulator does
    not hide."""
    info = _gpus.get(gpu)
    sp = emu_speed(info, speed)
    check_emu_times(base_s, per_sample_s)
    emu = Emulator(info.key, speed=sp, base_s=base_s, per_sample_s=per_sample_s, allow_cuda=True,
                   log=lambda m: None)
    runner = Runner(bundle, torch.device("cpu"), optimizer)
    bl = check_b_list(b_list)
    batches = {b: runner.batch(b) for b in bl}
    seq = [b for _ in range(warmup + repeats) for b in bl]      # the sizes take turns
    starts = []
    for b in seq + [bl[0]]:
        t0 = time.perf_counter()
        starts.append(t0)
        runner.micro(batches[b])
        emu.wait_until(t0, b)
    ex: dict[int, list[float]] = {b: [] for b in bl}
    for k, b in enumerate(seq):
        if k >= warmup * len(bl):
            ex[b].append(starts[k + 1] - starts[k] - emu.target(b))
    per_b = {b: statistics.median(v) for b, v in ex.items()}
    every = [x for v in ex.values() for x in v]
    runner.close()
    return EmulationOverhead(info.key, max(statistics.median(every), 0.0), per_b, torch.get_num_threads(), every)


def emulated_profile(gpu: str, m: ComputeMeasurement | None = None, *, base_s: float = EMU_BASE_S,
                     per_sample_s: float = EMU_PER_SAMPLE_S, speed: float | None = None,
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
    sp = emu_speed(info, speed)
    check_emu_times(base_s, per_sample_s)
    d = 0.0
    if overhead is not None:
        if _gpus.normalize(overhead.gpu) != info.key:
            raise ConfigError(f"emulation overhead measured for {overhead.gpu}, not {info.key}")
        d = float(overhead.overhead_s)
    how_speed = "catalog FP32 speed vs V100" if speed is None else "given speed"
    if m is not None:
        cap, how = catalog_cap(info.key, m, memory_gb, b_limit)
        bs = [b for b in m.b if b <= cap] or [min(m.b)]
        cpu = dict(zip(m.b, m.t))
        upd = m.update_s if update_s is None else float(update_s)
        meas = f"CPU measurement on {m.device} ({m.threads} threads)"
    else:
        mem = info.memory_gb if memory_gb is None else float(memory_gb)
        cap = max(1, min(int(mem * EMU_MEM_SAMPLES_PER_GB), b_limit))
        how = f"{mem:g} GiB x {EMU_MEM_SAMPLES_PER_GB:g} samples/GiB (no measurement)"
        bs = [b for b in check_b_list(b_list or DEFAULT_B_LIST) if b <= cap] or [1]
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
