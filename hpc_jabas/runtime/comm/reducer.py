"""The gradient reducer: the one seam between the optimizer wrapper and a backend's gradient collectives.

Every rank accumulates its weighted gradient sum (runtime/optim.py: the backward of ``loss x count / c`` with
c = S / world); the reducer turns it into ``sum over ranks / world`` in every parameter's ``.grad``: the mean
gradient of the iteration's S samples (docs/formulas.md, section 1). The HeterogeneousOptimizer drives it so:

    reducer.begin(n_local)
    for k in range(n_local):                    # micro-batch k: forward (through reducer.module) and backward
        with reducer.no_sync() if k < n_local - 1 else contextlib.nullcontext():
            ...
    if n_local == 0:
        reducer.zero_step()                     # this rank joins the gradients' collective with zeros
    reducer.finish()                            # .grad holds the reduced gradients

Three kinds implement :class:`GradReducer` (four classes):

* :class:`HookReducer` (the Horovod backend, runtime/comm/horovod_backend.py ``make_reducer``): a post-accumulate-grad
  hook per parameter starts its named allreduce during the last micro-batch's backward (Horovod fuses them);
  ``finish`` starts what did not (a parameter without a gradient: zeros) and waits;
* ``DDPReducer`` (the torch backend, runtime/comm/ddp.py): torch's own DistributedDataParallel around the user's
  model; ``no_sync`` is DDP's; the reduction ends inside the last backward; ``ScriptDDPReducer`` the same
  around a script's own wrap;
* :class:`FlatReducer` (the torch backend without a model): one fused allreduce per (device, dtype) at ``finish``.

Beside the gradients, a measurement iteration reduces its half-batch sums and the token weight
(:meth:`GradReducer.sum_async`): ``eager_extras`` says whether they may start while the gradients' sums are in
flight (Horovod matches collectives by name) or only after them, in one order on every rank (torch.distributed
matches them by call order). On torch the low-level layer (the optimizer wrapper in the script's own loop) uses
``ScriptDDPReducer`` (runtime/comm/ddp.py) around the script's own DDP wrap (reduction in the last backward,
overlapped) and, where the script has no wrap, :class:`FlatReducer`: the gradients are views of flat buffers,
each summed in one allreduce at ``finish``, after the backward (no overlap).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from hpc_jabas.errors import ConfigError

#: starts an in-place asynchronous sum (tensor, name, postscale) -> a handle; waits for a handle -> its tensor
StartSum = Callable[[torch.Tensor, str, float], Any]
WaitSum = Callable[[Any], torch.Tensor]


class PendingSum(Protocol):
    """An extra sum in flight (:meth:`GradReducer.sum_async`)."""

    def wait(self) -> torch.Tensor: ...


@runtime_checkable
class GradReducer(Protocol):
    """What both backends give the optimizer wrapper (module docstring)."""

    #: True: extra sums may start during the backward, in any order per rank (matched by name)
    eager_extras: bool
    #: what the forward runs through (DDP's wrapper), or None: the model itself
    module: torch.nn.Module | None
    #: the gradients are views of the reducer's own buffers: zeroed in place between iterations, never set to None
    #: (False: set to None, as torch's zero_grad does)
    keeps_grads: bool

    def begin(self, n_local: int) -> None:
        """A new iteration with ``n_local`` micro-batches on this rank (the gradients were zeroed)."""
        ...

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """The context of a micro-batch's forward and backward that must not reduce (all but the last)."""
        ...

    def zero_step(self) -> None:
        """A rank without micro-batches: join the gradients' reduction with zero gradients."""
        ...

    def finish(self) -> None:
        """Wait for the gradients' reduction: every ``.grad`` holds the sum over ranks / world."""
        ...

    def sum_async(self, t: torch.Tensor, name: str) -> PendingSum:
        """Start an in-place sum over ranks of ``t`` (one collective); ``wait()`` returns it."""
        ...

    def close(self) -> None:
        """Remove what the reducer installed on the parameters (hooks)."""
        ...

    def on_ready(self, fn: Callable[[], None] | None) -> None:
        """``fn()`` runs when this rank's last gradient is ready for the reduction, when the reduction itself
        blocks the last backward (DDP: its end waits for the other ranks), so that the rank's compute time
        stops there (runtime/trainer.py); a reducer whose reduction does not block the backward never calls it."""
        ...


class Pending:
    """An extra sum started by a reducer: ``wait()`` waits for its handle."""

    __slots__ = ("handle", "wait_fn")

    def __init__(self, handle: Any, wait_fn: WaitSum):
        self.handle, self.wait_fn = handle, wait_fn

    def wait(self) -> torch.Tensor:
        return self.wait_fn(self.handle)


class HookReducer:
    """Per-parameter named allreduces started from post-accumulate-grad hooks during the last micro-batch's
    backward (``overlap``), so that they overlap the rest of it and the backend fuses them (Horovod)."""

    eager_extras = True
    keeps_grads = False
    module: torch.nn.Module | None = None

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]], world: int, start: StartSum, wait: WaitSum,
                 overlap: bool = True):
        self.named = list(named)
        self.world = int(world)
        self._start, self._wait = start, wait
        self.overlap = overlap
        self._armed = False                    # hooks start sums: outside no_sync, between begin and finish
        self._handles: dict[int, Any] = {}
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(i)) for i, (_, p) in enumerate(self.named)]

    def _make_hook(self, i: int) -> Callable[[torch.Tensor], None]:
        name = self.named[i][0]

        def hook(p: torch.Tensor) -> None:
            if self._armed and i not in self._handles:
                if p.grad is None:      # post-accumulate-grad hooks run after .grad is set
                    raise RuntimeError(f"gradient hook of {name!r} ran before its gradient was accumulated")
                self._handles[i] = self._start(p.grad, f"hj.g.{name}", 1.0 / self.world)
        return hook

    def begin(self, n_local: int) -> None:
        self._handles.clear()
        self._armed = self.overlap

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        armed, self._armed = self._armed, False
        try:
            yield
        finally:
            self._armed = armed

    def zero_step(self) -> None:
        """Nothing to run: ``finish`` sends zeros for every parameter without a gradient."""

    def finish(self) -> None:
        for i, (name, p) in enumerate(self.named):
            if i in self._handles:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self._handles[i] = self._start(p.grad, f"hj.g.{name}", 1.0 / self.world)
        for h in self._handles.values():
            self._wait(h)
        self._handles.clear()
        self._armed = False

    def sum_async(self, t: torch.Tensor, name: str) -> PendingSum:
        return Pending(self._start(t, name, 1.0), self._wait)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def on_ready(self, fn: Callable[[], None] | None) -> None:
        """Never called: the sums run beside the backward, waited for in ``finish``."""


class FlatReducer:
    """No hooks: the gradients live in one flat buffer per (device, dtype) (each ``.grad`` a view of it, as DDP's
    ``gradient_as_bucket_view``: set up at the first ``finish``, zeroed in place afterwards), and ``finish`` sums
    each buffer in one collective, in place, with the postscale 1/world. The torch backend's reducer where no
    model is at hand (the optimizer wrapper used alone); no overlap with the backward; extras after the gradients."""

    eager_extras = False
    keeps_grads = True
    module: torch.nn.Module | None = None

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]], world: int, start: StartSum, wait: WaitSum):
        self.named = list(named)
        self.world = int(world)
        self._start, self._wait = start, wait
        self._flats: list[torch.Tensor] = []
        self._views: list[torch.Tensor] = []

    def begin(self, n_local: int) -> None:
        pass

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def zero_step(self) -> None:
        pass

    def _layout(self) -> None:
        """The flat buffers and the views the gradients become (their values copied in, zeros where none)."""
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, (_, p) in enumerate(self.named):
            groups.setdefault((p.device, p.dtype), []).append(i)
        self._flats, self._views = [], [torch.empty(0)] * len(self.named)
        for (dev, dt), idx in groups.items():
            flat = torch.zeros(sum(self.named[i][1].numel() for i in idx), device=dev, dtype=dt)
            off = 0
            for i in idx:
                p = self.named[i][1]
                self._views[i] = flat[off:off + p.numel()].view_as(p)
                off += p.numel()
            self._flats.append(flat)

    def finish(self) -> None:
        if not self._flats:
            self._layout()
        for (_, p), v in zip(self.named, self._views):
            if p.grad is not v:                   # first time, or set to None / replaced by the caller
                if p.grad is None:
                    v.zero_()
                else:
                    v.copy_(p.grad)
                p.grad = v
        handles = [self._start(flat, f"hj.g.flat{k}", 1.0 / self.world) for k, flat in enumerate(self._flats)]
        for h in handles:
            self._wait(h)

    def sum_async(self, t: torch.Tensor, name: str) -> PendingSum:
        return Pending(self._start(t, name, 1.0), self._wait)

    def close(self) -> None:
        pass

    def on_ready(self, fn: Callable[[], None] | None) -> None:
        """Never called: nothing is reduced before ``finish``."""


def check_model(model: torch.nn.Module) -> None:
    """ConfigError when ``model`` is already wrapped in DistributedDataParallel: hpc-jabas reduces the gradients
    itself (on the torch backend it wraps the model in DDP), so the script's wrap is to be removed."""
    from torch.nn.parallel import DistributedDataParallel
    if isinstance(model, DistributedDataParallel):
        raise ConfigError("the model given to Trainer is already wrapped in DistributedDataParallel: remove the "
                          "DistributedDataParallel(...) wrap and pass the model itself (hpc-jabas reduces the "
                          "gradients: on the torch backend it wraps the model in DDP for you)" + _wrap_knobs(model))


def _wrap_knobs(ddp: Any) -> str:
    """The DDP settings of a script's wrap that differ from hpc-jabas's wrap, with the config keys that set them
    there (the refusal names them: removing the wrap would drop them silently)."""
    cap = getattr(ddp, "bucket_bytes_cap", None)
    found = [("find_unused_parameters", getattr(ddp, "find_unused_parameters", False), "find_unused_parameters = "
              "true"), ("static_graph", getattr(ddp, "static_graph", False), "none: no_sync, which the micro-batches "
                                                                             "use, cannot run with it")]
    found.append(("bucket_cap_mb", cap / 2**20 if cap and cap != 25 * 2**20 else None,
                  f"bucket_cap_mb = {cap / 2**20:g}" if cap else ""))
    if getattr(ddp, "broadcast_buffers", False) and any(True for _ in ddp.module.buffers()):
        found.append(("broadcast_buffers", True, "nothing: buffers are averaged at each epoch end instead"))
    said = [f"{n}={v if isinstance(v, bool) else f'{v:g}'} -> {key}" for n, v, key in found if v]
    return f"; its settings, as config keys: {', '.join(said)}" if said else ""
