"""BatchNorm2d conv model with b pinned (micro_batch) on every rank; B changes at iteration 3.
Rank r writes rank<r>.json: its buffers before and after the averaging a checkpoint runs, its samples,
parameters, per-iteration plans and the checkpoint's path."""
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.runtime.batchnorm import running_buffers  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.controller import ScriptedController  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402


def make_data(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 1, 6, 6, generator=g, dtype=torch.float64)
    y = (X.mean((1, 2, 3)) * 3 + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)).round().clamp(-1, 1) + 1
    return torch.utils.data.TensorDataset(X, y.long())


def make_model(seed: int = 1):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64, 3)).double()


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    ds = make_data(spec["n"])
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=0.9)
    cfg = JobConfig(planner="optimal", micro_batch=spec["b"], batch=spec["B0"], batch_min=1, batch_max=10**6,
                    gpu_types=spec["gpu_types"], run_dir=spec["run_dir"], metrics_period=100)
    ctrl = ScriptedController({int(k): v for k, v in spec["schedule"].items()})
    tr = Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg, controller=ctrl)
    tr.fit(max_iterations=spec["steps"], resume=False)
    before = [b.tolist() for b in running_buffers(model)]
    path = tr.save_checkpoint()
    after = [b.tolist() for b in running_buffers(model)]
    out = {"rank": tr.rank, "before": before, "after": after, "samples_local": tr.samples_local,
           "params": {k: v.tolist() for k, v in model.named_parameters()}, "history": list(tr.history),
           "checkpoint": path}
    out["backend"] = comm.backend()          # the backend this run really took
    (Path(spec["out_dir"]) / f"rank{tr.rank}.json").write_text(json.dumps(out))
