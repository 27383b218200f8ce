"""Global-cursor heterogeneous sampler (design.md invariant 3).

One seeded permutation per epoch and one global cursor. Each iteration takes the next B
indices of the permutation and gives rank i the contiguous run of micro-batches
[first_i, first_i + n_i) of b samples each, in rank order. Because the cursor is global and
advances by exactly the samples handed out, changing B, the plan or the rank count between
iterations, or resuming from a saved (epoch, cursor), never skips or repeats a sample.

Per-rank plans (plan.py): rank i's run is x_i samples, cut into micro-batches of b_i, the last
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
Pure: numpy only.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hpc_jabas.core.plan import Plan, split_proportional
from hpc_jabas.errors import ConfigError

TAILS = ("shrink", "drop")

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
        return -(-self.remaining // B)

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
        used = plan if r >= plan.B else self._shrunk(plan, r)
        total = used.B
        micro: list[tuple[IndexArray, ...]] = []
        pos = start
        for i in range(used.world_size):
            mine: list[IndexArray] = []
            for size in used.micro_sizes(i):
                mine.append(perm[pos:pos + size])
                pos += size
            micro.append(tuple(mine))
        end = start + total
        assert pos == end
        self.cursor = end
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
