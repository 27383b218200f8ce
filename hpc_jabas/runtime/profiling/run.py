"""The whole run (what ``hpc-jabas profile`` does): every rank's compute turn, the allreduce, rank 0 writes."""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from hpc_jabas.core import gpus as _gpus
from hpc_jabas.core.perfmodel import (
    ALLREDUCE_FILE,
    EMU_BASE_S,
    EMU_PER_SAMPLE_S,
    AllreduceModel,
    ComputeProfile,
    PerfModel,
)
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.profiling.allreduce import fit_allreduce, measure_allreduce
from hpc_jabas.runtime.profiling.compute import ComputeMeasurement, check_b_list, measure_compute, measured_profile
from hpc_jabas.runtime.profiling.defaults import DEFAULT_ALLREDUCE_SIZES, DEFAULT_B_LIMIT, DEFAULT_B_LIST
from hpc_jabas.runtime.profiling.emulated import emulated_profile, measure_emulation_overhead
from hpc_jabas.runtime.profiling.load import grad_bytes, load_model, resolve_device


def world_size() -> int:
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
                base_s: float = EMU_BASE_S, per_sample_s: float = EMU_PER_SAMPLE_S,
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
    log = log or get_logger(__name__).info
    bundle = load_model(model_spec)            # every rank: the same errors everywhere
    types = parse_types(gpu_types)
    bl = check_b_list(b_list)
    if memory_gb is not None and not (memory_gb > 0 and math.isfinite(memory_gb)):
        raise ConfigError(f"--memory-gb {memory_gb!r} must be > 0")
    if overlap is not None and not 0 <= overlap <= 1:
        raise ConfigError(f"--overlap {overlap!r} must be in [0, 1]")
    world = world_size()
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
            dev = resolve_device(device)
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
    ovl = overlap if overlap is not None else (old.overlap if old else 0.0)
    model = PerfModel(profs, ar, gb, ovl)
    written = model.save(out_dir)
    return ProfileResult(model, written, notes, samples, rank)


def _existing(out_dir: str) -> PerfModel | None:
    if not os.path.isfile(os.path.join(out_dir, ALLREDUCE_FILE)):
        return None
    try:
        return PerfModel.load(out_dir)
    except ConfigError as e:
        raise ConfigError(f"--out {out_dir!r} holds an unreadable profile ({e}); use an empty directory") from None
