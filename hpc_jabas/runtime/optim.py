"""The low-level layer: an optimizer wrapper for weighted heterogeneous local batches.

Like ``hvd.DistributedOptimizer``, it wraps the user's optimizer. Per iteration:

    opt.begin(n_local, total_samples)          # n_local micro-batches here, S samples in all ranks
    for mb in my_micro_batches:
        loss = criterion(model(x_mb), y_mb)    # mean over the micro-batch, as usual
        opt.backward(loss, len(mb))            # accumulates len(mb) * grad(mean loss)
    opt.step()                                 # waits for the allreduce, steps the optimizer

Every rank accumulates the sum of per-sample gradients of its own micro-batches; one
``op=Sum`` allreduce with the postscale 1/S (the same on every rank) leaves the mean gradient
of all S samples of the iteration on every rank: exactly the gradient of one big batch
(design.md invariants 1-2; Horovod refuses per-rank scale factors, so the weight is applied
locally by the sample count). The allreduce of each parameter is started asynchronously from a
post-accumulate-grad hook during the last micro-batch's backward, so it overlaps the rest of
that backward and Horovod fuses small tensors (its tensor fusion).

On measurement iterations (``begin(..., measure=True, halves=...)``) the wrapper keeps two
half-batch gradient sums (sample-weighted), split by ``plan.half_split`` (identical b: the parity
of the global micro-batch index; per-rank b: two halves of nearly equal sample counts), and the
sample-weighted sum of the micro-batch gradients' squared norms, then runs one allreduce of
[half 0 | half 1 | scalars] instead of the normal one: the similarity and noise-scale statistics
cost one gradient-sized extra message on those iterations and nothing on others.

Noise scale with mixed micro-batch sizes: with g_j the mean gradient of micro-batch j (b_j
samples), E|g_j|^2 = |G|^2 + tr(Sigma)/b_j, so the sample-weighted mean sum_j b_j |g_j|^2 / S has
expectation |G|^2 + tr(Sigma) M / S: a measurement at the effective size b_small = S / M (the
plan's b when every micro-batch has b samples), which ``stats.noise_scale_terms`` pairs with
|g|^2 at S. Unbiased for any mix of sizes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hpc_jabas.runtime import comm


@dataclass
class GradStats:
    """Raw statistics of one measurement iteration (all ranks hold the same values)."""
    similarity: float          # cosine(mean grad of half 0, mean grad of half 1)
    sq_micro: float            # sample-weighted mean over micro-batches of |g_micro|^2
    sq_global: float           # |g|^2 of the whole iteration's mean gradient (size S)
    b: float                   # effective micro-batch size of sq_micro: S / M (the plan's b when identical)
    S: int
    M: int
    half_samples: tuple[int, int] = (0, 0)   # samples in half 0 and half 1

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["half_samples"] = list(self.half_samples)
        return d


class HeterogeneousOptimizer:
    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters, overlap: bool = True):
        self.optimizer = optimizer
        self.named = [(n, p) for n, p in named_parameters if p.requires_grad]
        names = [n for n, _ in self.named]
        if len(set(names)) != len(names):
            raise ValueError("named_parameters has duplicate names")
        self.overlap = overlap
        self._handles: dict[int, object] = {}
        self._hooks_on = False
        self._n_local = 0
        self._done_local = 0
        self._total = 1
        self._measure = False
        self._first_global = 0
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                       for i, (_, p) in enumerate(self.named)]
        self.last_stats: GradStats | None = None

    # expose the usual optimizer surface
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, sd):
        self.optimizer.load_state_dict(sd)

    def zero_grad(self, set_to_none: bool = False):
        for _, p in self.named:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    def _make_hook(self, i: int):
        name = self.named[i][0]

        def hook(p: torch.Tensor):
            if self._hooks_on and i not in self._handles:
                if p.grad is None:      # post-accumulate-grad hooks run after .grad is set
                    raise RuntimeError(f"gradient hook of {name!r} ran before its gradient was accumulated")
                self._handles[i] = comm.allreduce_sum_async_(p.grad, name=f"hj.g.{name}",
                                                             postscale=1.0 / self._total)
        return hook

    # ---- iteration protocol ------------------------------------------------------------
    def begin(self, n_local: int, total_samples: int, measure: bool = False,
              first_global_microbatch: int = 0, b: int = 1, halves: Sequence[int] | None = None) -> None:
        """``halves``: per local micro-batch, the half (0/1) it belongs to on a measurement iteration
        (``plan.half_split(plan)[rank]``); default the parity of the global micro-batch index.
        ``b`` is accepted for compatibility and unused (the statistics use the true sample counts)."""
        if total_samples < 1:
            raise ValueError(f"total_samples={total_samples} must be >= 1")
        self.zero_grad()
        self._n_local, self._done_local = int(n_local), 0
        self._total = int(total_samples)
        self._measure = bool(measure)
        self._first_global = int(first_global_microbatch)
        self._halves = None if halves is None else [int(h) for h in halves]
        if self._halves is not None and len(self._halves) != self._n_local:
            raise ValueError(f"halves has {len(self._halves)} labels for {self._n_local} local micro-batches")
        self._handles.clear()
        self._hooks_on = self.overlap and not self._measure and self._n_local == 1
        if self._measure:
            self._even = [torch.zeros_like(p) for _, p in self.named]
            self._odd = [torch.zeros_like(p) for _, p in self.named]
            self._sq_sum = 0.0
            self._n_micro_local = 0
            self._half_n = [0, 0]

    def backward(self, loss: torch.Tensor, count: int) -> None:
        """Backward of one micro-batch's mean loss, weighted by its sample count."""
        last = self._done_local == self._n_local - 1
        self._hooks_on = self.overlap and not self._measure and last
        (loss * float(count)).backward()
        if self._measure:
            if self._halves is not None:
                parity = self._halves[self._done_local]
            else:
                parity = (self._first_global + self._done_local) % 2
            buf = self._even if parity == 0 else self._odd
            sq = 0.0
            for k, (_, p) in enumerate(self.named):
                if p.grad is not None:
                    buf[k].add_(p.grad)
                    sq += float(p.grad.double().pow(2).sum()) / count     # count * |grad of the mean loss|^2
                    p.grad.zero_()
            self._sq_sum += sq
            self._half_n[parity] += int(count)
            self._n_micro_local += 1
        self._done_local += 1

    def synchronize(self) -> None:
        """Finish the allreduce: every parameter's .grad holds the mean gradient of the S samples."""
        if self._measure:
            self._synchronize_measured()
            return
        for i, (name, p) in enumerate(self.named):
            if i in self._handles:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self._handles[i] = comm.allreduce_sum_async_(p.grad, name=f"hj.g.{name}",
                                                         postscale=1.0 / self._total)
        for h in self._handles.values():
            comm.synchronize(h)
        self._handles.clear()
        self._hooks_on = False

    def _synchronize_measured(self) -> None:
        flat = torch.cat([t.reshape(-1) for t in self._even] + [t.reshape(-1) for t in self._odd]
                         + [torch.tensor([self._sq_sum, float(self._n_micro_local),
                                          float(self._half_n[0]), float(self._half_n[1])],
                                         dtype=self._even[0].dtype if self._even else torch.float64,
                                         device=self._even[0].device if self._even else "cpu")])
        flat = flat.double() if flat.dtype != torch.float64 else flat
        red = comm.allreduce_sum(flat, name="hj.measure")
        sizes = [p.numel() for _, p in self.named]
        P = sum(sizes)
        even, odd, scal = red[:P], red[P:2 * P], red[2 * P:]
        g = (even + odd) / self._total
        off = 0
        for (_, p), sz in zip(self.named, sizes):
            p.grad = g[off:off + sz].view_as(p).to(p.dtype).clone()
            off += sz
        ne, no = float(even.norm()), float(odd.norm())
        sim = float(torch.dot(even, odd)) / (ne * no) if ne > 0 and no > 0 else float("nan")
        M = int(round(float(scal[1])))
        self.last_stats = GradStats(similarity=sim, sq_micro=float(scal[0]) / self._total,
                                    sq_global=float(g.pow(2).sum()), b=self._total / max(M, 1), S=self._total, M=M,
                                    half_samples=(int(round(float(scal[2]))), int(round(float(scal[3])))))
        self._measure = False

    def step(self, lr_scale: float = 1.0, closure=None):
        """Synchronize, then step with every group's lr multiplied by lr_scale for this step only
        (the user's scheduler keeps owning the base lr)."""
        self.synchronize()
        saved = [g["lr"] for g in self.optimizer.param_groups]
        if lr_scale != 1.0:
            for g in self.optimizer.param_groups:
                g["lr"] = g["lr"] * lr_scale
        try:
            return self.optimizer.step(closure) if closure else self.optimizer.step()
        finally:
            for g, lr in zip(self.optimizer.param_groups, saved):
                g["lr"] = lr

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
