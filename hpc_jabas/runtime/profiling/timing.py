"""Timing: one micro-batch exactly as the Trainer runs it (runtime/step.py), and the optimizer update."""
from __future__ import annotations

import statistics

import torch

from hpc_jabas.runtime.clock import Timer  # noqa: F401  (perf_counter on the CPU, CUDA events on a GPU)
from hpc_jabas.runtime.optim import HeterogeneousOptimizer
from hpc_jabas.runtime.profiling.load import ModelBundle, make_optimizer, sample_index
from hpc_jabas.runtime.step import default_forward, micro_step


class Runner:
    """The model under test on a device, with the Trainer's micro-batch step and optimizer wrapper
    (a HeterogeneousOptimizer without allreduce hooks: one process, nothing to reduce)."""

    def __init__(self, bundle: ModelBundle, device: torch.device, optimizer: str):
        self.device = device
        self.model = bundle.model.to(device)
        self.model.train()
        self.forward = default_forward(bundle.loss_fn)
        self.sample = bundle.sample              # stays on the host, like a dataset
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = HeterogeneousOptimizer(make_optimizer(optimizer, params), self.model.named_parameters(),
                                          overlap=False)

    @property
    def n_samples(self) -> int:
        return int(self.sample[0].shape[0])

    def batch(self, b: int) -> tuple[torch.Tensor, ...]:
        """b samples (on the host), cycling through the sample batch."""
        idx = sample_index(self.n_samples, b)
        return tuple(t[idx] for t in self.sample)

    def micro(self, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """One micro-batch (forward + weighted backward, gradients accumulate); the loss on the device."""
        return micro_step(self.model, self.forward, self.opt, batch, int(batch[0].shape[0]), self.device)

    def update(self) -> None:
        self.opt.optimizer.step()
        self.opt.zero_grad(set_to_none=False)

    def close(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.opt.remove_hooks()


def time_micro(runner: Runner, b: int, warmup: int, repeats: int) -> tuple[float, list[float]]:
    """Median seconds of one micro-batch of b (forward + backward + accumulate), and all repeats."""
    timer = Timer(runner.device)
    batch = runner.batch(b)
    out = []
    for i in range(warmup + repeats):
        timer.start()
        runner.micro(batch)
        dt = timer.stop()
        if i >= warmup:
            out.append(dt)
    runner.opt.zero_grad(set_to_none=False)
    return statistics.median(out), out


def time_update(runner: Runner, warmup: int, repeats: int, b: int = 1) -> float:
    """Median seconds of optimizer.step() + zero_grad() (after one micro-batch of ``b``, so gradients exist)."""
    timer = Timer(runner.device)
    runner.micro(runner.batch(b))          # gradients (and optimizer state) exist
    out = []
    for i in range(warmup + repeats):
        timer.start()
        runner.update()
        dt = timer.stop()
        if i >= warmup:
            out.append(dt)
    return statistics.median(out)
