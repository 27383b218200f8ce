"""The torch backend's gradient reducers, both torch's own DistributedDataParallel (runtime/comm/reducer.py's
:class:`~hpc_jabas.runtime.comm.reducer.GradReducer`):

* :class:`DDPReducer`: the Trainer's model in a DDP wrap of ours (``TorchBackend.make_reducer`` with a model);
* :class:`ScriptDDPReducer`: the script's own DDP wrap, kept as it is (the low-level layer in a DDP script);

and the zero step they share (:func:`zero_step`): a rank without micro-batches joins the iteration's reduction
with zero gradients. Only DDP's public API is used: ``no_sync``, the wrapper's forward and the backward,
``require_backward_grad_sync``, its hooks. What DDP reduces: each rank's backward of ``loss x count / c``
(c = S / world, runtime/optim.py); DDP's C++ reducer, without a comm hook, divides each gradient by the world
size as it copies it into its bucket and sums each bucket in one allreduce: the mean gradient of the S samples.
Extra sums (a measuring iteration's, token weights) are the seam's, started after the gradients
(``eager_extras = False``: torch.distributed matches collectives by call order).
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm.reducer import Pending, PendingSum, StartSum, WaitSum


def zero_step(ddp: DistributedDataParallel, inner: torch.nn.Module, params: Sequence[torch.Tensor]) -> None:
    """One synced backward of zero gradients through ``ddp`` (a DistributedDataParallel around ``inner``), with
    no data and without the model (neither its forward nor its hooks run, no BatchNorm statistic moves): for this
    one call, the wrapper's public ``module`` attribute is a stand-in whose output is ``0 x sum(parameters)``, and
    ``inner`` is put back before the backward. DDP's forward prepares its reducer as for any synced forward (its
    rebuilt buckets, its bucket order), and the backward gives every parameter an exact zero gradient, reduced in
    DDP's buckets beside the other ranks' gradients: one allreduce per bucket, as theirs."""
    ddp.module = _ZeroSum(params)
    try:
        out = ddp()
    finally:
        ddp.module = inner
    out.backward()


class _ZeroSum(torch.nn.Module):
    """A zero step's stand-in module: ``0 x sum(parameters)``, every gradient exactly zero. The parameters are
    held in a plain list, not registered: the stand-in owns none of them."""

    def __init__(self, params: Sequence[torch.Tensor]):
        super().__init__()
        self.ps = list(params)

    def forward(self) -> torch.Tensor:
        return torch.stack([p.sum().to(torch.float32) * 0.0 for p in self.ps]).sum()


class DDPReducer:
    """The user's model wrapped in ``DistributedDataParallel`` (``gradient_as_bucket_view``: the gradients are
    views of DDP's buckets, no copies; buffers not synced in the forward; ``bucket_cap_mb`` the user's or DDP's
    25). The forward runs through :attr:`module`; ``no_sync`` is DDP's; DDP's reduction ends inside the last
    micro-batch's backward, so ``finish`` only checks that it ran. The moment this rank's compute ends
    (``on_ready``: the clock stops, an emulated GPU waits, before the last bucket's reduction) comes from one
    tensor hook on the parameter whose gradient the synced backward computes last, learned in the first
    iteration (where a hook on every parameter checks that each gets a gradient)."""

    eager_extras = False
    # set to None between iterations, as torch's zero_grad does: the first backward's AccumulateGrad keeps its
    # tensor and DDP copies it into the bucket (one pass), where zeroing the bucket views in place costs a memset
    # and an add (cProfile: about 1 ms per iteration for a 5M-parameter MLP on the CPU)
    keeps_grads = False

    def __init__(self, model: torch.nn.Module, start: StartSum, wait: WaitSum, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False):
        kw: dict[str, Any] = {"gradient_as_bucket_view": True}
        # DDP's knob of the config key of that name: parameters the synced backward does not reach are reduced too
        self.find_unused = kw["find_unused_parameters"] = bool(find_unused_parameters)
        opts = inspect.signature(DistributedDataParallel.__init__).parameters
        # buffers (BatchNorm's statistics) stay each rank's; the Checkpointer averages them at epoch ends
        kw["forward_sync_buffers" if "forward_sync_buffers" in opts else "broadcast_buffers"] = False
        if bucket_cap_mb is not None:
            kw["bucket_cap_mb"] = float(bucket_cap_mb)
        dev = next((p.device for p in model.parameters()), torch.device("cpu"))
        if dev.type == "cuda":
            kw["device_ids"] = [dev.index]
        self.inner = model
        self.ddp = DistributedDataParallel(model, **kw)
        self.module: torch.nn.Module | None = self.ddp
        self._start, self._wait = start, wait
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._synced_forwards = 0
        self._n_local = 0
        self._hook = self.ddp.register_forward_pre_hook(self._count)
        # the first iteration with micro-batches checks that the synced backward reaches every parameter (DDP,
        # with find_unused_parameters=False, would fail at the next forward with a long error of its own)
        self._names = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
        self._unchecked = True
        self._seen: set[int] = set()
        self._probes: list[Any] = []
        self._order: list[int] = []              # the first checked backward's gradient order (parameter ids)
        self._last: Any = None                   # the hook on the parameter whose gradient comes last
        self._ready: Callable[[], None] | None = None

    def on_ready(self, fn: Callable[[], None] | None) -> None:
        self._ready = fn

    def _count(self, module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and self.ddp.require_backward_grad_sync:
            self._synced_forwards += 1

    def begin(self, n_local: int) -> None:
        self._n_local = int(n_local)
        self._synced_forwards = 0
        if self._unchecked and self._n_local > 0 and not self._probes:
            self._probes = [p.register_hook(self._probe(id(p))) for p in self._params]

    def _probe(self, key: int) -> Callable[[torch.Tensor], None]:
        def hook(g: torch.Tensor) -> None:
            if self.ddp.require_backward_grad_sync:       # the last micro-batch's (synced) backward
                if key not in self._seen:
                    self._seen.add(key)
                    self._order.append(key)
                if len(self._seen) == len(self._params):
                    self._signal_ready()
        return hook

    def _signal_ready(self) -> None:
        if self._ready is not None:
            self._ready()

    def _on_last(self, g: torch.Tensor) -> None:
        if self.ddp.require_backward_grad_sync:
            self._signal_ready()

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.ddp.no_sync()

    def zero_step(self) -> None:
        """One synced backward of zero gradients through DDP (:func:`zero_step`)."""
        zero_step(self.ddp, self.inner, self._params)

    def finish(self) -> None:
        if self._probes:
            for h in self._probes:
                h.remove()
            self._probes, self._unchecked = [], False
            unused = [n for k, n in self._names.items() if k not in self._seen]
            if not unused and self._order and self._last is None:
                last = next(p for p in self._params if id(p) == self._order[-1])
                self._last = last.register_hook(self._on_last)
            self._seen, self._order = set(), []
            if unused and not self.find_unused:
                more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
                raise ConfigError(f"parameter(s) {', '.join(unused[:3])}{more} got no gradient in the last "
                                  "micro-batch's backward: DistributedDataParallel (the torch backend) reduces only "
                                  "parameters the loss uses; set find_unused_parameters = true (--find-unused-"
                                  "parameters), requires_grad=False on the unused ones, or backend='horovod'")
        if self._n_local > 0 and self._synced_forwards == 0:
            raise ConfigError("forward_fn did not call the model it is given: on the torch backend that is the "
                              "DistributedDataParallel wrapper, whose forward starts the gradients' reduction; call "
                              "model(...) on forward_fn's first argument (model.module is your model)")

    def sum_async(self, t: torch.Tensor, name: str) -> PendingSum:
        return Pending(self._start(t, name, 1.0), self._wait)

    def close(self) -> None:
        self._hook.remove()
        if self._last is not None:
            self._last.remove()
            self._last = None


class ScriptDDPReducer:
    """The reducer around the script's own ``DistributedDataParallel`` wrap (the low-level layer in a DDP script,
    which keeps its wrap and its forward): DDP reduces in the last micro-batch's backward, its buckets
    overlapping that backward, with its own average (the gradient / world, then a Sum: no comm hook is assumed);
    the HeterogeneousOptimizer holds DDP's ``no_sync`` from ``begin`` until the last micro-batch, over the
    script's forwards too (DDP decides in the forward whether the backward reduces). A rank without micro-batches
    joins with one zero step through the wrapper. Extras (token weights, measurements) after the gradients."""

    eager_extras = False
    keeps_grads = False

    def __init__(self, ddp: Any, start: StartSum, wait: WaitSum):
        syncs = getattr(ddp, "forward_sync_buffers", getattr(ddp, "broadcast_buffers", False))
        if syncs and any(True for _ in ddp.module.buffers()):
            flag = "forward_sync_buffers" if hasattr(ddp, "forward_sync_buffers") else "broadcast_buffers"
            raise ConfigError(f"the DistributedDataParallel model syncs its buffers in every forward ({flag}=True) "
                              "while ranks run different numbers of micro-batches: wrap it with "
                              f"DistributedDataParallel(model, {flag}=False)")
        if getattr(ddp, "static_graph", False):
            raise ConfigError("the DistributedDataParallel model was built with static_graph=True, which cannot run "
                              "no_sync (all but the last micro-batch run in it): wrap it without static_graph")
        self.ddp = ddp
        self.module: torch.nn.Module | None = ddp
        self.inner = ddp.module
        self._params = [p for p in self.inner.parameters() if p.requires_grad]
        self._start, self._wait = start, wait
        self._n_local = 0
        self._synced_forwards = 0
        self._hook = ddp.register_forward_pre_hook(self._count)

    def _count(self, module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and self.ddp.require_backward_grad_sync:
            self._synced_forwards += 1

    def begin(self, n_local: int) -> None:
        self._n_local, self._synced_forwards = int(n_local), 0

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.ddp.no_sync()

    def zero_step(self) -> None:
        """One synced backward of zero gradients through the script's wrapper (:func:`zero_step`)."""
        zero_step(self.ddp, self.inner, self._params)

    def finish(self) -> None:
        if self._n_local > 0 and self._synced_forwards == 0:
            raise ConfigError("the last micro-batch's forward did not run through the DistributedDataParallel "
                              "wrapper, so DDP reduced nothing: call the wrapper (ddp(x)), not ddp.module(x)")

    def sum_async(self, t: torch.Tensor, name: str) -> PendingSum:
        return Pending(self._start(t, name, 1.0), self._wait)

    def close(self) -> None:
        self._hook.remove()

    def on_ready(self, fn: Callable[[], None] | None) -> None:
        """Never called (the Trainer wraps the model itself)."""
