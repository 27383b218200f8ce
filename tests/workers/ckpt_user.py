"""A user's training script as the checkpoint fault tests run it (no run_main, the public API only).

argv: RUN_DIR EPOCHS KEEP [OPTIMIZER] [BACKEND]; OPTIMIZER sgd (default), adam, sgd2 (two parameter groups).
Prints ``fit: iterations=N`` on rank 0 when training ends. ``HJ_TEST_FSIZE_KB``: the file size limit
(``ulimit -f``) set once the ranks have started (MPI's own start-up writes larger shared-memory files)."""
import os
import resource
import sys

import torch
from torch import nn

import hpc_jabas


def main() -> None:
    run_dir, epochs, keep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    opt_name = sys.argv[4] if len(sys.argv) > 4 else "sgd"
    backend = sys.argv[5] if len(sys.argv) > 5 else "auto"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=g)
    ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))
    if opt_name == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    elif opt_name == "sgd2":
        opt = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters()}], lr=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    cfg = hpc_jabas.JobConfig(batch=32, epochs=epochs, run_dir=run_dir, keep_checkpoints=keep, backend=backend)
    tr = hpc_jabas.Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg)
    tr.setup()
    if os.environ.get("HJ_TEST_FSIZE_KB"):
        lim = int(os.environ["HJ_TEST_FSIZE_KB"]) * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    out = tr.fit()
    if tr.rank == 0:
        print(f"fit: iterations={out.get('iterations')}", flush=True)


if __name__ == "__main__":
    main()
