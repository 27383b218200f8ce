"""Shared by bench.overhead: the keep-your-loop API (``hpc_jabas.Jabas``) run as a user's loop on the overhead MLP,
and a deterministic count of the Python calls one iteration of a loop makes (``sys.setprofile``), a figure that
the machine's load does not move."""
import sys
from collections.abc import Callable

import torch
from torch import nn

from bench.common.overhead_mlp import model


def jabas_loop(ds: torch.utils.data.TensorDataset, b: int, world: int, iters: int, backend: str) -> None:
    """``iters`` iterations of a loop kept with ``hpc_jabas.Jabas`` (B = b x world, micro-batches of b: one per
    rank and iteration, the same split as the hand-written loops), as examples/porting/*_loop.py write it:
    setup (DDP on torch, Horovod's hooks and broadcast on Horovod), ``for step in loader``, ``backward``, step."""
    import hpc_jabas
    net = model()
    jabas = hpc_jabas.Jabas(batch=b * world, micro_batch=b, backend=backend)
    m, opt, loader = jabas.setup(net, torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9), ds)
    loss_fn = nn.CrossEntropyLoss()
    done = 0
    for step in loader:
        for x, y in step:
            jabas.backward(loss_fn(m(x), y), len(x))
        opt.step()
        done += 1
        if done == iters:
            break
    assert done == iters, (done, iters)
    opt.remove_hooks()


def python_calls(run: Callable[[], object]) -> int:
    """Python function calls (``sys.setprofile``'s "call" events, this thread) while ``run()`` runs. A wait's polls
    (Horovod's ``poll``, repeated until the collective completes: runtime/comm/horovod_backend.py ``synchronize``) are
    not counted: their number follows the wait's length, the rest is the same on a loaded machine."""
    n = [0]

    def prof(frame, event, arg) -> None:
        if event == "call" and not (frame.f_code.co_name == "poll" and "horovod" in frame.f_code.co_filename):
            n[0] += 1
    sys.setprofile(prof)
    try:
        run()
    finally:
        sys.setprofile(None)
    return n[0]


def calls_per_iteration(run: Callable[[int], object], k: int) -> float:
    """Python calls per iteration of a loop ``run(iterations)``: (calls of 2k iterations - calls of k) / k, so that
    its set-up (building the model, DDP, the Trainer's first collectives) cancels."""
    return (python_calls(lambda: run(2 * k)) - python_calls(lambda: run(k))) / k
