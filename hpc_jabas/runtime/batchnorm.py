"""BatchNorm under heterogeneous data parallelism: the semantics, and the running buffers' averaging.

**Normalisation statistics.** In training mode every BatchNorm layer normalises over *one
micro-batch of b samples* (as IIDP does): the statistics never span micro-batches, ranks or GPU
types, so a rank running 1 micro-batch and a rank running 4 compute exactly what a single process
running the same micro-batches one after another computes, whatever the mix of GPUs. They do
depend on b: set ``micro_batch`` (config key ``[train] micro_batch``) to pin b, so that BN's
behaviour does not drift when the adaptive policy changes B (the planner then changes only the
number of micro-batches per rank). A model with BatchNorm layers gets one b on every rank by
default (``identical_micro_batch = "auto"``, core/planning/planner.py), so every micro-batch has b
samples; only the shrunk last iteration of an epoch (``tail = "shrink"``) can hold fewer.

**Running buffers.** ``running_mean``/``running_var``/``num_batches_tracked`` are updated locally
on each rank (a rank with more micro-batches updates them more often), so they drift apart
between ranks. :class:`BufferAverager` averages them over the ranks, weighted by the samples each
rank processed since the previous averaging, with one allreduce of the flattened buffers (fp64),
before every evaluation and every checkpoint (Trainer: ``_end_epoch`` and ``save_checkpoint``).
After it every rank holds the same buffers, so evaluation and the checkpoint do not depend on
which rank they come from. ``num_batches_tracked`` is rounded back to an integer.
"""
from __future__ import annotations

import torch

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm import seam as comm


def batchnorm_modules(model: torch.nn.Module) -> list[torch.nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def batch_coupled_layers(model: torch.nn.Module) -> list[str]:
    """Class names of the layers whose output depends on the batch's composition (BatchNorm): what
    ``core.planning.make_planner`` takes as ``coupled_layers``. A SyncBatchNorm layer is one ConfigError line
    (:func:`refuse_sync_batchnorm`)."""
    refuse_sync_batchnorm(model)
    return sorted({type(m).__name__ for m in batchnorm_modules(model)})


def refuse_sync_batchnorm(model: torch.nn.Module) -> None:
    """ConfigError naming the model's SyncBatchNorm layers: each forward of one reduces its statistics over the
    ranks, and the ranks run unequal numbers of micro-batches, so those reductions would not match (a hang, or
    torch's long error). BatchNorm trains here: each micro-batch normalises by its own statistics, and the
    running buffers are averaged over the ranks (weighted by samples) at each epoch end."""
    names = [n or "(the model)" for n, m in model.named_modules() if isinstance(m, torch.nn.SyncBatchNorm)]
    if names:
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        raise ConfigError(f"the model has SyncBatchNorm layers ({', '.join(names[:3])}{more}), which reduce their "
                          "statistics over the ranks in every forward while the ranks run unequal numbers of "
                          "micro-batches; keep BatchNorm (drop the nn.SyncBatchNorm.convert_sync_batchnorm call): "
                          "its running statistics are averaged over the ranks at each epoch end")


def running_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    """The running statistics buffers of every BatchNorm layer, in module order (those that track them)."""
    out: list[torch.Tensor] = []
    for m in batchnorm_modules(model):
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            t = getattr(m, name, None)
            if isinstance(t, torch.Tensor):
                out.append(t)
    return out


def average_buffers(buffers: list[torch.Tensor], weight: float) -> None:
    """Collective: every buffer becomes sum_r weight_r * buf_r / sum_r weight_r, in place.
    One allreduce of [flat buffers * weight | weight] (fp64). When the weights sum to 0 on all
    ranks the plain mean is used."""
    if not buffers:
        return
    dev = buffers[0].device
    flat = torch.cat([b.detach().reshape(-1).to(device=dev, dtype=torch.float64) for b in buffers])
    w = torch.tensor([float(weight), 1.0], dtype=torch.float64, device=dev)
    red = comm.allreduce_sum(torch.cat([flat * w[0], flat, w]), name="hj.bn_buffers")
    n = flat.numel()
    total, ranks = red[2 * n], red[2 * n + 1]
    mean = red[:n] / total if float(total) > 0 else red[n:2 * n] / ranks
    off = 0
    with torch.no_grad():
        for b in buffers:
            k = b.numel()
            part = mean[off:off + k].reshape(b.shape)
            b.copy_(part.round() if not b.is_floating_point() else part)
            off += k


class BufferAverager:
    """Averages a model's BatchNorm running buffers over ranks, weighted by the samples each rank
    processed since the previous averaging (every rank calls at the same iteration)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.has_bn = bool(running_buffers(model))
        self._samples_mark = 0
        self._iteration_mark: int | None = None

    def __call__(self, samples_local: int, iteration: int) -> bool:
        """Average now unless nothing has trained since the last call (``iteration`` is agreed by
        every rank, so they all skip or all reduce); True when an allreduce ran."""
        if not self.has_bn or iteration == self._iteration_mark:
            return False
        average_buffers(running_buffers(self.model), samples_local - self._samples_mark)
        self._samples_mark, self._iteration_mark = samples_local, iteration
        return True
