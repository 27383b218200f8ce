"""The whole run (what ``hpc-jabas profile`` does): every rank's compute turn, the allreduce, rank 0 writes."""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hpc_jabas.core.config import gpus as _gpus
from hpc_jabas.core.perf.perfmodel import (
    ALLREDUCE_FILE,
    EMU_BASE_S,
    EMU_PER_SAMPLE_S,
    AllreduceModel,
    ComputeProfile,
    PerfModel,
)
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.comm import launchers
from hpc_jabas.runtime.profiling.allreduce import fit_allreduce, measure_allreduce
from hpc_jabas.runtime.profiling.compute import ComputeMeasurement, check_b_list, measure_compute, measured_profile
from hpc_jabas.runtime.profiling.defaults import DEFAULT_ALLREDUCE_SIZES, DEFAULT_B_LIMIT, DEFAULT_B_LIST
from hpc_jabas.runtime.profiling.emulated import emulated_profile, measure_emulation_overhead
from hpc_jabas.runtime.profiling.load import grad_bytes, load_model, resolve_device


def world_size() -> int:
    """The ranks the launcher started (runtime/comm/launchers.py; 1 without one)."""
    return launchers.detect().world_size


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


@dataclass(frozen=True)
class ProfileSettings:
    """What ``hpc-jabas profile`` measures and how (its flags): :func:`run_profile`'s parameters."""

    gpu_types: str | Sequence[str] | None = None      # the type(s) to store the measurement under
    emulate: bool = False                              # emulated GPU types on this CPU (needs gpu_types)
    b_list: Iterable[int] = DEFAULT_B_LIST             # micro-batch sizes to time
    warmup: int = 3
    repeats: int = 10
    optimizer: str = "sgd"
    memory_gb: float | None = None                     # memory limit of the cap search (CPU)
    b_limit: int = DEFAULT_B_LIMIT
    device: str | None = None
    base_s: float = EMU_BASE_S                         # the emulation formula (base_s + per_sample_s * b) / speed
    per_sample_s: float = EMU_PER_SAMPLE_S
    speed: float | None = None
    allreduce_sizes: Iterable[int] | None = None
    allreduce_repeats: int = 10
    overlap: float | None = None                       # None: the one already in the directory, else 0
    emulation_overhead: bool = False                   # add the emulator's measured excess (with emulate)

    def check(self) -> tuple[list[str], list[int]]:
        """The GPU types and micro-batch sizes; ConfigError naming a bad flag."""
        types = parse_types(self.gpu_types)
        bl = check_b_list(self.b_list)
        if self.memory_gb is not None and not (self.memory_gb > 0 and math.isfinite(self.memory_gb)):
            raise ConfigError(f"--memory-gb {self.memory_gb!r} must be > 0")
        if self.overlap is not None and not 0 <= self.overlap <= 1:
            raise ConfigError(f"--overlap {self.overlap!r} must be in [0, 1]")
        if self.emulate and not types:
            raise ConfigError("--emulate needs --gpu-type TYPE[,TYPE...] (the emulated GPU types)")
        if self.emulation_overhead and not self.emulate:
            raise ConfigError("--emulation-overhead applies to --emulate only")
        return types, bl


@dataclass
class _World:
    """Who measures what: the world of ranks (comm None: one process), this rank's device and the GPU
    types it measures (the lowest rank of each type)."""

    comm: Any
    rank: int
    size: int
    device: str
    mine: list[str]


def run_profile(model_spec: str, out_dir: str, settings: ProfileSettings | None = None, *,
                log: Callable[[str], None] | None = None) -> ProfileResult:
    """Profile ``model_spec`` and write ``<gpu>.json`` + ``allreduce.json`` into ``out_dir``.

    Single process: measures compute on this device. Under mpirun / horovodrun with N >= 2 ranks:
    the lowest rank of every GPU type measures it (ranks take turns, so that ranks sharing a node
    do not disturb each other), every rank joins the allreduce measurement, rank 0 writes.
    Profiles of other GPU types already in ``out_dir`` are kept; so is its allreduce fit when
    this run measures none (one rank). ``settings.emulation_overhead`` (with ``emulate``): also run the
    emulator on this CPU and add its measured per-micro-batch excess to the profiles (see
    :func:`measure_emulation_overhead`).
    """
    s = settings or ProfileSettings()
    log = log or get_logger(__name__).info
    bundle = load_model(model_spec)            # every rank: the same errors everywhere
    types, bl = s.check()
    w = _join(s, types)
    profiles = _measure_turns(bundle, s, bl, w, log)
    gb = grad_bytes(bundle.model)
    samples: list[tuple[int, int, float]] = []
    if w.comm:
        sizes = sorted(set(s.allreduce_sizes or DEFAULT_ALLREDUCE_SIZES) | {max(4, gb)})
        samples = measure_allreduce(sizes, repeats=s.allreduce_repeats, device=w.device)
        profiles = [p for part in w.comm.allgather_object(profiles, name="hj.prof.profiles") for p in part]
    if w.rank != 0:
        return ProfileResult(None, [], [], samples, w.rank)  # type: ignore[arg-type]
    return _write(out_dir, profiles, samples, w.size, gb, s.overlap)


def _join(s: ProfileSettings, types: list[str]) -> _World:
    """Join the ranks' world through the backend (when started as N >= 2 ranks); pick this rank's device, types."""
    world, comm, rank = world_size(), None, 0
    if world > 1:
        from hpc_jabas.runtime.comm import seam as _comm
        comm = _comm
        comm.init()
        rank, world = comm.rank(), comm.size()
    if s.emulate:
        return _World(comm, rank, world, "cpu", list(dict.fromkeys(types)) if rank == 0 else [])
    if comm is not None and s.device in (None, "auto") and torch.cuda.is_available():
        dev = comm.device()                    # one GPU per local rank
    else:
        dev = resolve_device(s.device)
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
    return _World(comm, rank, world, str(dev), [t] if every.index(t) == rank else [])


def _measure_turns(bundle: Any, s: ProfileSettings, bl: list[int], w: _World,
                   log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Ranks take turns: the one whose turn it is measures its types (profiles as dicts), the others wait."""
    profiles: list[dict[str, Any]] = []
    for turn in range(w.size):
        if turn == w.rank and w.mine:
            meas = measure_compute(bundle, bl, device=w.device, warmup=s.warmup, repeats=s.repeats,
                                   optimizer=s.optimizer, memory_gb=s.memory_gb, b_limit=s.b_limit, log=log)
            profiles += [_profile(bundle, g, meas, s, log).to_dict() for g in w.mine]
        if w.comm:
            w.comm.allgather_object(None, name=f"hj.prof.turn.{turn}")
    return profiles


def _profile(bundle: Any, g: str, meas: ComputeMeasurement, s: ProfileSettings,
             log: Callable[[str], None]) -> ComputeProfile:
    """The profile of GPU type g from this rank's measurement (emulated: the formula, checked against it)."""
    if not s.emulate:
        return measured_profile(g, meas, memory_gb=s.memory_gb, b_limit=s.b_limit)
    ov = None
    if s.emulation_overhead:
        ov = measure_emulation_overhead(bundle, g, base_s=s.base_s, per_sample_s=s.per_sample_s,
                                        speed=s.speed, optimizer=s.optimizer)
        log(f"hpc-jabas profile: emulated {g}: {ov.overhead_s * 1e3:.3f} ms per micro-batch beyond the formula")
    return emulated_profile(g, meas, base_s=s.base_s, per_sample_s=s.per_sample_s, speed=s.speed,
                            memory_gb=s.memory_gb, b_limit=s.b_limit, overhead=ov)


def _write(out_dir: str, profiles: list[dict[str, Any]], samples: list[tuple[int, int, float]], world: int,
           gb: int, overlap: float | None) -> ProfileResult:
    """Rank 0: merge the profiles into those already in ``out_dir``, fit (or keep) the allreduce, write."""
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
        if ar.a > 0:
            notes.append(f"allreduce fitted from {len(samples)} sizes over {world} ranks: "
                         f"{ar.c * 1e3:.3f} ms + ideal at {ar.bandwidth / 1e9:.3f} GB/s effective")
        else:       # the larger messages took no longer than the smaller ones: no bandwidth in what was measured
            notes.append(f"allreduce fitted from {len(samples)} sizes over {world} ranks: {ar.c * 1e3:.3f} ms "
                         f"whatever the size (sizes {min(n for n, _, _ in samples)}-{max(n for n, _, _ in samples)} "
                         "B took no longer as they grew); no bandwidth measured: give larger --allreduce-sizes")
    elif old is not None:
        ar = old.allreduce
        notes.append(f"allreduce not measured (1 rank); kept the fit already in {out_dir}")
    else:
        ar = AllreduceModel()
        notes.append("allreduce not measured (1 rank): wrote the default model (10 GB/s, no latency); "
                     "run under mpirun -np N (N >= 2) to measure it")
    ovl = overlap if overlap is not None else (old.overlap if old else 0.0)
    model = PerfModel(profs, ar, gb, ovl)
    written = model.save(out_dir)
    return ProfileResult(model, written, notes, samples, 0)


def _existing(out_dir: str) -> PerfModel | None:
    if not os.path.isfile(os.path.join(out_dir, ALLREDUCE_FILE)):
        return None
    from hpc_jabas.trust import check_profile_dir
    check_profile_dir(out_dir)             # merged into the new profile: refused when others can write it
    try:
        return PerfModel.load(out_dir)
    except ConfigError as e:
        raise ConfigError(f"--out {out_dir!r} holds an unreadable profile ({e}); use an empty directory") from None
