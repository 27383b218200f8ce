"""Digits (scikit-learn's bundled 8x8 images, no download) on a heterogeneous Horovod job.

A plain single-GPU PyTorch script; the lines marked  # hpc-jabas  are all it takes
(7 lines) to run it as weighted heterogeneous data parallelism with adaptive batching:

    mpirun --oversubscribe -np 3 .venv/bin/python examples/train_digits.py \\
        --emulate --gpu-types v100,p100,rtx2060 --batch 128 --epochs 10 --run-dir runs/digits-10
"""
import json

import torch
from torch import nn

import hpc_jabas  # hpc-jabas
from hpc_jabas import add_verbosity_flags, configure_from_args

try:                                   # as a module (examples.train_digits:build) or as a script
    from examples.digits import digits_split
except ImportError:
    from digits import digits_split  # type: ignore[no-redef]


def make_data(seed=0):
    Xtr, Xte, ytr, yte = digits_split(seed, test_size=0.25)   # scikit-learn's split, cached (examples/digits.py)
    t = lambda a, dt: torch.tensor(a, dtype=dt)
    return (torch.utils.data.TensorDataset(t(Xtr, torch.float32), t(ytr, torch.long)),
            (t(Xte, torch.float32), t(yte, torch.long)))


def make_model():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def accuracy(model, test):
    model.eval()
    with torch.no_grad():
        return float((model(test[0]).argmax(1) == test[1]).float().mean())


def build(lr: float = 0.05):
    """The task for Slurm jobs (`hpc-jabas submit --task examples.train_digits:build`)."""
    torch.manual_seed(0)
    train, test = make_data()
    model = make_model()
    return hpc_jabas.Task(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), train,
                          nn.CrossEntropyLoss(), eval_fn=lambda m: {"test_acc": accuracy(m, test)})


def main(argv=None):
    ap = hpc_jabas.ArgumentParser(description=__doc__)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--summary", help="write a JSON summary here (rank 0)")
    ap.add_argument("--cosine", action="store_true", help="cosine lr schedule over the epochs (stepped per epoch)")
    add_verbosity_flags(ap)            # -q/--quiet (no progress bar, warnings only), -v/--verbose
    hpc_jabas.add_arguments(ap)                                     # hpc-jabas
    args = ap.parse_args(argv)
    configure_from_args(args)
    if args.summary:                   # a bad --summary path fails now, not after the training
        try:
            open(args.summary, "a").close()
        except OSError as e:
            raise hpc_jabas.ConfigError(f"--summary {args.summary!r} cannot be written: {e.strerror}") from None
    torch.manual_seed(0)
    train, test = make_data()
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    cfg = hpc_jabas.config_from_args(args)                          # hpc-jabas
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs) if args.cosine else None
    trainer = hpc_jabas.Trainer(model, opt, train, nn.CrossEntropyLoss(), config=cfg,   # hpc-jabas
                                scheduler=sched,                                      # hpc-jabas
                                eval_fn=lambda m: {"test_acc": accuracy(m, test)})    # hpc-jabas
    result = trainer.fit()                                          # hpc-jabas
    result["test_acc"] = accuracy(model, test)
    hpc_jabas.report_throughput(trainer, result)                    # hpc-jabas
    if args.summary and trainer.rank == 0:
        with open(args.summary, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    hpc_jabas.run_main(main)
