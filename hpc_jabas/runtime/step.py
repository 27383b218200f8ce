"""One micro-batch: what the Trainer runs per micro-batch and the profiler times.

    loss_sum = None
    for batch, count in my_micro_batches:
        loss_sum = micro_step(model, forward_fn, opt, batch, count, device, loss_sum)
    mean_loss = float(loss_sum) / samples        # the one host sync of the loss, per iteration

The batch is moved to the device (tensors inside tuples, lists, dicts and namedtuples, or any
object with ``.to(device)``); ``forward_fn(model, batch)`` returns the micro-batch's mean loss;
``opt.backward(loss, count)`` (the HeterogeneousOptimizer) accumulates ``count`` x its gradient.
The loss stays on the device: no ``float()`` per micro-batch, so a GPU is not stalled for it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch


class WeightedBackward(Protocol):
    """What the step needs of the optimizer (HeterogeneousOptimizer.backward)."""

    def backward(self, loss: torch.Tensor, count: int) -> None: ...


def default_forward(loss_fn: Callable[[Any, Any], torch.Tensor]) -> Callable[[torch.nn.Module, Any], torch.Tensor]:
    """forward_fn for batches (x, y, ...): ``loss_fn(model(x), y)``."""
    return lambda model, batch: loss_fn(model(batch[0]), batch[1])


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = True) -> Any:
    """``batch`` with every tensor on ``device``; containers keep their type, other values stay."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
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


def micro_step(model: torch.nn.Module, forward_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
               opt: WeightedBackward, batch: Any, count: int, device: torch.device | str,
               loss_sum: torch.Tensor | None = None) -> torch.Tensor:
    """Run one micro-batch of ``count`` samples; return ``loss_sum + count * loss``, detached, on the device."""
    loss = forward_fn(model, to_device(batch, device))
    opt.backward(loss, count)
    part = loss.detach() * count
    return part if loss_sum is None else loss_sum + part
