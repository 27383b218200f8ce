"""A user's script of the low-level layer, as a user writes it: ``import hpc_jabas`` only (plus torch and, on
Horovod, horovod.torch), the script's own initialisation. tests/test_public_layer.py copies it into a clean
directory and starts it on 3 ranks (mpirun or torchrun).

    python public_layer_user.py INIT OUT.json [misuse]

INIT: ``hvd`` (the script calls hvd.init()), ``dist`` (its own dist.init_process_group("gloo"); the loop runs
twice: the model as it is, then wrapped in the script's own DistributedDataParallel) or ``jabas``
(hpc_jabas.init()). Rank 0 writes each run's final parameters and each iteration's global sample order (the
test recomputes the big batch's trajectory in one process) and what hpc_jabas.init() says afterwards.
``misuse``: then one more iteration in which rank 1 runs one backward fewer than its begin() announced.
"""
import json
import sys

import torch

import hpc_jabas
from hpc_jabas import HeterogeneousOptimizer, HeterogeneousSampler, Plan

how, out = sys.argv[1], sys.argv[2]
if how == "hvd":
    import horovod.torch as hvd
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
elif how == "dist":
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
else:
    me = hpc_jabas.init()
    rank, world = me.rank, me.size

torch.manual_seed(0)
N, D = 61, 5
X = torch.randn(N, D, dtype=torch.float64)
Y = torch.randn(N, 1, dtype=torch.float64)
# plans that change every two iterations; in the first and the last a rank runs no micro-batch
PLANS = [Plan(3, (2, 1, 0)), Plan(2, (1, 2, 3)), Plan((4, 3, 2), (1, 2, 2), (4, 5, 3)), Plan(5, (0, 1, 2))]


def train(wrap: bool) -> dict:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(D, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1)).double()
    net = model
    if wrap:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
    opt = HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                 model.named_parameters())
    sampler = HeterogeneousSampler(N, seed=3)
    order = []
    for it in range(9):
        if sampler.epoch_done():
            sampler.new_epoch()
        batch = sampler.next(PLANS[(it // 2) % len(PLANS)])
        order.append([int(i) for i in batch.all_indices()])
        mine = batch.micro[rank]
        opt.begin(len(mine), batch.total)
        for idx in mine:
            loss = torch.nn.functional.mse_loss(net(X[idx]), Y[idx])
            opt.backward(loss, len(idx))
        opt.step()
    return {"order": order, "params": {n: p.detach().reshape(-1).tolist() for n, p in model.named_parameters()}}


runs = {"plain": train(False)}
if how == "dist":
    runs["ddp"] = train(True)
me = hpc_jabas.init()                       # idempotent: the backend already running (the script's own)
if rank == 0:
    with open(out, "w") as f:
        json.dump({"world": world, "runs": runs, "init": [me.rank, me.size, me.backend, str(me.device)]}, f)
if len(sys.argv) > 3:
    model = torch.nn.Linear(D, 1).double()
    opt = HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    opt.begin(2, 12)
    for _ in range(1 if rank == 1 else 2):
        opt.backward(model(X[:2]).pow(2).mean(), 2)
    opt.step()
    print("stepped", flush=True)
