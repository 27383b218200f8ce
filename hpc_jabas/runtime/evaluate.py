"""Evaluation, optionally distributed, and the epoch-end metric that feeds ReduceLROnPlateau.

    eval_fn = DistributedEval(val_dataset, batch_size=256)             # loss (+ accuracy) by default
    eval_fn = DistributedEval(val_dataset, metric_fn=my_sums)          # your own sums
    Trainer(model, opt, train_ds, loss_fn, eval_fn=eval_fn, scheduler=ReduceLROnPlateau(opt))

Every rank calls ``eval_fn(model)`` at the epoch end (the Trainer does, after averaging the
BatchNorm buffers, runtime/batchnorm.py). Distributed, rank r evaluates the contiguous shard r of
the dataset (``shard_range``), each rank sums its metrics, and one allreduce of the sums
leaves the same result on every rank: exactly the one-process evaluation (up to summation order).

``metric_fn(model, batch) -> dict`` returns *sums* over the batch (tensors or numbers), e.g.
``{"loss": loss_sum, "correct": n_correct, "count": n}``. The result divides every sum by the
total of "count" (the number of samples when the dict has no "count"; a language model returns
its token count there, for a token mean) and keeps ``count``. The default metric_fn (from the
Trainer-style ``loss_fn`` with a mean reduction): ``loss`` and, for class logits with integer
targets, ``accuracy``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.runtime.step import to_device

MetricFn = Callable[[torch.nn.Module, Any], Mapping[str, Any]]


def shard_range(n: int, rank: int, world: int) -> range:
    """Rank ``rank``'s contiguous share of ``n`` items (sizes differ by at most one)."""
    lo = n * rank // world
    return range(lo, n * (rank + 1) // world)


def loss_metric(loss_fn: Callable[[Any, Any], torch.Tensor]) -> MetricFn:
    """metric_fn for (x, y) batches and a mean-reduced loss: sums of loss (and of correct predictions)."""
    def metric(model: torch.nn.Module, batch: Any) -> dict[str, Any]:
        x, y = batch[0], batch[1]
        out = model(x)
        n = y.shape[0]
        res: dict[str, Any] = {"loss": loss_fn(out, y).detach() * n, "count": n}
        if out.dim() == 2 and y.dim() == 1 and not y.is_floating_point():
            res["correct"] = (out.argmax(1) == y).sum()
        return res
    return metric


def _batches(dataset: Any, idx: range, batch_size: int, collate: Callable | None):
    tensors = getattr(dataset, "tensors", None)
    for s in range(idx.start, idx.stop, batch_size):
        e = min(s + batch_size, idx.stop)
        if tensors is not None and collate is None:
            yield tuple(t[s:e] for t in tensors)
        else:
            yield (collate or torch.utils.data.default_collate)([dataset[i] for i in range(s, e)])


def evaluate(model: torch.nn.Module, dataset: Any, metric_fn: MetricFn, batch_size: int = 256,
             distributed: bool = True, collate_fn: Callable | None = None,
             device: torch.device | None = None) -> dict[str, float]:
    """Collective when ``distributed``: this rank's shard, summed metrics allreduced (see module doc).
    Not distributed: the whole dataset on this rank. The model is put in eval mode and back."""
    if device is None:
        p = next(iter(model.parameters()), None)
        device = p.device if p is not None else torch.device("cpu")
    world, rank = (comm.size(), comm.rank()) if distributed else (1, 0)
    idx = shard_range(len(dataset), rank, world)
    sums: dict[str, torch.Tensor] = {}
    samples = 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in _batches(dataset, idx, batch_size, collate_fn):
                batch = to_device(batch, device)
                res = metric_fn(model, batch)
                for k, v in res.items():
                    t = torch.as_tensor(v, dtype=torch.float64, device=device).detach().reshape(())
                    sums[k] = sums[k] + t if k in sums else t
                samples += _batch_len(batch)
    finally:
        model.train(was_training)
    keys = comm.broadcast_object(sorted(sums), name="hj.eval_keys") if distributed and world > 1 else sorted(sums)
    vec = torch.stack([sums.get(k, torch.zeros((), dtype=torch.float64, device=device)) for k in keys]
                      + [torch.tensor(float(samples), dtype=torch.float64, device=device)])
    if distributed and world > 1:
        vec = comm.allreduce_sum(vec, name="hj.eval")
    vals = vec.tolist()                     # the evaluation's one host read
    tot = dict(zip(keys, vals[:-1], strict=True))
    count = tot.pop("count", vals[-1])
    out = {k: v / count if count else float("nan") for k, v in tot.items()}
    if "correct" in out:
        out["accuracy"] = out.pop("correct")
    out["count"] = count
    return out


def _batch_len(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, (tuple, list)):
        return _batch_len(batch[0])
    return len(batch)


class DistributedEval:
    """An ``eval_fn`` for the Trainer: ``evaluate`` of ``dataset`` with ``metric_fn`` (or ``loss_fn``'s
    loss and accuracy), sharded over the ranks unless ``distributed=False``."""

    def __init__(self, dataset: Any, metric_fn: MetricFn | None = None, loss_fn: Callable | None = None,
                 batch_size: int = 256, distributed: bool = True, collate_fn: Callable | None = None):
        if metric_fn is None and loss_fn is None:
            loss_fn = torch.nn.functional.cross_entropy
        self.dataset, self.batch_size, self.distributed, self.collate_fn = dataset, batch_size, distributed, collate_fn
        self.metric_fn: MetricFn = metric_fn or loss_metric(loss_fn)  # type: ignore[arg-type]

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        return evaluate(model, self.dataset, self.metric_fn, self.batch_size, self.distributed, self.collate_fn)


def epoch_line(epoch: int, epochs: int, iteration: int, B: int, ev: Any) -> str:
    """The log line of an epoch end (rank 0): "epoch 1/3 end (iteration 48, B=192): test loss 0.412, accuracy
    0.871 (360 samples)"; without an evaluation, "no evaluation (no eval_fn)"."""
    head = f"epoch {epoch + 1}/{epochs} end (iteration {iteration}, B={B}): "
    if ev is None:
        return head + "no evaluation (no eval_fn)"
    if not isinstance(ev, dict):
        return head + f"evaluation {ev:.4g}" if isinstance(ev, (int, float)) else head + f"evaluation {ev}"
    names = {k: k if k.lower().startswith("test") else f"test {k}" for k in ev}
    vals = [f"{names[k]} {v:.4g}" if isinstance(v, (int, float)) else f"{names[k]} {v}" for k, v in ev.items()
            if k != "count"]
    count = f" ({int(ev['count'])} samples)" if isinstance(ev.get("count"), (int, float)) else ""
    return head + ", ".join(vals) + count


def plateau_value(ev: Any, key: str) -> float | None:
    """The number ReduceLROnPlateau steps on: ``ev`` itself, or ``ev[key]`` for a dict; None when absent."""
    if ev is None:
        return None
    if isinstance(ev, Mapping):
        if key not in ev:
            from hpc_jabas.errors import ConfigError
            raise ConfigError(f"eval_metric={key!r} is not in the evaluation result (keys: {', '.join(map(str, ev))}); "
                              "set eval_metric to one of them")
        ev = ev[key]
    return float(ev)


def is_plateau(scheduler: Any) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def step_plateau(scheduler: Any, ev: Any, key: str, rank: int) -> float | None:
    """Collective: rank 0's metric (``plateau_value``) to every rank, then ``scheduler.step(metric)``
    everywhere, so the lr stays identical on all ranks even when only rank 0 evaluated."""
    mine: float | None = None
    err: str | None = None
    if rank == 0:
        try:
            mine = plateau_value(ev, key)
        except Exception as e:      # every rank raises rank 0's error, none hangs
            err = str(e)
    mine, err = comm.broadcast_object((mine, err), name="hj.plateau")
    if err:
        from hpc_jabas.errors import ConfigError
        raise ConfigError(err)
    if mine is not None:
        scheduler.step(mine)
    return mine
