"""Global-cursor heterogeneous sampler (docs/invariants.md, invariant 3).

One seeded permutation per epoch and one global cursor. Each iteration takes the next B
indices of the permutation and gives rank i the contiguous run of micro-batches
[first_i, first_i + n_i) of b samples each, in rank order. Because the cursor is global and
advances by exactly the samples handed out, changing B, the plan or the rank count between
iterations, or resuming from a saved (epoch, cursor), never skips or repeats a sample.

Per-rank plans (planning/plan.py): rank i's run is x_i samples, cut into micro-batches of b_i, the last
one the rest (``Plan.micro_sizes``). Both kinds of plan go through the same cursor.

Epoch tail (the last r < B samples of an epoch), chosen by ``tail``:
  - "shrink" (default): the last iteration takes all r samples. Identical b: ceil(r / b)
    micro-batches, split over the ranks in proportion to the plan's n_i (never more than n_i on
    a rank), the very last micro-batch holding r mod b samples when b does not divide r.
    Per-rank b: the r samples split in proportion to the plan's x_i (never more than x_i). Every
    sample is used exactly once per epoch; the trainer weights each micro-batch by its true
    sample count, so the update is still the exact mean gradient of the r samples.
  - "drop": the r samples are skipped this epoch (like DataLoader(drop_last=True)); every
    iteration has exactly B samples and at most B-1 samples per epoch go unused.

No single-sample micro-batch at the epoch tail (BatchNorm cannot train on one sample). With
"shrink", an iteration that is not a full plan iteration never runs a micro-batch of one sample
on a rank whose b_i >= 2:
  - when exactly B + 1 samples are left (B >= 2 and some b_i >= 2), the next iteration takes all
    B + 1 (its last running rank gets the extra sample) instead of leaving a 1-sample iteration;
  - a 1-sample micro-batch takes one sample from the micro-batch just before it (its rank's own
    previous one, or the previous rank's last) when that one holds >= 3 samples: (b, 1) becomes
    (b - 1, 2); else from the micro-batch just after it (>= 3 samples); else it merges into the
    micro-batch before (or after) it, which then holds 3 samples when b = 2 (the one case where a
    micro-batch exceeds its b, by one sample: an odd count cannot be cut into pieces of 2).
  Samples keep their places in the permutation order (a moved sample changes rank only between
  neighbouring runs), so every sample is still used exactly once; a rank may hold one sample more
  than its plan share (x_i + 1) on such an iteration. ``IterationBatch.micro`` holds the sizes run;
  ``IterationBatch.plan`` holds each rank's samples x_i exactly (its micro-batch counts follow
  b_i = the rank's largest micro-batch). Left as they are: ranks with b_i = 1 (one-sample
  micro-batches by plan), a 1-sample micro-batch whose only neighbours run on such ranks, and an
  iteration of one sample in all (a 1-sample dataset, or B = 1).
Pure: numpy only.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hpc_jabas.core.config.defaults import TAILS as TAILS
from hpc_jabas.core.planning.plan import Plan, split_proportional
from hpc_jabas.errors import ConfigError

IndexArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class IterationBatch:
    epoch: int
    start: int                      # cursor before this iteration
    plan: Plan                      # the plan actually used (shrunk on the epoch tail)
    micro: tuple[tuple[IndexArray, ...], ...]  # micro[rank] = tuple of index arrays (one per micro-batch)

    @property
    def total(self) -> int:
        return sum(len(m) for r in self.micro for m in r)

    def rank_indices(self, rank: int) -> IndexArray:
        parts = self.micro[rank]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def all_indices(self) -> IndexArray:
        return np.concatenate([m for r in self.micro for m in r])


class HeterogeneousSampler:
    def __init__(self, num_samples: int, seed: int = 0, tail: str = "shrink"):
        if num_samples < 1:
            raise ConfigError(f"dataset has {num_samples} samples; it needs at least 1")
        if tail not in TAILS:
            raise ConfigError(f"tail={tail!r} is unknown; valid: {', '.join(TAILS)}")
        self.num_samples = int(num_samples)
        self.seed = int(seed)
        self.tail = tail
        self.epoch = 0
        self.cursor = 0
        self._perm_epoch = -1
        self._perm: IndexArray | None = None

    # ---- permutation -------------------------------------------------------------------
    def permutation(self, epoch: int | None = None) -> IndexArray:
        e = self.epoch if epoch is None else epoch
        if e != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, e]).permutation(self.num_samples)
            self._perm_epoch = e
        assert self._perm is not None
        return self._perm

    @property
    def remaining(self) -> int:
        return self.num_samples - self.cursor

    def epoch_done(self, B: int | None = None) -> bool:
        if self.remaining <= 0:
            return True
        return self.tail == "drop" and B is not None and self.remaining < B

    def iterations_left(self, B: int) -> int:
        if self.tail == "drop":
            return self.remaining // B
        r = self.remaining
        if B >= 2 and r > B and r % B == 1:
            return r // B                          # the last full iteration takes B + 1 (module docstring)
        return -(-r // B)

    def new_epoch(self) -> None:
        self.epoch += 1
        self.cursor = 0

    # ---- one iteration -------------------------------------------------------------------
    def next(self, plan: Plan) -> IterationBatch:
        """Take the next iteration's indices for every rank (all ranks compute the same thing)."""
        if self.epoch_done(plan.B):
            raise ConfigError(f"epoch {self.epoch} is finished at cursor {self.cursor}; call new_epoch() first")
        perm = self.permutation()
        start = self.cursor
        r = self.remaining
        sizes: list[list[int]]
        if r >= plan.B and not (self.tail == "shrink" and r == plan.B + 1 and plan.B >= 2 and plan.b_max >= 2):
            used = plan
            sizes = [used.micro_sizes(i) for i in range(used.world_size)]
        else:
            if r < plan.B:
                shrunk = self._shrunk(plan, r)
                sizes = [shrunk.micro_sizes(i) for i in range(plan.world_size)]
            else:                                   # B + 1 left: this iteration takes them all
                sizes = [plan.micro_sizes(i) for i in range(plan.world_size)]
                last = max(i for i, k in enumerate(plan.n) if k > 0)
                sizes[last].append(1)
            sizes = _no_single(sizes, plan.bs)
            used = _plan_of(sizes, plan.bs)
        micro: list[tuple[IndexArray, ...]] = []
        pos = start
        for mine_sizes in sizes:
            mine: list[IndexArray] = []
            for size in mine_sizes:
                mine.append(perm[pos:pos + size])
                pos += size
            micro.append(tuple(mine))
        assert pos == start + used.B
        self.cursor = pos
        return IterationBatch(self.epoch, start, used, tuple(micro))

    @staticmethod
    def _shrunk(plan: Plan, r: int) -> Plan:
        """The epoch tail's plan for the last r < B samples (module docstring)."""
        if plan.identical_b:
            b = plan.b
            m = -(-r // b)
            n = split_proportional(m, [max(x, 0) for x in plan.n], caps=list(plan.n))
            xs = [b * k for k in n]
            last = max(i for i, k in enumerate(n) if k > 0)
            xs[last] -= m * b - r                     # the very last micro-batch holds r mod b
            return Plan(b, tuple(n), tuple(xs))
        xs = split_proportional(r, list(plan.xs), caps=list(plan.xs))
        return Plan(plan.bs, tuple(-(-x // b) for x, b in zip(xs, plan.bs)), tuple(xs))

    # ---- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"num_samples": self.num_samples, "seed": self.seed, "tail": self.tail,
                "epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        if int(d["num_samples"]) != self.num_samples:
            raise ConfigError(f"checkpoint sampler covers {d['num_samples']} samples but the dataset has "
                              f"{self.num_samples}; resume with the same dataset")
        self.seed, self.tail = int(d["seed"]), d["tail"]
        self.epoch, self.cursor = int(d["epoch"]), int(d["cursor"])


def _no_single(sizes: list[list[int]], bs: tuple[int, ...]) -> list[list[int]]:
    """Per rank, micro-batch sizes without a 1-sample micro-batch on a rank with b >= 2 (module docstring)."""
    flat = [[i, s] for i, mine in enumerate(sizes) for s in mine]     # [rank, size] in permutation order
    k = 0
    while k < len(flat):
        rank, size = flat[k]
        if size != 1 or bs[rank] < 2:
            k += 1
            continue
        before = flat[k - 1] if k > 0 else None
        after = flat[k + 1] if k + 1 < len(flat) else None
        if before is not None and before[1] >= 3:
            before[1] -= 1                          # its last sample joins this micro-batch
            flat[k][1] = 2
        elif after is not None and after[1] >= 3:
            after[1] -= 1                           # its first sample joins this micro-batch
            flat[k][1] = 2
        elif before is not None and bs[before[0]] >= 2:
            before[1] += 1
            del flat[k]
            continue
        elif after is not None and bs[after[0]] >= 2:
            after[1] += 1
            del flat[k]
            continue
        k += 1
    out: list[list[int]] = [[] for _ in sizes]
    for rank, size in flat:
        out[rank].append(size)
    return out


def _plan_of(sizes: list[list[int]], bs: tuple[int, ...]) -> Plan:
    """The plan recording each rank's samples exactly (b_i: its largest micro-batch, else the plan's)."""
    xs = [sum(m) for m in sizes]
    b = [max(m) if m else bs[i] for i, m in enumerate(sizes)]
    return Plan(tuple(b), tuple(-(-x // v) for x, v in zip(xs, b)), tuple(xs))


def split_single_micro(micro: Sequence[Sequence[IndexArray]], rank: int, mine: Sequence[IndexArray],
                       halves: Sequence[int] | None, min_half: int = 1
                       ) -> tuple[tuple[IndexArray, ...], tuple[int, ...] | None]:
    """A measuring iteration whose whole plan is one micro-batch (one GPU, B <= b) has no second half to
    compare: that micro-batch runs as two, labelled half 0 and half 1, so the similarity and the noise scale
    are measured on one GPU too. The summed gradient, and so the update, is the same (the samples are the
    same; a model with batch-coupled layers such as BatchNorm sees smaller micro-batches, so each half must
    hold at least ``min_half`` samples, else nothing is split and the iteration measures nothing).
    ``micro``: every rank's micro-batches (IterationBatch.micro); ``mine``, ``halves``: this rank's."""
    labels = None if halves is None else tuple(halves)
    if sum(len(m) for m in micro) != 1 or len(mine) != 1:
        return tuple(mine), labels
    idx = mine[0]
    if len(idx) // 2 < max(1, int(min_half)):
        return tuple(mine), labels
    h = (len(idx) + 1) // 2
    return (idx[:h], idx[h:]), (0, 1)
