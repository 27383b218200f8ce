"""Injected interference for emulated ranks: a slowdown factor as a function of the iteration.

Pure (no clock): the job config checks ``slowdown`` specs with it, the emulator (runtime/emulate.py)
applies them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpc_jabas.errors import ConfigError


@dataclass(frozen=True)
class Slowdown:
    """Extra slowdown factor (>= 1 means slower) as a function of the iteration.

    kind: "step" (factor from ``start`` to ``end``), "ramp" (1 -> factor linearly over
    [start, end)), "periodic" (factor during the first ``duty`` share of every ``period``
    iterations inside [start, end)).
    """
    factor: float
    start: int = 0
    end: int | None = None
    kind: str = "step"
    period: int = 10
    duty: float = 0.5

    def __post_init__(self) -> None:
        if self.kind not in ("step", "ramp", "periodic"):
            raise ConfigError(f"slowdown kind {self.kind!r} is unknown; valid: step, ramp, periodic")
        if not self.factor > 0:
            raise ConfigError(f"slowdown factor {self.factor!r} must be > 0")

    def at(self, it: int) -> float:
        if it < self.start or (self.end is not None and it >= self.end):
            return 1.0
        if self.kind == "step":
            return self.factor
        if self.kind == "ramp":
            span = max(1, (self.end or self.start + 100) - self.start)
            return 1.0 + (self.factor - 1.0) * min(1.0, (it - self.start) / span)
        phase = (it - self.start) % max(1, self.period)
        return self.factor if phase < self.duty * self.period else 1.0

    @classmethod
    def parse(cls, text: str) -> Slowdown:
        """'factor=3,start=50[,end=100][,kind=periodic,period=10,duty=0.5]'."""
        kw: dict[str, Any] = {}
        for part in text.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ConfigError(f"slowdown {text!r}: {part!r} is not key=value; e.g. factor=3,start=50")
            k, v = (s.strip() for s in part.split("=", 1))
            if k in ("factor", "duty", "start", "end", "period"):
                conv = float if k in ("factor", "duty") else int
                try:
                    kw[k] = conv(v)
                except ValueError:
                    kind = "a number" if conv is float else "an integer"
                    raise ConfigError(f"slowdown {text!r}: {k}={v!r} must be {kind}") from None
            elif k == "kind":
                kw[k] = v
            else:
                raise ConfigError(f"slowdown key {k!r} is unknown; valid: factor, start, end, kind, period, duty")
        if "factor" not in kw:
            raise ConfigError(f"slowdown {text!r} has no factor; e.g. factor=3,start=50")
        return cls(**kw)
