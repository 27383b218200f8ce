# horovod_loop.py: horovod_mnist.py ported to hpc-jabas keeping its own loop (mpirun -np 2 python horovod_loop.py)
import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch import nn

import hpc_jabas

parser = argparse.ArgumentParser(description="MNIST-style classifier, Horovod, its loop kept with hpc_jabas.Jabas")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size of each rank")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05, help="learning rate of one rank")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--checkpoint", default="horovod_loop.pt")
parser.add_argument("--speeds", type=float, nargs="*", help="relative speed of each rank's GPU (default: equal)")
args = parser.parse_args()

hvd.init()
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
jabas = hpc_jabas.Jabas(batch=args.batch_size * hvd.size(), micro_batch=args.batch_size, speeds=args.speeds,
                        seed=args.seed, checkpoint=args.checkpoint)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
model, optimizer, loader = jabas.setup(model, optimizer, train_set)   # parameters broadcast from rank 0

for epoch in jabas.epochs(args.epochs):               # resumes from the checkpoint; saves it at each epoch end
    model.train()
    for step in loader:
        for x, y in step:
            jabas.backward(F.nll_loss(model(x), y), len(x))
        optimizer.step()
    acc = accuracy(model, test_set)
    if hvd.rank() == 0:
        print(f"epoch {epoch}: test accuracy {acc:.3f}")
