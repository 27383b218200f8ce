"""ResNet-18 on an image folder of JPEG files, decoded and augmented in DataLoader workers.

The standard ResNet-18 (BasicBlock, [2, 2, 2, 2], 11.7M parameters at --width 64; no pretrained
weights) trained on 10 classes of generated coloured shapes (examples/jpeg_shapes.py writes them
with pillow at first use). The user's DataLoader (workers, pinned memory, prefetching) is handed to
the Trainer as it is; hpc-jabas swaps in its heterogeneous batch sampler:

    mpirun --oversubscribe -np 3 .venv/bin/python examples/train_resnet.py --emulate \\
        --gpu-types v100,p100,rtx2060 --batch 96 --epochs 3 --run-dir runs/resnet --num-workers 2

Small (a test): --images-per-class 30 --image-size 32 --width 16 --epochs 1.
"""
import argparse
import json
from pathlib import Path

import torch
from torch import nn

import hpc_jabas  # hpc-jabas
from hpc_jabas import ConfigError, add_verbosity_flags, configure_from_args

try:
    from examples.jpeg_shapes import JpegFolder, ensure_image_folder
except ImportError:                        # run as a script: examples/ is on sys.path
    from jpeg_shapes import JpegFolder, ensure_image_folder  # type: ignore[no-redef]


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """torchvision's ResNet layout: 7x7/2 stem + max pool, four stages, global average pool, fc."""

    def __init__(self, layers=(2, 2, 2, 2), num_classes: int = 10, width: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], width
        for k, n in enumerate(layers):
            cout = width * 2 ** k
            blocks = [BasicBlock(cin, cout, 1 if k == 0 else 2)] + [BasicBlock(cout, cout) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.modules():                    # zero-init the last BN of each block (He et al., Goyal et al.)
            if isinstance(m, BasicBlock):
                nn.init.zeros_(m.bn2.weight)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 10, width: int = 64) -> ResNet:
    return ResNet((2, 2, 2, 2), num_classes, width)


def profile_bundle(image_size: int = 64):
    """For `hpc-jabas profile --model examples.train_resnet:profile_bundle`: (ResNet-18, loss, 32 samples)."""
    torch.manual_seed(0)
    x = torch.randn(32, 3, image_size, image_size)
    return resnet18(10), nn.CrossEntropyLoss(), (x, torch.randint(0, 10, (32,)))


def accuracy(model, loader) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in loader:
            right += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return right / max(total, 1)


def main(argv=None):
    ap = hpc_jabas.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="runs/jpeg-shapes", help="the image folder (written at first use)")
    ap.add_argument("--images-per-class", type=int, default=100, help="training JPEG files per class (10 classes)")
    ap.add_argument("--image-size", type=int, default=64, help="side of the square JPEG files, in pixels")
    ap.add_argument("--width", type=int, default=64, help="channels of the first stage (64: the standard ResNet-18)")
    ap.add_argument("--num-workers", type=int, default=2, help="DataLoader worker processes (decode + augment)")
    ap.add_argument("--prefetch-factor", type=int, default=2, help="batches prefetched per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--summary", help="write a JSON summary here (rank 0)")
    add_verbosity_flags(ap)
    hpc_jabas.add_arguments(ap)                                     # hpc-jabas
    args = ap.parse_args(argv)
    configure_from_args(args)
    for flag in ("images_per_class", "image_size", "width", "prefetch_factor"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')}={getattr(args, flag)} is invalid; give an integer >= 1")
    if args.image_size < 16:
        raise ConfigError(f"--image-size={args.image_size} is too small for the shapes; give 16 or more")
    if args.num_workers < 0:
        raise ConfigError(f"--num-workers={args.num_workers} is invalid; give 0 (no workers) or more")
    cfg = hpc_jabas.config_from_args(args)                          # hpc-jabas
    root = Path(args.data_dir) / f"train-{args.images_per_class}x{args.image_size}"
    test_root = Path(args.data_dir) / f"test-{max(args.images_per_class // 4, 5)}x{args.image_size}"
    ensure_image_folder(root, per_class=args.images_per_class, size=args.image_size, seed=0)
    ensure_image_folder(test_root, per_class=max(args.images_per_class // 4, 5), size=args.image_size, seed=1)
    torch.manual_seed(0)
    model = resnet18(10, args.width)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    workers = {"num_workers": args.num_workers, "pin_memory": torch.cuda.is_available()}
    if args.num_workers > 0:
        workers.update(prefetch_factor=args.prefetch_factor, persistent_workers=True)
    train = torch.utils.data.DataLoader(JpegFolder(root, train=True), **workers)
    test = torch.utils.data.DataLoader(JpegFolder(test_root, train=False), batch_size=100)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
    trainer = hpc_jabas.Trainer(model, opt, train, nn.CrossEntropyLoss(), config=cfg,  # hpc-jabas
                                scheduler=sched,                                     # hpc-jabas
                                eval_fn=lambda m: {"test_acc": accuracy(m, test)})   # hpc-jabas
    result = trainer.fit()                                          # hpc-jabas
    result["test_acc"] = accuracy(model, test)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["decision_lead"] = trainer.decision_lead
    hpc_jabas.report_throughput(trainer, result)                    # hpc-jabas
    if args.summary and trainer.rank == 0:
        with open(args.summary, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    hpc_jabas.run_main(main)
