"""The plan: one micro-batch size b for every rank and a micro-batch count n_i per rank.

IIDP's rule (background.md section 2): every rank runs micro-batches of the same size b,
faster GPUs run more of them; M = sum(n_i), B = b * M, rank i's weight is n_i / M.
Pure: no torch, no horovod.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpc_jabas.errors import ConfigError


@dataclass(frozen=True)
class Plan:
    b: int
    n: tuple[int, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.b, int) or self.b < 1:
            raise ConfigError(f"plan micro-batch size b={self.b!r} is invalid; b must be an integer >= 1")
        object.__setattr__(self, "n", tuple(int(x) for x in self.n))
        if not self.n:
            raise ConfigError("plan has no ranks; give one micro-batch count per rank, e.g. n=1,3,4")
        if any(x < 0 for x in self.n):
            raise ConfigError(f"plan micro-batch counts n={list(self.n)} contain a negative value; counts must be >= 0")
        if sum(self.n) < 1:
            raise ConfigError(f"plan n={list(self.n)} has no micro-batch at all; at least one count must be >= 1")

    @property
    def world_size(self) -> int:
        return len(self.n)

    @property
    def M(self) -> int:
        return sum(self.n)

    @property
    def B(self) -> int:
        return self.b * self.M

    def samples(self, rank: int) -> int:
        return self.b * self.n[rank]

    def weight(self, rank: int) -> float:
        return self.n[rank] / self.M

    def first_microbatch(self, rank: int) -> int:
        """Global index of rank's first micro-batch within the iteration (ranks in order)."""
        return sum(self.n[:rank])

    def to_dict(self) -> dict[str, Any]:
        return {"b": self.b, "n": list(self.n)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        return cls(int(d["b"]), tuple(d["n"]))

    def __str__(self) -> str:
        return f"b={self.b} n={','.join(map(str, self.n))}"

    @classmethod
    def parse(cls, text: str) -> Plan:
        """Parse 'b=8 n=1,3,4' (separators: spaces or ';')."""
        m = re.fullmatch(r"\s*b\s*=\s*(\d+)\s*[;\s]\s*n\s*=\s*([\d,\s]+)\s*", text or "")
        if not m:
            raise ConfigError(f"plan {text!r} is not understood; write it as 'b=8 n=1,3,4'")
        return cls(int(m.group(1)), tuple(int(x) for x in m.group(2).replace(" ", "").split(",") if x))


def split_proportional(total: int, weights: Sequence[float], caps: Sequence[int] | None = None) -> list[int]:
    """Split an integer total into len(weights) integers proportional to weights, summing exactly.

    Largest-remainder rounding; optional per-part caps (a part never exceeds its cap; the excess
    goes to the others in proportion). Raises ConfigError when the caps cannot hold the total.
    """
    w = [float(x) for x in weights]
    if not w or any(x < 0 for x in w) or sum(w) <= 0:
        raise ConfigError(f"speeds {list(weights)} are invalid; give one positive speed per rank")
    k = len(w)
    cap = [int(c) for c in caps] if caps is not None else [total] * k
    if sum(cap) < total:
        raise ConfigError(f"cannot place {total} micro-batches: the ranks' caps {cap} hold only {sum(cap)}")
    out = [0] * k
    free = [i for i in range(k) if w[i] > 0 and cap[i] > 0]
    rest = total
    while rest > 0:
        if not free:
            raise ConfigError(f"cannot place {total} micro-batches on ranks with speeds {w} and caps {cap}")
        ws = sum(w[i] for i in free)
        share = {i: rest * w[i] / ws for i in free}
        base = {i: min(int(share[i]), cap[i] - out[i]) for i in free}
        placed = sum(base.values())
        for i in free:
            out[i] += base[i]
        left = rest - placed
        # largest remainder, ties to the faster, then the lower rank
        order = sorted(free, key=lambda i: (-(share[i] - int(share[i])), -w[i], i))
        for i in order:
            if left == 0:
                break
            if out[i] < cap[i]:
                out[i] += 1
                left -= 1
        rest = left
        free = [i for i in free if out[i] < cap[i]]
    return out


def proportional_plan(B: int, b: int, speeds: Sequence[float], caps: Sequence[int] | None = None) -> Plan:
    """LB-BSP's rule: rank i's share of B is proportional to its speed v_i (x_i = B v_i / sum v).

    In micro-batch units: M = B / b micro-batches split by largest remainder so the sum is exact.
    """
    if b < 1 or B < b or B % b:
        raise ConfigError(f"global batch B={B} is not a positive multiple of the micro-batch size b={b}")
    return Plan(b, tuple(split_proportional(B // b, speeds, caps)))
