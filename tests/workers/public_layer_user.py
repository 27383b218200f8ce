"""A user's script of the low-level layer, as a user writes it: ``import hpc_jabas`` only (plus torch and, on
Horovod, horovod.torch), the script's own initialisation. tests/test_public_layer.py copies it into a clean
directory and starts it on 3 ranks (mpirun or torchrun).

    python public_layer_user.py INIT OUT.json [ddp]

INIT: ``hvd`` (the script calls hvd.init()), ``dist`` (its own dist.init_process_group("gloo")) or ``jabas``
(hpc_jabas.init()). ``ddp``: the model is wrapped in DistributedDataParallel by the script (torch only).
Every rank writes nothing but rank 0, which writes the final parameters and each iteration's global sample
order (the test recomputes the big batch's trajectory in one process).
"""
import json
import sys

import torch

import hpc_jabas
from hpc_jabas import HeterogeneousOptimizer, HeterogeneousSampler, Plan

how, out = sys.argv[1], sys.argv[2]
wrap = len(sys.argv) > 3 and sys.argv[3] == "ddp"
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
model = torch.nn.Sequential(torch.nn.Linear(D, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1)).double()
net = model
kw = {}
if wrap:
    from torch.nn.parallel import DistributedDataParallel
    net = DistributedDataParallel(model)
    kw["model"] = net
inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
opt = HeterogeneousOptimizer(inner, model.named_parameters(), **kw)
sampler = HeterogeneousSampler(N, seed=3)
# plans that change every few iterations, one of them with a rank that runs no micro-batch
plans = [Plan(3, (2, 1, 0)), Plan(2, (1, 2, 3)), Plan((4, 3, 2), (1, 2, 2), (4, 5, 3)), Plan(5, (0, 1, 2))]
order = []
for it in range(9):
    if sampler.epoch_done():
        sampler.new_epoch()
    batch = sampler.next(plans[(it // 2) % len(plans)])
    order.append([int(i) for i in batch.all_indices()])
    mine = batch.micro[rank]
    opt.begin(len(mine), batch.total)
    for idx in mine:
        loss = torch.nn.functional.mse_loss(net(X[idx]), Y[idx])
        opt.backward(loss, len(idx))
    opt.step()
if rank == 0:
    with open(out, "w") as f:
        json.dump({"world": world, "order": order,
                   "params": {n: p.detach().reshape(-1).tolist() for n, p in model.named_parameters()}}, f)
