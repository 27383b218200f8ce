"""Allreduce: timed op=Sum allreduces over the ranks' world (runtime/comm/seam.py: torch.distributed or Horovod), and
their fit (AllreduceModel)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence

import torch

from hpc_jabas.core.perf.perfmodel import EMU_BANDWIDTH, AllreduceModel
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.profiling.load import resolve_device


def measure_allreduce(sizes: Iterable[int], *, warmup: int = 3, repeats: int = 10,
                      device: str | None = None) -> list[tuple[int, int, float]]:
    """(nbytes, N, seconds) per message size, over the current world of ranks (all ranks call).

    Each timed allreduce starts after a one-element allreduce (a barrier); its time is the
    slowest rank's; the result per size is the median over repeats. The sizes take turns
    within every repeat, so a burst of load elsewhere on the machine does not fall on one size
    only. Needs ``comm.init()`` done."""
    from hpc_jabas.runtime.comm import seam as comm
    dev = resolve_device(device)
    N = comm.size()
    tick = torch.zeros(1, device=dev)
    sz = sorted({int(s) for s in sizes})
    if len(sz) < 2:
        raise ConfigError(f"allreduce sizes {sz}: give at least 2 different message sizes")
    for nbytes in sz:
        if nbytes < 4:
            raise ConfigError(f"allreduce message size {nbytes} B is below one float32 (4 B)")
    bufs = {nb: torch.ones(nb // 4, dtype=torch.float32, device=dev) for nb in sz}
    mine: dict[int, list[float]] = {nb: [] for nb in sz}
    for i in range(warmup + repeats):
        for nb in sz:
            comm.allreduce_sum(tick, name=f"hj.prof.bar.{nb}")
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            comm.allreduce_sum(bufs[nb], name=f"hj.prof.ar.{nb}")
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            dt = time.perf_counter() - t0
            if i >= warmup:
                mine[nb].append(dt)
    every = comm.allgather_object(mine, name="hj.prof.ar.times")
    out = []
    for nb in sz:
        slowest = [max(col) for col in zip(*(e[nb] for e in every))]
        out.append((4 * (nb // 4), N, statistics.median(slowest)))
    return out


def fit_allreduce(samples: Sequence[Sequence[float]]) -> AllreduceModel:
    """AllreduceModel.fit, with the bandwidth rescaled to the measured effective one (a == 1)."""
    m = AllreduceModel.fit(samples, bandwidth=EMU_BANDWIDTH)
    if m.a > 0:
        return AllreduceModel(1.0, m.c, EMU_BANDWIDTH / m.a)
    return m
