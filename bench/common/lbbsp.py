"""LB-BSP's balancing rule, as its paper runs it on GPUs, for the benchmarks' hand-written baseline.

Chen et al. (SoCC 2020), on GPUs: the workers' local batches start equal; after every monitoring window each
worker's speed is measured (samples over compute time), and samples move from the stragglers to the leaders so
that the local batches approach the split in proportion to the measured speeds. When a worker's batch reverses
direction (up, then down) the sizes oscillate, and the step is halved. A leader takes more samples only up to
its memory headroom (``max_local``), unless the caller runs over-sized batches as accumulated micro-batches.

Plain Python, no Horovod: the benchmark feeds it the allgathered times, and tests/test_lbbsp_baseline.py checks
that it converges to equal finish times on a static speed mix and halves its step on oscillation.
"""
from __future__ import annotations

from collections.abc import Sequence


def split_in_proportion(total: int, weights: Sequence[float], lo: int = 1,
                        hi: Sequence[int] | None = None) -> list[int]:
    """Integers in [lo, hi_i] close to total * w_i / sum(w), summing to total (largest remainder)."""
    k = len(weights)
    caps = list(hi) if hi is not None else [total] * k
    s = float(sum(weights))
    want = [total * w / s for w in weights]
    out = [min(caps[i], max(lo, int(want[i]))) for i in range(k)]
    order = sorted(range(k), key=lambda i: -(want[i] - int(want[i])))
    i = 0
    while sum(out) != total and i < 10 * k * max(1, total):
        j = order[i % k]
        if sum(out) < total and out[j] < caps[j]:
            out[j] += 1
        elif sum(out) > total and out[j] > lo:
            out[j] -= 1
        i += 1
    if sum(out) != total:
        raise ValueError(f"cannot split {total} into {k} parts within [{lo}, {caps}]")
    return out


class LBBSP:
    """The local batches of R workers summing to B, re-split after each window from measured compute times."""

    def __init__(self, B: int, R: int, max_local: int | None = None, min_step: float = 1 / 16) -> None:
        self.B, self.R = int(B), int(R)
        self.max_local = max_local
        self.min_step = float(min_step)
        self.x = split_in_proportion(self.B, [1.0] * self.R)
        self.step = 1.0
        self.dir = [0] * self.R
        self.halvings = 0

    def update(self, times: Sequence[float]) -> list[int]:
        """One window: ``times[i]`` is worker i's compute time for its ``x[i]`` samples. Returns the new split."""
        if len(times) != self.R or any(not t > 0 for t in times):
            return list(self.x)                              # a window without a usable measurement: keep
        speeds = [x / t for x, t in zip(self.x, times)]
        caps = [self.max_local] * self.R if self.max_local else None
        target = split_in_proportion(self.B, speeds, hi=caps)
        new, d = self._move(target, caps)
        if self.step > self.min_step and any(di and pi and di != pi for di, pi in zip(d, self.dir)):
            self.step = max(self.min_step, self.step / 2)       # oscillation: halve the step, once per window
            self.halvings += 1
            new, d = self._move(target, caps)
        self.dir = [di or pi for di, pi in zip(d, self.dir)]
        self.x = new
        return list(new)

    def _move(self, target: list[int], caps: list[int] | None) -> tuple[list[int], list[int]]:
        want = [c + self.step * (t - c) for c, t in zip(self.x, target)]
        new = split_in_proportion(self.B, want, hi=caps)
        return new, [(n > c) - (n < c) for n, c in zip(new, self.x)]
