"""Shared by the benchmarks: a real model for CPU ranks (no emulation), ~8 MFLOP per sample forward+backward."""
import torch
from torch import nn

D_IN, HIDDEN, CLASSES, N = 256, 1024, 10, 8192


def make_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, CLASSES))


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D_IN, generator=g)
    y = (x[:, :CLASSES].argmax(1)).long()
    return torch.utils.data.TensorDataset(x, y)


def profile_bundle():
    """(model, loss_fn, sample batch): what `hpc-jabas profile` loads."""
    ds = dataset()
    return make_model(), nn.CrossEntropyLoss(), (ds.tensors[0][:512], ds.tensors[1][:512])
