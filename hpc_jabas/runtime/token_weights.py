"""The token-weight reduction of the HeterogeneousOptimizer (runtime/optim.py): whether a job's losses are plain
(weighted by their sample counts) or token-weighted (``backward(loss, count, weight)``, the loss a mean over
``weight`` tokens), agreed by every rank at the first iteration, and the global sum W of an iteration's weights,
which scales the reduced gradient to the token mean (docs/formulas.md, section 1).

One scalar allreduce an iteration in the weighted mode (started beside the last backward where the backend
reduces eagerly), none in the plain mode once agreed; the agreement itself is one allreduce of two flags."""
from __future__ import annotations

from typing import Any

import torch

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.runtime.comm.reducer import GradReducer
from hpc_jabas.runtime.gradstats import scalar


class TokenWeights:
    """One optimizer's loss mode and weight sums: ``mode`` ("plain" | "weighted", None before the first
    agreement), this iteration's local sum and its global sum (``prev``: the last iteration's, the next
    iteration's backward normaliser)."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.mode: str | None = None               # "plain" | "weighted", agreed by every rank
        self.prev: torch.Tensor | None = None      # the previous iteration's global weight
        self.reset()

    def reset(self) -> None:
        """A new iteration: no local micro-batch seen, no reduction started."""
        self.local_mode: str | None = None         # this iteration's micro-batches' mode
        self.local: torch.Tensor | None = None     # sum of this rank's weights (weighted mode)
        self.handle: Any = None
        self.total: torch.Tensor | None = None
        self.done = False

    def add(self, weight: torch.Tensor | float | None) -> torch.Tensor | None:
        """One micro-batch's weight (None: a plain loss): checked against the mode so far, added to the local
        sum; the weight as a device scalar, or None."""
        mode = "plain" if weight is None else "weighted"
        if self.local_mode not in (None, mode):
            raise ConfigError("forward_fn returned (loss, weight) for some micro-batches of an iteration and a "
                              "plain loss for others; return the same kind every time")
        if self.mode not in (None, mode):
            raise ConfigError(f"this job's losses are {self.mode} (agreed at its first iteration) but a micro-batch "
                              f"gave a {mode} one; return the same kind every time")
        self.local_mode = mode
        if weight is None:
            return None
        w = scalar(weight, self.dtype, self.device)
        self.local = w.clone() if self.local is None else self.local + w
        return w

    def agree(self) -> str:
        """Every rank, the first iteration only: plain or weighted (a rank without micro-batches learns it)."""
        if self.mode is None:
            flags = torch.tensor([float(self.local_mode == "plain"), float(self.local_mode == "weighted")],
                                 dtype=torch.float32, device=self.device)
            n_plain, n_weighted = comm.allreduce_sum(flags, name="hj.lossmode").tolist()
            if n_plain > 0 and n_weighted > 0:
                raise ConfigError(f"forward_fn returned (loss, weight) on {int(n_weighted)} rank(s) and a plain loss "
                                  f"on {int(n_plain)}; return the same kind on every rank")
            self.mode = "weighted" if n_weighted > 0 else "plain"
        if self.local_mode not in (None, self.mode):
            raise ConfigError(f"this rank's losses are {self.local_mode}, the job's are {self.mode}")
        return self.mode

    def launch(self, reducer: GradReducer) -> None:
        """Start the sum of the iteration's weights (once)."""
        if self.handle is None:
            w = self.local if self.local is not None else torch.zeros((), dtype=self.dtype, device=self.device)
            self.total = w.reshape(1).clone()
            self.handle = reducer.sum_async(self.total, "hj.w")

    def wait(self, reducer: GradReducer) -> torch.Tensor:
        """The global sum of the iteration's weights (a device scalar), started if it was not."""
        self.launch(reducer)
        if not self.done:
            self.handle.wait()
            self.done = True
        assert self.total is not None
        self.prev = self.total.reshape(())
        return self.prev
