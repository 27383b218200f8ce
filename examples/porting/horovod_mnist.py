# horovod_mnist.py: an MNIST-style classifier the Horovod way (a per-rank batch, lr x hvd.size())
import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser(description="MNIST-style classifier, Horovod")
parser.add_argument("--batch-size", type=int, default=64, help="input batch size of each rank")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05, help="learning rate of one rank")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression of the allreduce")
parser.add_argument("--use-adasum", action="store_true", help="Adasum instead of the average")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
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
sampler = torch.utils.data.distributed.DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                                          seed=args.seed)
loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
model = Net()
lr_scaler = 1 if args.use_adasum else hvd.size()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression, op=hvd.Adasum if args.use_adasum else hvd.Average,
                                     gradient_predivide_factor=args.gradient_predivide_factor)

for epoch in range(args.epochs):
    model.train()
    sampler.set_epoch(epoch)
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        optimizer.step()
    acc = accuracy(model, test_set)
    if hvd.rank() == 0:
        print(f"epoch {epoch}: test accuracy {acc:.3f}")
