"""Compute profile of one GPU type: measured seconds per micro-batch, update time, memory cap.

Part of the performance model (perfmodel.py, which re-exports :class:`ComputeProfile`,
:func:`emulated_time` and ``FORMAT_VERSION``), with the number checks and the format version the
whole model shares. Pure (plain Python + numpy).
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpc_jabas.core.config import gpus as _gpus
from hpc_jabas.core.config.validate import integer, number
from hpc_jabas.errors import ConfigError

FORMAT_VERSION = 1


def emulated_time(b: int, base_s: float, per_sample_s: float, speed: float) -> float:
    """Seconds of one emulated micro-batch of b samples: (base_s + per_sample_s * b) / speed.

    The one formula shared by :meth:`PerfModel.emulated` and the emulator that sleeps to it.
    """
    return (base_s + per_sample_s * b) / speed


def check_version(d: Mapping[str, Any], where: str) -> None:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(d).__name__}")
    v = d.get("version")
    if v != FORMAT_VERSION:
        raise ConfigError(f"{where}: unsupported perf-model format version {v!r}; "
                          f"this hpc-jabas reads version {FORMAT_VERSION}")


# ---------------------------------------------------------------------------------------------
# compute profile
# ---------------------------------------------------------------------------------------------

@dataclass
class ComputeProfile:
    """Measured micro-batch time of one GPU type.

    ``b``/``t``: micro-batch sizes and seconds per micro-batch (forward + backward + accumulate).
    ``update_s``: optimizer step. ``max_b``: memory cap (default: the largest measured b).
    ``formula``: for emulated types only, ``{"base_s", "per_sample_s", "speed"}``; then
    :meth:`time` is exactly :func:`emulated_time` for every b (the emulator's ground truth) and
    nothing counts as extrapolated.
    """

    gpu: str
    b: list[int]
    t: list[float]
    update_s: float = 0.0
    max_b: int | None = None
    emulated: bool = False
    source: str = ""
    formula: dict[str, float] | None = None
    _used_extrapolated: set[int] = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.gpu = _gpus.normalize(self.gpu)
        if isinstance(self.b, (str, bytes)) or not isinstance(self.b, Iterable):
            raise ConfigError(f"profile {self.gpu}: b={self.b!r} must be a list of micro-batch sizes")
        bs = [integer(x, f"profile {self.gpu}: measured micro-batch b", lo=1) for x in self.b]
        ts = [number(x, f"profile {self.gpu}: measured time t", lo=0.0, lo_open=True) for x in self.t]
        if not bs:
            raise ConfigError(f"profile {self.gpu}: no measured point; give at least one (b, t) pair")
        if len(bs) != len(ts):
            raise ConfigError(f"profile {self.gpu}: {len(bs)} micro-batch sizes but {len(ts)} times; "
                              "give one time per size")
        pairs = sorted(zip(bs, ts))
        for (b0, _), (b1, _) in zip(pairs, pairs[1:]):
            if b0 == b1:
                raise ConfigError(f"profile {self.gpu}: micro-batch b={b0} is measured twice; "
                                  "give each size once")
        self.b = [p[0] for p in pairs]
        self.t = [p[1] for p in pairs]
        self.update_s = number(self.update_s, f"profile {self.gpu}: update_s", lo=0.0)
        self.max_b = self.b[-1] if self.max_b is None else integer(self.max_b, f"profile {self.gpu}: max_b", lo=1)
        self.emulated = bool(self.emulated)
        self.source = str(self.source)
        if self.formula is not None:
            f = dict(self.formula)
            try:
                self.formula = {"base_s": number(f["base_s"], "formula base_s", lo=0.0),
                                "per_sample_s": number(f["per_sample_s"], "formula per_sample_s", lo=0.0),
                                "speed": number(f["speed"], "formula speed", lo=0.0, lo_open=True)}
            except KeyError as e:
                raise ConfigError(f"profile {self.gpu}: formula lacks {e.args[0]!r}; "
                                  "it needs base_s, per_sample_s and speed") from None
            if self.formula["base_s"] + self.formula["per_sample_s"] <= 0:
                raise ConfigError(f"profile {self.gpu}: formula gives zero time; "
                                  "base_s or per_sample_s must be > 0")

    # -- queries ---------------------------------------------------------------------------
    def extrapolated(self, b: int) -> bool:
        """True when time(b) lies outside the measured range (never for an exact formula)."""
        return self.formula is None and (b < self.b[0] or b > self.b[-1])

    def extrapolations(self) -> list[int]:
        """Every b that :meth:`time` has been asked for outside the measured range so far."""
        return sorted(self._used_extrapolated)

    def check_fits(self, b: int) -> None:
        assert self.max_b is not None   # set by __post_init__
        if b > self.max_b:
            raise ConfigError(f"micro-batch b={b} exceeds the memory cap max_b={self.max_b} of {self.gpu}; "
                              f"use b <= {self.max_b} on {self.gpu}")

    def time(self, b: int) -> float:
        """Seconds per micro-batch of b samples.

        Inside the measured range: piecewise-linear interpolation. Outside: linear extrapolation
        from the two nearest points, recorded in :meth:`extrapolations`, and bounded so that it
        stays positive: below the range never under ``t0 * b / b0`` (per-sample time no better
        than at the smallest measured size), above it never under the last measured time.
        A single measured point is scaled proportionally (t0 * b / b0).
        """
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ConfigError(f"micro-batch b={b!r} must be an integer >= 1")
        self.check_fits(b)
        if self.extrapolated(b):
            self._used_extrapolated.add(int(b))
        return self._time(b)

    def time_table(self, b_max: int) -> list[float]:
        """[time(1), ..., time(b_max)] (the same numbers as :meth:`time`), cached; b_max <= max_b.

        Not recorded as extrapolations: the planner tabulates every size it might use; the perf
        model records the ones a plan really uses when it prices it.
        """
        assert self.max_b is not None and 1 <= b_max <= self.max_b
        tab = self.__dict__.get("_table")
        if tab is None or len(tab) < b_max:
            tab = [self._time(b) for b in range(1, max(b_max, len(tab or ())) + 1)]
            self.__dict__["_table"] = tab
        return tab[:b_max]

    def _time(self, b: int) -> float:
        if self.formula is not None:
            f = self.formula
            return emulated_time(b, f["base_s"], f["per_sample_s"], f["speed"])
        bs, ts = self.b, self.t
        i = bisect.bisect_left(bs, b)
        if i < len(bs) and bs[i] == b:
            return ts[i]
        if 0 < i < len(bs):
            b0, b1, t0, t1 = bs[i - 1], bs[i], ts[i - 1], ts[i]
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
        if len(bs) == 1:
            return ts[0] * b / bs[0]
        if i == 0:
            b0, b1, t0, t1 = bs[0], bs[1], ts[0], ts[1]
            return max(t0 + (t1 - t0) * (b - b0) / (b1 - b0), t0 * b / b0)
        b0, b1, t0, t1 = bs[-2], bs[-1], ts[-2], ts[-1]
        return max(t1 + (t1 - t0) * (b - b1) / (b1 - b0), t1)

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"version": FORMAT_VERSION, "gpu": self.gpu, "b": list(self.b), "t": list(self.t),
                             "update_s": self.update_s, "max_b": self.max_b, "emulated": self.emulated,
                             "source": self.source}
        if self.formula is not None:
            d["formula"] = dict(self.formula)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "compute profile") -> ComputeProfile:
        check_version(d, where)
        try:
            return cls(gpu=d["gpu"], b=list(d["b"]), t=list(d["t"]), update_s=d.get("update_s", 0.0),
                       max_b=d.get("max_b"), emulated=d.get("emulated", False),
                       source=d.get("source", ""), formula=d.get("formula"))
        except KeyError as e:
            raise ConfigError(f"{where}: missing field {e.args[0]!r}; a profile needs gpu, b and t") from None
        except TypeError as e:
            raise ConfigError(f"{where}: malformed profile ({e})") from None
