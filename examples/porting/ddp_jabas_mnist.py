# ddp_jabas_mnist.py: the same classifier on hpc-jabas (torchrun, mpirun or srun; weighted ranks, adaptive B)
import torch
import torch.nn.functional as F
from torch import nn

import hpc_jabas

parser = hpc_jabas.ArgumentParser(description="MNIST-style classifier, hpc-jabas")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=64, help="samples per rank and step")
parser.add_argument("--lr", type=float, default=0.02, help="learning rate")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
hpc_jabas.add_arguments(parser)       # --policy, --run-dir, ...; --epochs, --batch-size (per rank), --seed read
args = parser.parse_args()

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
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
trainer = hpc_jabas.Trainer(model, optimizer, train_set, nn.NLLLoss(), config=hpc_jabas.config_from_args(args),
                            eval_fn=lambda m: {"test_acc": accuracy(m, test_set)})
trainer.fit()
acc = accuracy(model, test_set)
if trainer.rank == 0:
    print(f"epoch {args.epochs - 1}: test accuracy {acc:.3f}")
