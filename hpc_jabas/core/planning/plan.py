"""The plan: per rank a micro-batch size b_i, a micro-batch count n_i and a sample count x_i.

Two kinds, one class (docs/invariants.md, invariant 2):

* **identical b** (IIDP, docs/formulas.md, section 5): every rank runs micro-batches of the same size b,
  faster GPUs run more of them; M = sum(n_i), B = b * M. Written ``b=4 n=1,3,4``; ``Plan(4, (1, 3, 4))``.
  What batch-coupled layers (BatchNorm) need, and what the user gets when they pin the micro-batch.
* **per-rank b**: rank i runs n_i micro-batches of b_i samples, the last of them possibly partial:
  x_i samples with (n_i - 1) * b_i < x_i <= n_i * b_i, B = sum(x_i). Written ``b=8,4,4 n=2,3,1``
  (every micro-batch full, x_i = b_i * n_i) or ``b=8,4,4 n=2,3,1 x=13,12,4`` (x_i given: rank 0 runs
  8 + 5, rank 1 runs 4 + 4 + 4, rank 2 runs 4); ``Plan((8, 4, 4), (2, 3, 1), (13, 12, 4))``.
  Each micro-batch's gradient is weighted by its sample count, so any split is exact (invariant 2).

Normal form: a rank with n_i == 0 has x_i == 0 and, for equality, the b of the running ranks when
they share one, else the smallest running b; a rank with one micro-batch has b_i == x_i (one
micro-batch of x_i samples, nothing partial). A plan whose ranks share b and whose micro-batches
are all full is an identical-b plan (``identical_b``), whichever way it was written.
Pure: no torch, no horovod.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpc_jabas.core.config.validate import integer, parse_ints
from hpc_jabas.errors import ConfigError


def _ints(v: Any, what: str) -> tuple[int, ...]:
    """A plan's list of integers (ints, integral floats or digit strings, as JSON or a caller may give them)."""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise ConfigError(f"plan {what}={v!r} is invalid; it must be a list of integers")
    vals = tuple(v)
    if all(type(x) is int for x in vals):          # the planners' own plans: nothing to convert
        return vals
    return tuple(integer(x, f"plan {what} value", digits=True) for x in vals)


@dataclass(frozen=True, init=False)
class Plan:
    """Per rank: micro-batch size ``bs[i]``, micro-batch count ``n[i]``, samples ``xs[i]`` (module docstring).

    ``Plan(b, n)``: identical b (b an int), every micro-batch full. ``Plan(bs, n)``: per-rank sizes,
    every micro-batch full. ``Plan(bs, n, xs)``: per-rank sizes, the last micro-batch of rank i
    holding xs[i] - (n[i] - 1) * bs[i] samples.
    """

    bs: tuple[int, ...]
    n: tuple[int, ...]
    xs: tuple[int, ...]

    def __init__(self, b: int | Sequence[int], n: Sequence[int], x: Sequence[int] | None = None) -> None:
        if isinstance(n, (str, bytes)) or not isinstance(n, Sequence):
            raise ConfigError(f"plan micro-batch counts n={n!r} must be a list, one count per rank, e.g. n=1,3,4")
        nn = _ints(n, "n")
        if not nn:
            raise ConfigError("plan has no ranks; give one micro-batch count per rank, e.g. n=1,3,4")
        if any(k < 0 for k in nn):
            raise ConfigError(f"plan micro-batch counts n={list(nn)} contain a negative value; counts must be >= 0")
        if sum(nn) < 1:
            raise ConfigError(f"plan n={list(nn)} has no micro-batch at all; at least one count must be >= 1")
        R = len(nn)
        if isinstance(b, bool) or not isinstance(b, (int, Sequence)) or isinstance(b, (str, bytes)):
            raise ConfigError(f"plan micro-batch size b={b!r} is invalid; b must be an integer >= 1 or one per rank")
        bb = (int(b),) * R if isinstance(b, int) else _ints(b, "b")
        if len(bb) != R:
            raise ConfigError(f"plan gives {len(bb)} micro-batch sizes for {R} ranks; give one b, or one per rank")
        if any(v < 1 for v in bb):
            raise ConfigError(f"plan micro-batch size b={bb[0] if isinstance(b, int) else list(bb)} is invalid; "
                              "b must be an integer >= 1")
        if x is None:
            xx = tuple(v * k for v, k in zip(bb, nn))
        else:
            xx = _ints(x, "x")
            if len(xx) != R:
                raise ConfigError(f"plan gives {len(xx)} sample counts x for {R} ranks; give one per rank")
            for i, (v, k, s) in enumerate(zip(bb, nn, xx)):
                if not ((k == 0 and s == 0) or (k > 0 and (k - 1) * v < s <= k * v)):
                    raise ConfigError(f"plan rank {i}: x={s} samples do not make n={k} micro-batches of b={v} "
                                      f"(need {(k - 1) * v + 1 if k else 0} <= x <= {k * v})")
        # normal form: one micro-batch -> b = x; idle ranks -> the running ranks' b (or the smallest)
        bl = [s if k == 1 else v for v, k, s in zip(bb, nn, xx)]
        run = {v for v, k in zip(bl, nn) if k > 0}
        if len(run) < R:
            idle_b = min(run)
            bl = [v if k > 0 else idle_b for v, k in zip(bl, nn)]
        object.__setattr__(self, "bs", tuple(bl))
        object.__setattr__(self, "n", nn)
        object.__setattr__(self, "xs", xx)

    # ---- shape -----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self.n)

    @property
    def M(self) -> int:
        return sum(self.n)

    @property
    def B(self) -> int:
        return sum(self.xs)

    @property
    def full(self) -> bool:
        """Every micro-batch holds exactly b_i samples (no partial last micro-batch)."""
        return all(s == v * k for v, k, s in zip(self.bs, self.n, self.xs))

    @property
    def identical_b(self) -> bool:
        """The IIDP form: one micro-batch size b on every rank, every micro-batch full."""
        return len(set(self.bs)) == 1 and self.full

    @property
    def b(self) -> int:
        """The one micro-batch size of an identical-b plan (ValueError for a per-rank plan: use bs)."""
        if not self.identical_b:
            raise ValueError(f"plan {self} has per-rank micro-batch sizes; read plan.bs (per rank) instead of plan.b")
        return self.bs[0]

    @property
    def b_max(self) -> int:
        """The largest micro-batch of any running rank."""
        return max(v for v, k in zip(self.bs, self.n) if k > 0)

    def samples(self, rank: int) -> int:
        return self.xs[rank]

    def weight(self, rank: int) -> float:
        return self.xs[rank] / self.B

    def micro_sizes(self, rank: int) -> list[int]:
        """Sample counts of rank's micro-batches in order: b_i each, the last one the rest."""
        k, v, s = self.n[rank], self.bs[rank], self.xs[rank]
        return [] if k == 0 else [v] * (k - 1) + [s - (k - 1) * v]

    def first_microbatch(self, rank: int) -> int:
        """Global index of rank's first micro-batch within the iteration (ranks in order)."""
        return sum(self.n[:rank])

    # ---- (de)serialisation ------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        if self.identical_b:
            return {"b": self.bs[0], "n": list(self.n)}
        d: dict[str, Any] = {"b": list(self.bs), "n": list(self.n)}
        if not self.full:
            d["x"] = list(self.xs)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        """Reads every form to_dict writes, and the {"b": int, "n": [...]} of older checkpoints."""
        b = d["b"]
        return cls(int(b) if isinstance(b, (int, float)) else tuple(b), tuple(d["n"]),
                   None if d.get("x") is None else tuple(d["x"]))

    def __str__(self) -> str:
        if self.identical_b:
            return f"b={self.bs[0]} n={','.join(map(str, self.n))}"
        s = f"b={','.join(map(str, self.bs))} n={','.join(map(str, self.n))}"
        return s if self.full else s + f" x={','.join(map(str, self.xs))}"

    @classmethod
    def parse(cls, text: str) -> Plan:
        """Parse 'b=8 n=1,3,4', 'b=8,4,4 n=2,3,1' or 'b=8,4,4 n=2,3,1 x=13,12,4' (separators: spaces or ';')."""
        num = r"\d+(?:\s*,\s*\d+)*"
        m = re.fullmatch(rf"\s*b\s*=\s*({num})\s*[;\s]\s*n\s*=\s*({num})\s*(?:[;\s]\s*x\s*=\s*({num})\s*)?",
                         text or "")
        if not m:
            raise ConfigError(f"plan {text!r} is not understood; write it as 'b=8 n=1,3,4' (identical b), "
                              "'b=8,4,4 n=2,3,1' (per rank) or 'b=8,4,4 n=2,3,1 x=13,12,4' (samples per rank)")

        def nums(g: str) -> tuple[int, ...]:
            return tuple(parse_ints(g, "plan"))
        bl = nums(m.group(1))
        return cls(bl[0] if len(bl) == 1 else bl, nums(m.group(2)), nums(m.group(3)) if m.group(3) else None)


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


def rank_split(x: int, cap: int) -> tuple[int, int]:
    """(b, n) for x samples on a rank whose memory holds micro-batches of at most cap samples:
    the fewest micro-batches, n = ceil(x / cap), of b = ceil(x / n) samples (the last one the rest)."""
    if x <= 0:
        return 1, 0
    n = -(-x // cap)
    return -(-x // n), n


def proportional_samples_plan(B: int, speeds: Sequence[float], caps: Sequence[int]) -> Plan:
    """LB-BSP on plain Horovod, per rank: x_i = B v_i / sum v samples (largest remainder, exact sum),
    each rank's samples in the fewest micro-batches its memory cap allows (``rank_split``)."""
    if isinstance(B, bool) or not isinstance(B, int) or B < 1:
        raise ConfigError(f"global batch B={B!r} must be a positive integer")
    if len(caps) != len(speeds):
        raise ConfigError(f"{len(caps)} memory caps for {len(speeds)} ranks; give one per rank")
    xs = split_proportional(B, speeds)
    parts = [rank_split(x, int(c)) for x, c in zip(xs, caps)]
    return Plan(tuple(p[0] for p in parts), tuple(p[1] for p in parts), tuple(xs))


def half_split(plan: Plan) -> tuple[tuple[int, ...], ...]:
    """Per rank, per micro-batch: 0 or 1, the half of the iteration it belongs to (similarity statistic).

    Identical b: the parity of the global micro-batch index (halves of equal sample counts, one
    micro-batch apart when M is odd). Per-rank b: micro-batches by decreasing size (then global
    index), each to the half that holds fewer samples so far (ties: half 0), so the two halves'
    sample counts differ by at most the largest micro-batch and usually far less.
    """
    return _half_split(plan)


@functools.lru_cache(maxsize=64)
def _half_split(plan: Plan) -> tuple[tuple[int, ...], ...]:
    if plan.identical_b:
        return tuple(tuple((plan.first_microbatch(i) + j) % 2 for j in range(plan.n[i]))
                     for i in range(plan.world_size))
    items = [(-size, g, i, j) for g, (i, j, size) in
             enumerate((i, j, s) for i in range(plan.world_size) for j, s in enumerate(plan.micro_sizes(i)))]
    items.sort()
    load = [0, 0]
    out = [[0] * plan.n[i] for i in range(plan.world_size)]
    for neg, _, i, j in items:
        h = 0 if load[0] <= load[1] else 1
        out[i][j] = h
        load[h] -= neg
    return tuple(tuple(r) for r in out)
