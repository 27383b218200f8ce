"""Performance model: micro-batch compute time per GPU type, allreduce time, iteration time of a plan.

Pure (plain Python + numpy): no torch, no horovod, no clock. The planner, the auto-scaler and the
simulator all price plans with this one model (docs/formulas.md, section 5).

The model follows IIDP/JABAS (docs/formulas.md, section 5):

* **Compute.** One :class:`ComputeProfile` per GPU type: measured seconds per micro-batch
  (forward + backward + gradient accumulation) at a few micro-batch sizes ``b``, interpolated
  piecewise-linearly in between; the optimizer step time ``update_s``; the memory cap ``max_b``
  (largest micro-batch that fits). Outside the measured range the time is extrapolated linearly
  from the two nearest points and the profile records that it did (``extrapolated(b)``,
  ``extrapolations()``), so a caller can say so instead of trusting it silently.
* **Allreduce.** :class:`AllreduceModel`: ``a * ideal + c`` with the ring-allreduce ideal
  ``2 (N-1)/N * bytes / bandwidth`` (0 when N == 1), fitted by least squares from measurements.
* **Iteration.** For a plan (b, n) on ranks with GPU types ``gpus``::

      T_iter = max_{i: n_i > 0} (n_i * t_micro(gpu_i, b) + update_s(gpu_i))
               + (1 - overlap) * allreduce(grad_bytes, N)

  A per-rank plan (b_i, n_i, x_i; planning/plan.py) prices rank i's n_i - 1 full micro-batches at
  t_micro(gpu_i, b_i) each and its last one at t_micro(gpu_i, r_i), r_i = x_i - (n_i - 1) b_i
  (``rank_time``).

  with N the number of ranks that run at least one micro-batch. ``overlap`` (0..1, default 0)
  is the share of the allreduce that Horovod hides behind the backward pass of the last
  micro-batch (gradients of late layers are reduced while early layers still compute). It is a
  flat fraction, not capped by the length of that backward pass: a fitted parameter, kept
  simple so that the allreduce tail depends on N only, which keeps the planner exact.

:class:`ComputeProfile` and :func:`emulated_time` live in compute_profile.py (re-exported here).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from hpc_jabas.core.config import gpus as _gpus
from hpc_jabas.core.config.defaults import EMU_BASE_S as EMU_BASE_S
from hpc_jabas.core.config.defaults import EMU_PER_SAMPLE_S as EMU_PER_SAMPLE_S
from hpc_jabas.core.config.textfile import read_json
from hpc_jabas.core.config.validate import integer, number
from hpc_jabas.core.perf.calibration import CALIBRATION_FILE, Calibration
from hpc_jabas.core.perf.compute_profile import FORMAT_VERSION as FORMAT_VERSION
from hpc_jabas.core.perf.compute_profile import ComputeProfile as ComputeProfile
from hpc_jabas.core.perf.compute_profile import check_version
from hpc_jabas.core.perf.compute_profile import emulated_time as emulated_time
from hpc_jabas.errors import ConfigError


class Plan(Protocol):
    """What the model prices of a plan (core/planning/plan.py's ``Plan`` has it): per rank a micro-batch size, a
    micro-batch count and a sample count. A protocol: planning/ sits above this package and imports it."""

    @property
    def world_size(self) -> int: ...
    @property
    def B(self) -> int: ...
    @property
    def bs(self) -> tuple[int, ...]: ...
    @property
    def n(self) -> tuple[int, ...]: ...
    @property
    def xs(self) -> tuple[int, ...]: ...


ALLREDUCE_FILE = "allreduce.json"

#: Defaults of :meth:`PerfModel.emulated` (also what ``hpc-jabas plan`` uses without --profile). EMU_BASE_S
#: and EMU_PER_SAMPLE_S (defined in core/config/defaults.py) are also the emulator's defaults (job keys
#: emulate_base_s, emulate_per_sample_s, ``hpc-jabas profile --emulate``).
EMU_B_LIST = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
EMU_GRAD_BYTES = 100e6        # ~ ResNet-50 fp32 gradients
EMU_BANDWIDTH = 10e9          # bytes/s of the allreduce links
EMU_MEM_SAMPLES_PER_GB = 16.0  # max_b = int(memory_gb * this): RTX 2060 (6 GB) 96, V100 (32 GB) 512


# ---------------------------------------------------------------------------------------------
# allreduce
# ---------------------------------------------------------------------------------------------

@dataclass
class AllreduceModel:
    """Allreduce seconds = a * ideal + c, ideal = 2 (N-1)/N * nbytes / bandwidth (0 for N == 1).

    ``a >= 0`` and ``c >= 0`` (enforced; :meth:`fit` solves a non-negative least squares), so the
    time never decreases with N, which the planner relies on when it may drop ranks.
    """

    a: float = 1.0
    c: float = 0.0
    bandwidth: float = EMU_BANDWIDTH

    def __post_init__(self) -> None:
        self.a = number(self.a, "allreduce a", lo=0.0)
        self.c = number(self.c, "allreduce c", lo=0.0)
        self.bandwidth = number(self.bandwidth, "allreduce bandwidth (bytes/s)", lo=0.0, lo_open=True)

    def ideal(self, nbytes: float, n: int) -> float:
        if n <= 1:
            return 0.0
        return 2.0 * (n - 1) / n * nbytes / self.bandwidth

    def time(self, nbytes: float, n: int) -> float:
        return self.a * self.ideal(nbytes, n) + self.c

    @classmethod
    def fit(cls, samples: Iterable[Sequence[float]], bandwidth: float = EMU_BANDWIDTH) -> AllreduceModel:
        """Least-squares fit of a, c >= 0 from (nbytes, N, seconds) measurements."""
        rows = [tuple(s) for s in samples]
        if any(len(r) != 3 for r in rows):
            raise ConfigError("allreduce samples must be (nbytes, N, seconds) triples")
        bw = number(bandwidth, "allreduce bandwidth (bytes/s)", lo=0.0, lo_open=True)
        probe = cls(1.0, 0.0, bw)
        x = np.array([probe.ideal(number(nb, "allreduce sample nbytes", lo=0.0),
                                  integer(n, "allreduce sample N", lo=1)) for nb, n, _ in rows], dtype=float)
        y = np.array([number(s, "allreduce sample seconds", lo=0.0) for _, _, s in rows], dtype=float)
        if len(np.unique(x)) < 2:
            raise ConfigError(f"allreduce fit needs samples at >= 2 different sizes or rank counts; "
                              f"got {len(rows)} sample(s) with {len(np.unique(x))} distinct ideal time(s)")
        # Non-negative least squares in two unknowns: the optimum is the unconstrained one if it is
        # feasible, otherwise it lies on a boundary (a = 0 or c = 0); compare all feasible ones.
        cands = []
        A = np.stack([x, np.ones_like(x)], axis=1)
        sol, *_ = np.linalg.lstsq(A, y, rcond=None)
        if sol[0] >= 0 and sol[1] >= 0:
            cands.append((float(sol[0]), float(sol[1])))
        cands.append((max(0.0, float(x @ y / (x @ x))), 0.0))
        cands.append((0.0, max(0.0, float(y.mean()))))
        best = min(cands, key=lambda ac: float(np.sum((ac[0] * x + ac[1] - y) ** 2)))
        return cls(best[0], best[1], bw)

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "c": self.c, "bandwidth": self.bandwidth}


# ---------------------------------------------------------------------------------------------
# the whole model
# ---------------------------------------------------------------------------------------------

@dataclass
class PerfModel:
    """Compute profiles per GPU type + allreduce model + gradient size (see module docstring)."""

    profiles: dict[str, ComputeProfile]
    allreduce: AllreduceModel = field(default_factory=AllreduceModel)
    grad_bytes: float = EMU_GRAD_BYTES
    overlap: float = 0.0

    def __post_init__(self) -> None:
        profs: dict[str, ComputeProfile] = {}
        for k, p in dict(self.profiles).items():
            if not isinstance(p, ComputeProfile):
                raise ConfigError(f"profile for {k!r} is a {type(p).__name__}, not a ComputeProfile")
            key = _gpus.normalize(k)
            if key != p.gpu:
                raise ConfigError(f"profile stored under {k!r} is for GPU type {p.gpu!r}; store it under {p.gpu!r}")
            profs[key] = p
        if not profs:
            raise ConfigError("performance model has no compute profile; give at least one GPU type")
        self.profiles = profs
        if not isinstance(self.allreduce, AllreduceModel):
            raise ConfigError(f"allreduce is a {type(self.allreduce).__name__}, not an AllreduceModel")
        self.grad_bytes = number(self.grad_bytes, "grad_bytes", lo=0.0)
        self.overlap = number(self.overlap, "overlap", lo=0.0, hi=1.0)

    # -- lookups ---------------------------------------------------------------------------
    def profile(self, gpu: str) -> ComputeProfile:
        key = _gpus.normalize(gpu)
        p = self.profiles.get(key)
        if p is None:
            raise ConfigError(f"no compute profile for GPU type {key!r}; the model has: "
                              f"{', '.join(sorted(self.profiles))}")
        return p

    def t_micro(self, gpu: str, b: int, speed_factor: float = 1.0) -> float:
        """Seconds per micro-batch of b on gpu, divided by speed_factor (> 1: faster than profiled)."""
        return self.profile(gpu).time(b) / speed_factor

    def allreduce_tail(self, n_ranks: int) -> float:
        """The part of the allreduce not hidden behind compute, for n_ranks participating ranks."""
        return (1.0 - self.overlap) * self.allreduce.time(self.grad_bytes, n_ranks)

    def extrapolations(self) -> dict[str, list[int]]:
        """GPU type -> micro-batch sizes whose time was extrapolated so far (empty types left out)."""
        return {g: p.extrapolations() for g, p in sorted(self.profiles.items()) if p.extrapolations()}

    # -- plan pricing ----------------------------------------------------------------------
    def rank_finish(self, plan: Plan, gpus: Sequence[str],
                    speed_factors: Sequence[float] | None = None) -> list[float]:
        """Per rank: n_i * t_micro + update_s (0.0 for a rank with n_i == 0)."""
        if len(gpus) != plan.world_size:
            raise ConfigError(f"plan has {plan.world_size} ranks but {len(gpus)} GPU types were given; "
                              "give one GPU type per rank")
        sf = check_speed_factors(speed_factors, len(gpus))
        out = []
        profs = {g: self.profile(g) for g in set(gpus)}   # every rank's type must be known
        for g, n, b, x, f in zip(gpus, plan.n, plan.bs, plan.xs, sf):
            out.append(rank_time(profs[g], b, n, x, f))
        return out

    def compute_time(self, plan: Plan, gpus: Sequence[str],
                     speed_factors: Sequence[float] | None = None) -> float:
        return max(self.rank_finish(plan, gpus, speed_factors))

    def iteration_time(self, plan: Plan, gpus: Sequence[str],
                       speed_factors: Sequence[float] | None = None) -> float:
        """max over ranks with n_i > 0 of (n_i t_micro + update_s) + the non-hidden allreduce tail."""
        fin = self.rank_finish(plan, gpus, speed_factors)
        n_part = sum(1 for n in plan.n if n > 0)
        return max(fin) + self.allreduce_tail(n_part)

    def throughput(self, plan: Plan, gpus: Sequence[str],
                   speed_factors: Sequence[float] | None = None) -> float:
        """Samples per second: B / iteration_time."""
        return plan.B / self.iteration_time(plan, gpus, speed_factors)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def emulated(cls, gpus: Iterable[str], b_list: Sequence[int] = EMU_B_LIST,
                 base_s: float = EMU_BASE_S, per_sample_s: float = EMU_PER_SAMPLE_S,
                 speeds: Mapping[str, float] | None = None, grad_bytes: float = EMU_GRAD_BYTES,
                 allreduce: AllreduceModel | None = None, *, update_s: float = 0.0,
                 mem_samples_per_gb: float = EMU_MEM_SAMPLES_PER_GB, overlap: float = 0.0) -> PerfModel:
        """Model for emulated GPU types: t(b) = (base_s + per_sample_s * b) / speed.

        speed = ``gpus.get(g).relative_speed`` (FP32 TFLOPS vs a V100) unless ``speeds`` gives it;
        update_s per type = update_s / speed; max_b = int(memory_gb * mem_samples_per_gb).
        """
        base_s = number(base_s, "base_s", lo=0.0)
        per_sample_s = number(per_sample_s, "per_sample_s", lo=0.0)
        msg = number(mem_samples_per_gb, "mem_samples_per_gb", lo=0.0, lo_open=True)
        upd = number(update_s, "update_s", lo=0.0)
        bl = sorted({integer(b, "emulated micro-batch b", lo=1) for b in b_list})
        if not bl:
            raise ConfigError("b_list is empty; give the micro-batch sizes to profile, e.g. 8,16,32")
        sp = {_gpus.normalize(k): number(v, f"speed of {k}", lo=0.0, lo_open=True)
              for k, v in (speeds or {}).items()}
        profiles: dict[str, ComputeProfile] = {}
        for g in gpus:
            info = _gpus.get(g)
            if info.key in profiles:
                continue
            speed = sp.get(info.key, info.relative_speed)
            max_b = int(info.memory_gb * msg)
            if max_b < 1:
                raise ConfigError(f"{info.key}: memory {info.memory_gb:g} GB x mem_samples_per_gb={msg:g} "
                                  "fits no sample; raise mem_samples_per_gb")
            pts = [b for b in bl if b <= max_b] or [bl[0]]
            profiles[info.key] = ComputeProfile(
                gpu=info.key, b=pts, t=[emulated_time(b, base_s, per_sample_s, speed) for b in pts],
                update_s=upd / speed, max_b=max_b, emulated=True,
                source=f"emulated: ({base_s:g} + {per_sample_s:g} * b) / {speed:.4g}",
                formula={"base_s": base_s, "per_sample_s": per_sample_s, "speed": speed})
        if not profiles:
            raise ConfigError("no GPU type given to emulate")
        return cls(profiles, allreduce if allreduce is not None else AllreduceModel(),
                   grad_bytes, overlap)

    # -- serialisation ---------------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, **self.allreduce.to_dict(),
                "grad_bytes": self.grad_bytes, "overlap": self.overlap}

    def to_dict(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, "grad_bytes": self.grad_bytes, "overlap": self.overlap,
                "allreduce": self.allreduce.to_dict(),
                "profiles": {g: p.to_dict() for g, p in sorted(self.profiles.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "perf model") -> PerfModel:
        check_version(d, where)
        try:
            ar = d["allreduce"]
            profs = {g: ComputeProfile.from_dict(p, f"{where}, profile {g!r}") for g, p in d["profiles"].items()}
            return cls(profs, AllreduceModel(ar["a"], ar["c"], ar["bandwidth"]),
                       d.get("grad_bytes", EMU_GRAD_BYTES), d.get("overlap", 0.0))
        except KeyError as e:
            raise ConfigError(f"{where}: missing field {e.args[0]!r}") from None
        except (TypeError, AttributeError) as e:
            raise ConfigError(f"{where}: malformed perf model ({e})") from None

    def save(self, directory: str | os.PathLike[str]) -> list[str]:
        """Write ``<gpu>.json`` per GPU type and ``allreduce.json``; return the paths written."""
        d = os.fspath(directory)
        os.makedirs(d, exist_ok=True)
        written = []
        items = [(f"{g}.json", p.to_dict()) for g, p in sorted(self.profiles.items())]
        items.append((ALLREDUCE_FILE, self._meta()))
        for name, obj in items:
            path = os.path.join(d, name)
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(obj, f, indent=2, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
            written.append(path)
        return written

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> PerfModel:
        """Read a directory written by :meth:`save`; any problem is one ConfigError line."""
        d = os.fspath(directory)
        if not os.path.isdir(d):
            raise ConfigError(f"profile directory {d!r} does not exist; "
                              f"it should hold <gpu>.json files and {ALLREDUCE_FILE}")
        meta_path = os.path.join(d, ALLREDUCE_FILE)
        if not os.path.isfile(meta_path):
            raise ConfigError(f"profile directory {d!r} has no {ALLREDUCE_FILE}; "
                              "write the model with PerfModel.save or run the profiler")
        meta = _read_json(meta_path)
        check_version(meta, meta_path)
        profiles: dict[str, ComputeProfile] = {}
        for name in sorted(os.listdir(d)):
            if not name.endswith(".json") or name == ALLREDUCE_FILE:
                continue
            path = os.path.join(d, name)
            p = ComputeProfile.from_dict(_read_json(path), path)
            if _gpus.normalize(name[:-5]) != p.gpu:
                raise ConfigError(f"{path}: file name says {name[:-5]!r} but the profile is for {p.gpu!r}; "
                                  f"rename it to {p.gpu}.json")
            profiles[p.gpu] = p
        if not profiles:
            raise ConfigError(f"profile directory {d!r} has no <gpu>.json compute profile")
        try:
            ar = AllreduceModel(meta["a"], meta["c"], meta["bandwidth"])
        except KeyError as e:
            raise ConfigError(f"{meta_path}: missing field {e.args[0]!r}; it needs a, c and bandwidth") from None
        return cls(profiles, ar, meta.get("grad_bytes", EMU_GRAD_BYTES), meta.get("overlap", 0.0))


def _read_json(path: str) -> Any:
    return read_json(path, "profile file", "a JSON file that hpc-jabas profile wrote")


def rank_time(p: ComputeProfile, b: int, n: int, x: int, f: float = 1.0) -> float:
    """Finishing time of one rank: n micro-batches of b, x samples in all, speed factor f.

    Every micro-batch full (x == n b): ``n * (t(b) / f) + update_s``; else the n - 1 full ones and
    a last one of r = x - (n-1) b samples: ``(n-1) * (t(b) / f) + t(r) / f + update_s``. 0.0 when n == 0.
    The planner evaluates exactly these expressions (per_rank.py).
    """
    if n == 0:
        return 0.0
    r = x - (n - 1) * b
    if r == b:
        return n * (p.time(b) / f) + p.update_s
    return (n - 1) * (p.time(b) / f) + p.time(r) / f + p.update_s


def check_speed_factors(speed_factors: Sequence[float] | None, n: int) -> list[float]:
    if speed_factors is None:
        return [1.0] * n
    sf = list(speed_factors)
    if len(sf) != n:
        raise ConfigError(f"{len(sf)} speed factors for {n} ranks; give one per rank")
    if all(type(x) is float for x in sf):              # fast path (1024 ranks re-planned often)
        arr = np.asarray(sf)
        if bool(np.all(np.isfinite(arr) & (arr > 0))):
            return sf
    return [number(x, f"speed factor of rank {i}", lo=0.0, lo_open=True) for i, x in enumerate(sf)]


DEFAULT_B_LIST = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class JobModelConfig(Protocol):
    """What :func:`job_perf_model` reads of a job's configuration (a ``JobConfig``; config.py
    imports this module, so the type is spelled structurally here)."""

    @property
    def profile_dir(self) -> str | None: ...
    @property
    def micro_batch(self) -> int | None: ...
    @property
    def emulate_base_s(self) -> float: ...
    @property
    def emulate_per_sample_s(self) -> float: ...


def job_perf_model(cfg: JobModelConfig, gpu_types: Iterable[str], calibrated: bool = True) -> PerfModel:
    """The perf model a job plans with: the profiles in ``cfg.profile_dir`` when given, else the
    emulated model of ``gpu_types`` with the job's emulation times (what its emulated ranks run).

    ``calibrated``: corrected by the job's online calibration (core/perf/calibration.py) when its run
    directory holds one (``calibration.json``, written at every checkpoint) and ``calibrate`` is on."""
    if cfg.profile_dir:
        model = PerfModel.load(cfg.profile_dir)
    else:
        bs = sorted(set(DEFAULT_B_LIST) | ({cfg.micro_batch} if cfg.micro_batch else set()))
        model = PerfModel.emulated(sorted(set(gpu_types)), bs, cfg.emulate_base_s, cfg.emulate_per_sample_s)
    run_dir = getattr(cfg, "run_dir", None)
    if calibrated and getattr(cfg, "calibrate", False) and isinstance(run_dir, str):
        path = os.path.join(run_dir, CALIBRATION_FILE)
        if os.path.isfile(path):
            calibrate_model(model, Calibration.load(path))
    return model


def calibrate_model(model: PerfModel, cal: Any, base: PerfModel | None = None) -> PerfModel:
    """``model`` (in place) = ``base`` (default: model itself) corrected by a core/calibration.Calibration:
    the profiles by their type's (factor, offset), the allreduce tail by the calibration's tail scale."""
    b = base if base is not None else model
    model.profiles = cal.apply(b.profiles)
    ar, k = b.allreduce, float(cal.tail_scale)
    model.allreduce = AllreduceModel(ar.a * k, ar.c * k, ar.bandwidth)
    return model


def declared_speed_factors(speeds: Sequence[float] | None, gpu_types: Sequence[str],
                           model: PerfModel) -> list[float] | None:
    """Per-rank speed factors (perf model time / declared time) of a job's declared ``speeds``.

    A declared speed is the rank's speed relative to a V100, as the emulator runs it; an emulated
    profile knows its type's speed (``formula["speed"]``), so rank i's factor is
    speeds[i] / that speed. None when nothing is declared. A measured profile already times its
    type: declared speeds cannot be reconciled with it, so they are refused (one line).
    """
    if not speeds:
        return None
    if len(speeds) != len(gpu_types):
        raise ConfigError(f"speeds lists {len(speeds)} values but the job has {len(gpu_types)} ranks; "
                          "give one speed per rank")
    out = []
    for i, (v, g) in enumerate(zip(speeds, gpu_types)):
        p = model.profile(g)
        if p.formula is None:
            raise ConfigError(f"speeds are declared but the perf model of {p.gpu} is a measured profile, which "
                              "already gives its speed; drop speeds, or plan with the emulated model")
        out.append(number(v, f"speed of rank {i}", lo=0.0, lo_open=True) / p.formula["speed"])
    return out
