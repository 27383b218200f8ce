"""Measurement iterations: the gradient statistics of the batch-size policies for one extra reduction.

On a measurement iteration the HeterogeneousOptimizer runs its normal weighted reduction of the
full gradient sum (the backend's reducer, runtime/comm/reducer.py) and, besides it, a
:class:`Measurement` keeps

- ``h0``: the sum of the gradients of this rank's half-0 micro-batches, in one flat buffer per
  (device, dtype) group (the parameters' dtype; fp32 for fp16/bf16 parameters), filled from
  per-parameter pre-accumulation hooks: 1x the parameter memory, freed after the iteration;
- the sum over micro-batches of |g_in|^2 / w, with g_in = w x (the micro-batch's gradient) the
  gradient the backward of ``w * loss`` accumulates (w: its sample count, or its token weight),
  from the per-parameter norms of g_in (device tensors, fp64; fp32 on devices without fp64);
- the micro-batch count and the samples of each half (host integers).

``h0`` is reduced through the reducer's ``sum_async``: on Horovod per parameter (fused like the
gradients), started from the hooks of this rank's last micro-batch so that the reduction overlaps
the rest of that backward; on torch (whose sums are matched by call order) one allreduce per flat
buffer after the backward, never one per parameter. One small scalar tensor is allreduced after the
backward. Half 1 is ``N g - H0`` (g
the mean gradient of the iteration, N its normaliser: S samples, or the global token weight),
computed in place in ``h0``. Every scalar stays on the device until the optimizer's one host
read of the iteration (:meth:`Measurement.values`).

A noise-only measurement (``similarity=False``: what the noise scale needs, taken every
``measure_every`` iterations) keeps no ``h0`` buffer and reduces no gradient-sized tensor: only the
micro-batch norms' sum and the counts (the one small scalar allreduce) beside the normal gradient
allreduce; its :class:`GradStats` has ``similarity`` None.

With g_j the mean gradient of micro-batch j (w_j samples or tokens) and W = sum_j w_j,
``sq_micro = sum_j w_j |g_j|^2 / W`` has expectation |G|^2 + tr(Sigma) M / S in sample units (see
optim.py), so the statistics keep their meaning for token-weighted losses too.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hpc_jabas.runtime.comm.reducer import GradReducer, PendingSum

HALF_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class GradStats:
    """Raw statistics of one measurement iteration (all ranks hold the same values)."""
    similarity: float | None   # cosine(mean grad of half 0, mean grad of half 1); None: a noise-only measurement
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


def stat_dtype(device: torch.device) -> torch.dtype:
    """fp64 for the statistics' scalars, fp32 where the device has no fp64 (Apple MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def scalar(x: torch.Tensor | float, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``x`` as a 0-d tensor of ``dtype`` on ``device`` (a Python number goes in at full precision)."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype).reshape(())
    return torch.tensor(float(x), dtype=dtype, device=device)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The half-batch buffer's dtype for parameters of ``dtype``: theirs, fp32 for half precision."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def sq_norms(tensors: Sequence[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    """sum of |t|^2 over ``tensors`` as one device scalar of ``out_dtype`` (foreach norms per dtype group)."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    total: torch.Tensor | None = None
    for (_, dt), ts in groups.items():
        norms = torch._foreach_norm(ts, 2, dtype=torch.float32) if dt in HALF_DTYPES else torch._foreach_norm(ts)
        part = torch.stack(norms).to(out_dtype).square().sum()
        total = part if total is None else total + part.to(total.device)
    if total is None:
        raise ValueError("sq_norms of no tensors")
    return total


def mul_(tensors: Sequence[torch.Tensor], factor: torch.Tensor | float) -> None:
    """In place: every tensor times ``factor`` (a device scalar, cast per dtype group, or a number)."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    for (dev, dt), ts in groups.items():
        f = factor.to(device=dev, dtype=dt) if isinstance(factor, torch.Tensor) else factor
        torch._foreach_mul_(ts, f)


class Measurement:
    """One measurement iteration's half-batch buffer, hooks and scalars (module docstring)."""

    def __init__(self, params: Sequence[torch.Tensor], halves: Sequence[int], overlap: bool = True,
                 similarity: bool = True, reducer: GradReducer | None = None):
        """``similarity``: keep and reduce the half-0 sum (False: the noise scale's scalars only). ``reducer``: its
        ``sum_async`` reduces the extra sums; per parameter from the last backward's hooks when its extras may
        start early (``eager_extras``, Horovod: it fuses them), else one sum per flat buffer after the backward."""
        self.params = list(params)
        self.similarity = bool(similarity)
        self._reducer = reducer
        self.eager = reducer is None or reducer.eager_extras
        self.overlap = overlap and self.eager
        self.halves = [int(h) for h in halves]
        if any(h not in (0, 1) for h in self.halves):
            raise ValueError(f"half labels must be 0 or 1, got {sorted(set(self.halves))}")
        dev = self.params[0].device if self.params else torch.device("cpu")
        self.sd = stat_dtype(dev)
        self.device = dev
        sizes: dict[tuple[torch.device, torch.dtype], int] = {}
        for p in self.params if self.similarity else []:
            k = (p.device, acc_dtype(p.dtype))
            sizes[k] = sizes.get(k, 0) + p.numel()
        # uninitialised: the first half-0 gradient of a parameter is copied in, the untouched ones zeroed at
        # launch (no zero-fill pass over the buffer)
        self.flat = {k: torch.empty(n, device=k[0], dtype=k[1]) for k, n in sizes.items()}
        self._touched = [False] * len(self.params)
        offs = dict.fromkeys(sizes, 0)
        self.h0: list[torch.Tensor] = []
        for p in self.params if self.similarity else []:
            k = (p.device, acc_dtype(p.dtype))
            self.h0.append(self.flat[k][offs[k]:offs[k] + p.numel()].view_as(p))
            offs[k] += p.numel()
        self.sq = torch.zeros((), device=dev, dtype=self.sd)
        self.m_local = 0
        self.samples = [0, 0]
        self._half = 0
        self._last = False
        self._parts: list[torch.Tensor] = []
        self._hooks = [p.register_hook(self._make_hook(i)) for i, p in enumerate(self.params)]
        self._handles: dict[str, PendingSum] = {}
        self._held: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None   # |g|^2, N, factor (hold)

    def _make_hook(self, i: int) -> Callable[[torch.Tensor], None]:
        def hook(g: torch.Tensor) -> None:       # the micro-batch's gradient, before accumulation into .grad
            if self._half == 0 and self.similarity:
                if self._touched[i]:
                    self.h0[i].add_(g)
                else:
                    self.h0[i].copy_(g)
                    self._touched[i] = True
            if self._last and self.overlap and self.similarity:   # final: reduce it during the rest of the backward
                self._reduce_h0(i)
            self._parts.append(torch.linalg.vector_norm(g, dtype=torch.float32) if g.dtype in HALF_DTYPES
                               else torch.linalg.vector_norm(g))
        return hook

    def start_micro(self, k: int) -> None:
        """Before the backward of this rank's k-th micro-batch."""
        if k >= len(self.halves):
            raise ValueError(f"micro-batch {k} has no half label ({len(self.halves)} given)")
        self._half = self.halves[k]
        self._last = k == len(self.halves) - 1
        self._parts = []

    def end_micro(self, count: int, weight: torch.Tensor | None) -> None:
        """After its backward: add |g_in|^2 / w (w = the token weight, else the sample count)."""
        if self._parts:
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for t in self._parts:
                by_dtype.setdefault(t.dtype, []).append(t)
            sq = sum(torch.stack(ts).to(self.sd).square().sum() for ts in by_dtype.values())
            assert isinstance(sq, torch.Tensor)
            self.sq += sq / (weight.to(self.sd) if weight is not None else float(count))
        self._parts = []
        self.m_local += 1
        self.samples[self._half] += int(count)

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _reduce_h0(self, i: int) -> None:
        key = f"hj.m.h0.{i}"
        if key not in self._handles:
            if not self._touched[i]:
                self.h0[i].zero_()
                self._touched[i] = True
            self._handles[key] = self._sum(self.h0[i], key)

    def _sum(self, t: torch.Tensor, name: str) -> PendingSum:
        if self._reducer is None:
            raise RuntimeError("a measurement without a reducer cannot reduce its sums")
        return self._reducer.sum_async(t, name)

    def launch(self) -> None:
        """Start the extra reductions not started yet: H0 per parameter when the reducer's extras are eager
        (Horovod fuses them; most started during the last backward), else one sum per flat buffer (one
        collective for parameters of one device and dtype); and [sq, M, n0, n1] in one small tensor."""
        self.remove_hooks()
        if self.eager:
            for i in range(len(self.h0)):
                self._reduce_h0(i)
        else:
            for i, done in enumerate(self._touched[:len(self.h0)]):      # no h0 for a noise-only measurement
                if not done:
                    self.h0[i].zero_()
                    self._touched[i] = True
            for k, flat in enumerate(self.flat.values()):
                self._handles[f"hj.m.h0.{k}"] = self._sum(flat, f"hj.m.h0.{k}")
        counts = torch.tensor([self.m_local, self.samples[0], self.samples[1]], dtype=self.sd)
        self.scal = torch.cat([self.sq.reshape(1), counts.to(self.device, non_blocking=True)])
        self._handles["hj.m.scal"] = self._sum(self.scal, "hj.m.scal")

    def wait(self) -> None:
        for h in self._handles.values():
            h.wait()
        self._handles = {}

    def values(self, grads: Sequence[torch.Tensor], norm: torch.Tensor | float,
               factor: torch.Tensor | float) -> torch.Tensor:
        """Device vector [sq_sum, M, n0, n1, |g|^2, |H0|^2, |H1|^2, N] (the halves' norms NaN when noise-only;
        ``grads``: the reduced mean gradient, unscaled; ``norm``: N; ``factor``: what turns the hooks' gradients
        into weight x gradient, i.e. the backward's normaliser c over the loss scale). Turns h0 into H1 / N in place."""
        if not self.similarity:                                 # noise only: no halves' norms (NaN)
            self.hold(grads, norm, factor)
            return self.read_held()
        sd = self.sd
        N = scalar(norm, sd, self.device)
        inv = scalar(factor, sd, self.device)
        g2 = sq_norms(grads, sd)
        sq_sum = self.scal[0] * inv * inv
        a = sq_norms(self.h0, sd) * inv * inv                   # |H0|^2, unscaled
        mul_(self.h0, -inv / N)                                 # -H0 / N ...
        torch._foreach_add_(self.h0, list(grads))               # ... + g = H1 / N
        c = sq_norms(self.h0, sd) * N * N                       # |H1|^2
        return torch.stack([sq_sum, self.scal[1], self.scal[2], self.scal[3], g2, a, c, N])

    def hold(self, grads: Sequence[torch.Tensor], norm: torch.Tensor | float, factor: torch.Tensor | float) -> None:
        """A noise-only measurement read later (:meth:`read_held`, e.g. in the next iteration): what needs this
        iteration's reduced gradient (|g|^2, N, the factor) is taken now as device scalars, with no host read and no
        wait; the reduction of the scalars [sq, M, n0, n1] stays in flight until then."""
        if self.similarity:
            raise RuntimeError("only a noise-only measurement can be read later (its halves need the gradient)")
        sd, dev = self.sd, self.device
        self._held = (sq_norms(grads, sd), scalar(norm, sd, dev), scalar(factor, sd, dev))

    def read_held(self) -> torch.Tensor:
        """The held measurement's device vector (as :meth:`values`), once its scalars' reduction is waited for."""
        self.wait()
        if self._held is None:
            raise RuntimeError("no measurement is held (hold() first)")
        g2, N, inv = self._held
        nan = torch.full((), float("nan"), dtype=self.sd, device=self.device)
        return torch.stack([self.scal[0] * inv * inv, self.scal[1], self.scal[2], self.scal[3], g2, nan, nan, N])

    @staticmethod
    def stats(v: Sequence[float], S: int) -> GradStats:
        """GradStats from :meth:`values` read on the host."""
        sq_sum, M_, n0, n1, g2, a, c, N = (float(x) for x in v)
        sim: float | None = None                                # a and c NaN: a noise-only measurement
        if a == a and c == c:
            dot = 0.5 * (N * N * g2 - a - c)                    # <H0, H1> from |H0 + H1|^2 = N^2 |g|^2
            sim = dot / (a * c) ** 0.5 if a > 0 and c > 0 else float("nan")
            sim = max(-1.0, min(1.0, sim)) if sim == sim else sim
        M = int(round(M_))
        return GradStats(similarity=sim, sq_micro=sq_sum / N, sq_global=g2, b=S / max(M, 1), S=S, M=M,
                         half_samples=(int(round(n0)), int(round(n1))))
