"""One micro-batch: what the Trainer runs per micro-batch and the profiler times.

    sums = None
    for batch, count in my_micro_batches:
        sums = micro_step_sums(model, forward_fn, opt, batch, count, device, sums)
    loss_sum, weight = read_sums(sums, opt, samples)     # the one host read of the loss, per iteration

The batch is moved to the device (tensors inside tuples, lists, dicts and namedtuples, or any
object with ``.to(device)``); ``forward_fn(model, batch)`` returns the micro-batch's mean loss, or
``(loss, weight)`` for a loss that is the mean over ``weight`` units (e.g. tokens; a tensor or a
number); ``opt.backward(loss, count[, weight])`` (the HeterogeneousOptimizer) accumulates
``count`` (or ``weight``) x its gradient. The forward runs under the optimizer's autocast (config
key ``amp``). The sums stay on the device: no ``float()`` per micro-batch, so a GPU is not
stalled for it. ``micro_step`` is the single-tensor form (the loss sum only) the profiler uses.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from hpc_jabas.runtime.gradstats import scalar, stat_dtype

if TYPE_CHECKING:
    from hpc_jabas.runtime.clock import IterationClock
    from hpc_jabas.runtime.emulate import Emulator


class WeightedBackward(Protocol):
    """What the step needs of the optimizer (HeterogeneousOptimizer.backward)."""

    def backward(self, loss: torch.Tensor, count: int, weight: torch.Tensor | None = None) -> None: ...


class LossSums(NamedTuple):
    """Device accumulators of one iteration on this rank: sum of weight x loss and sum of weights
    (plain losses: the sample counts, kept as a host number)."""
    loss: torch.Tensor
    weight: torch.Tensor | float


def default_forward(loss_fn: Callable[[Any, Any], torch.Tensor]) -> Callable[[torch.nn.Module, Any], torch.Tensor]:
    """forward_fn for batches (x, y, ...): ``loss_fn(model(x), y)``."""
    return lambda model, batch: loss_fn(model(batch[0]), batch[1])


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = True) -> Any:
    """``batch`` with every tensor on ``device``; containers keep their type, other values stay."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if type(batch) is tuple:                      # (x, y, ...): the common batch, in one comprehension
        return tuple([x.to(device, non_blocking=non_blocking) if isinstance(x, torch.Tensor)
                      else to_device(x, device, non_blocking) for x in batch])
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):           # namedtuple
        return type(batch)(*(to_device(x, device, non_blocking) for x in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(x, device, non_blocking) for x in batch)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    to = getattr(batch, "to", None)
    if callable(to):                               # e.g. a tokenizer's BatchEncoding, a custom batch
        return to(device)
    return batch


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the module DDP wraps) is a ``torch.compile`` wrapper (OptimizedModule)."""
    return hasattr(model, "_orig_mod") or hasattr(getattr(model, "module", None), "_orig_mod")


def mark_batch_dynamic(batch: Any, count: int) -> None:
    """Mark the first dimension of every tensor of ``batch`` whose first dimension is ``count`` as dynamic for
    torch.compile (``maybe_mark_dynamic``: never an error where Dynamo specialises it): a change of the
    micro-batch size b (a new plan, the epoch's tail) then reuses the compiled graph instead of recompiling
    (bench/compile_recompiles.py: one graph for 5 sizes, against 2 by default and 5 with dynamic=False)."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() >= 1 and batch.shape[0] == count:
            torch._dynamo.maybe_mark_dynamic(batch, 0)
    elif isinstance(batch, (tuple, list)):
        for x in batch:
            mark_batch_dynamic(x, count)
    elif isinstance(batch, Mapping):
        for x in batch.values():
            mark_batch_dynamic(x, count)


def micro_step_sums(model: torch.nn.Module, forward_fn: Callable[[torch.nn.Module, Any], Any],
                    opt: WeightedBackward, batch: Any, count: int, device: torch.device | str,
                    sums: LossSums | None = None) -> LossSums:
    """Run one micro-batch of ``count`` samples; return ``sums`` plus its (weight x loss, weight), detached."""
    autocast = getattr(opt, "autocast", None)
    micro = getattr(opt, "micro", None)           # the reducer's no_sync for all but the last micro-batch
    batch = to_device(batch, device)
    if is_compiled(model):
        mark_batch_dynamic(batch, count)          # b changes with the plan: no recompile per size
    with micro() if callable(micro) else contextlib.nullcontext():
        with autocast() if callable(autocast) else contextlib.nullcontext():
            out = forward_fn(model, batch)
        if isinstance(out, tuple):
            if len(out) != 2:
                raise ValueError(f"forward_fn returned a tuple of {len(out)}; return a loss or (loss, weight)")
            loss, weight = out
            w = scalar(weight, stat_dtype(loss.device), loss.device)
            opt.backward(loss, count, weight=w)
            part, wsum = loss.detach().to(w.dtype) * w, w.detach()
            if sums is None:
                return LossSums(part, wsum)
            return LossSums(sums.loss + part, sums.weight + wsum)
        loss = out
        opt.backward(loss, count)
    part = loss.detach() * count
    if sums is None:
        return LossSums(part, float(count))
    return LossSums(sums.loss + part, sums.weight + count)


def read_sums(sums: LossSums | None, opt: Any, samples: int) -> tuple[float, float]:
    """The iteration's one host read of the loss: (loss sum in sample units, this rank's weight sum).

    For token-weighted losses the sum is ``samples x sum_rank(weight x loss) / W`` with W the global weight
    (``opt.weight_total()``, collective: every rank calls this), so that sum over ranks / samples is the
    iteration's token-mean loss, like sum over ranks / samples is the sample-mean loss of plain losses."""
    wt = opt.weight_total() if hasattr(opt, "weight_total") else None
    if wt is None:
        if sums is None:
            return 0.0, 0.0
        return float(sums.loss), float(sums.weight)
    if sums is None:
        return 0.0, 0.0
    loss, w, W = torch.stack([sums.loss.reshape(()), torch.as_tensor(sums.weight).to(sums.loss), wt.to(sums.loss)]
                             ).tolist()
    return (loss * samples / W if W > 0 else 0.0), w


def micro_step(model: torch.nn.Module, forward_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
               opt: WeightedBackward, batch: Any, count: int, device: torch.device | str,
               loss_sum: torch.Tensor | None = None) -> torch.Tensor:
    """Run one micro-batch of ``count`` samples; return ``loss_sum + weight * loss`` (weight: the sample count,
    or the token weight of a ``(loss, weight)`` forward), detached, on the device."""
    s = micro_step_sums(model, forward_fn, opt, batch, count, device)
    return s.loss if loss_sum is None else loss_sum + s.loss


class ReadyHook(Protocol):
    """What the micro-batch loop needs of the gradients' reducer (runtime/comm/reducer.py): ``on_ready``."""

    def on_ready(self, fn: Callable[[], None] | None) -> None: ...


def timed_micro_batches(mine: Sequence[Any], clock: IterationClock, reducer: ReadyHook, emu: Emulator | None,
                        iteration: int, step: Callable[[Any, LossSums | None], LossSums]
                        ) -> tuple[LossSums | None, float]:
    """This rank's micro-batches of the iteration (``step(idx, sums)``: one micro-batch, the loss kept on the
    device), each timed as compute, then (emulating) its GPU type's wait; returns the loss sums and the emulated
    waits. A reducer whose reduction blocks the last backward (DDP: its end waits for the other ranks) calls
    ``ready`` when this rank's last gradient is ready: the clock stops there and an emulated GPU waits there,
    before the reduction starts, so that neither counts the wait for slower ranks as this rank's compute."""
    st = {"computing": False, "emulated": False, "b": 0, "wait": 0.0}

    def ready() -> None:
        if st["computing"]:
            st["computing"] = False
            clock.compute_stop()
            if emu is not None:
                st["wait"] += emu.wait_next(int(st["b"]), iteration)
                st["emulated"] = True
    sums: LossSums | None = None
    if emu is not None:
        emu.start()
    reducer.on_ready(ready)
    for idx in mine:
        clock.compute_start()
        st.update(computing=True, emulated=False, b=len(idx))
        sums = step(idx, sums)
        if st["computing"]:
            st["computing"] = False
            clock.compute_stop()
        if emu is not None and not st["emulated"]:
            st["wait"] += emu.wait_next(len(idx), iteration)
    reducer.on_ready(None)
    return sums, float(st["wait"])
