# ddp_loop.py: ddp_mnist.py ported to hpc-jabas keeping its own loop (torchrun --nproc-per-node=2 ddp_loop.py)
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import hpc_jabas

parser = argparse.ArgumentParser(description="MNIST-style classifier, torch DDP, its loop kept with hpc_jabas.Jabas")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
parser.add_argument("--lr", type=float, default=0.02, help="learning rate")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--checkpoint", default="ddp_loop.pt")
parser.add_argument("--speeds", type=float, nargs="*", help="relative speed of each rank's GPU (default: equal)")
args = parser.parse_args()

dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if torch.cuda.is_available() else "cpu")
torch.manual_seed(args.seed)


def make_data(n, seed):
    """An offline stand-in for MNIST: 1x28x28 images of 10 classes."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    prototypes = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(99))
    x = prototypes[y] + 2 * torch.randn(n, 1, 28, 28, generator=g)
    return torch.utils.data.TensorDataset(x, y)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 5)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(8 * 12 * 12, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.log_softmax(self.fc(self.drop(x.flatten(1))), dim=1)


def accuracy(model, data):
    model.eval()
    with torch.no_grad():
        return float((model(data.tensors[0]).argmax(1) == data.tensors[1]).float().mean())


train_set, test_set = make_data(2048, 0), make_data(512, 1)
# the global batch B = batch-size x ranks, split by the ranks' speeds (a faster GPU takes more micro-batches)
jabas = hpc_jabas.Jabas(batch=args.batch_size * world, micro_batch=args.batch_size, speeds=args.speeds,
                        seed=args.seed, checkpoint=args.checkpoint)
net = Net().to(device)
# DDP averages the ranks' gradients and so does Jabas (the mean of the B samples): the script's lr, unscaled
optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum)
model, optimizer, loader = jabas.setup(net, optimizer, train_set)      # model: net in DDP
for epoch in jabas.epochs(args.epochs):              # resumes from the checkpoint; saves it at each epoch end
    model.train()
    for step in loader:
        for x, y in step:
            jabas.backward(F.nll_loss(model(x.to(device)), y.to(device)), len(x))
        optimizer.step()
    if rank == 0:
        print(f"epoch {epoch}: {jabas.iteration} iterations, B={jabas.B}")
acc = accuracy(model.module, test_set)
if rank == 0:
    print(f"epoch {args.epochs - 1}: test accuracy {acc:.3f}")
dist.destroy_process_group()
