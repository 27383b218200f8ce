"""bench/straggler.py's model, importable without starting the benchmark: for `hpc-jabas profile --model
bench.common.straggler_model:bundle` (the benchmark profiles each case with it before its MPI world starts)."""
import torch
from torch import nn


def model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))


def bundle():
    """(model, loss, 512 samples): what `hpc-jabas profile` times."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 32, generator=g)
    return model(), nn.CrossEntropyLoss(), (x, (x[:, :4].sum(1) > 0).long())
