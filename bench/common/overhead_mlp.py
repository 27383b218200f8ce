"""Shared by bench.overhead and bench.measure_cost: their ~5M-parameter MLP (512 -> 2048 -> 2048 -> 10, fp32; or
``small``: 64 -> 64 -> 64 -> 10, 9k parameters, where what fit() adds per iteration is most of an iteration), its
data (no epoch end inside a loop of ``n`` samples), and the hand-written DistributedDataParallel loop a torch user
writes, on the same batches as the Trainer's fixed plan (b samples per rank, B per iteration)."""
import torch
from torch import nn

#: DDP's default bucket size, which the torch backend's fit() uses too unless [train] bucket_cap_mb says otherwise
BUCKET_MB = 25.0


def model(small: bool = False) -> nn.Module:
    torch.manual_seed(1)
    d, h = (64, 64) if small else (512, 2048)
    return nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))


def data(n: int, small: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.utils.data.TensorDataset]:
    """``n`` samples (X, y and their dataset), the same on every rank (seed 0)."""
    torch.manual_seed(0)
    X = torch.randn(n, 64 if small else 512)
    y = (X[:, :8].sum(1) > 0).long()
    return X, y, torch.utils.data.TensorDataset(X, y)


def ddp_loop(X: torch.Tensor, y: torch.Tensor, b: int, rank: int, world: int, iters: int,
             bucket_view: bool = True, small: bool = False) -> None:
    """``iters`` iterations of a hand-written DDP loop (its construction broadcasts rank 0's parameters).
    ``bucket_view``: built as the torch backend's fit() builds DDP (gradient_as_bucket_view=True, the same bucket
    size); False: ``DistributedDataParallel(model)`` with its defaults."""
    from torch.nn.parallel import DistributedDataParallel
    kw = {"gradient_as_bucket_view": True, "bucket_cap_mb": BUCKET_MB} if bucket_view else {}
    ddp = DistributedDataParallel(model(small), **kw)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(0))
    B = b * world
    for i in range(iters):
        idx = perm[i * B + rank * b:i * B + (rank + 1) * b]
        opt.zero_grad()
        loss_fn(ddp(X[idx]), y[idx]).backward()
        opt.step()
