# ddp_mnist.py: a standard torch DistributedDataParallel script (torchrun --nproc-per-node=2 ddp_mnist.py)
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

parser = argparse.ArgumentParser(description="MNIST-style classifier, torch DDP")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
parser.add_argument("--lr", type=float, default=0.02, help="learning rate")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--checkpoint", default="ddp_mnist.pt")
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
sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
model = DDP(Net().to(device))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
start = 0
if os.path.exists(args.checkpoint):
    state = torch.load(args.checkpoint, map_location=device)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start = state["epoch"] + 1
for epoch in range(start, args.epochs):
    sampler.set_epoch(epoch)
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        F.nll_loss(model(x.to(device)), y.to(device)).backward()
        optimizer.step()
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                   args.checkpoint)
acc = accuracy(model.module, test_set)
if rank == 0:
    print(f"epoch {args.epochs - 1}: test accuracy {acc:.3f}")
dist.destroy_process_group()
