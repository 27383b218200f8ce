"""Model callables for `hpc-jabas profile --model MODULE:CALLABLE`.

A model callable takes no argument and returns ``(model, loss_fn, sample_batch)``:

* ``model``: a ``torch.nn.Module`` (on the CPU; the profiler moves it to the device);
* ``loss_fn``: called as ``loss_fn(model(x), y)``, returns the mean loss of the micro-batch
  (the same call the Trainer makes by default);
* ``sample_batch``: a tuple ``(x, y)`` of tensors with the same first dimension (a few real
  samples); the profiler builds micro-batches of any size b by cycling through them.

    hpc-jabas profile --model examples.models:digits_mlp --gpu-type v100 --out profiles/
"""
from __future__ import annotations

import torch
from torch import nn


def digits_data(n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8x8 digits (no download), scaled to [0, 1]: (x [N, 64], y [N])."""
    from examples.digits import digits_all
    X, y = digits_all()
    x = torch.tensor(X, dtype=torch.float32)
    t = torch.tensor(y, dtype=torch.long)
    if n is not None:
        x, t = x[:n], t[:n]
    return x, t


def digits_mlp_module() -> nn.Module:
    """The MLP of examples/train_digits.py: 64 -> 128 -> 64 -> 10 (17,226 parameters)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def digits_mlp():
    """(MLP, cross-entropy, 256 digits samples)."""
    return digits_mlp_module(), nn.CrossEntropyLoss(), digits_data(256)


def digits_cnn():
    """A small CNN on the digits images (1x8x8): more compute per sample than the MLP."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))
    return model, nn.CrossEntropyLoss(), digits_data(256)
