"""Adaptive-batching scenarios on every rank, one after the other, in one mpirun.

spec["scenarios"]: list of {name, data: "noise" | "clean" | "reference", n, steps, lr, run_dir, config}.
- "noise": balanced random labels (pure noise), zero-initialised linear softmax on d=256 inputs:
  the two half-batch gradients are independent noise, similarity ~ 0 < gamma.
- "clean": noiseless labels y = [x.w > 0] on d=2 inputs, zero-initialised linear model, small lr
  (early training): both halves see the same gradient, similarity well above gamma.
- "reference": tests/reference.py's data and model (float64), for the statistics check.
Rank r writes rank<r>.json: per scenario the per-iteration history.
"""
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model  # noqa: E402

from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402


def dataset(kind: str, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if kind == "noise":
        X = torch.randn(n, 256, generator=g, dtype=torch.float64)
        X = X - X.mean(0)
        y = (torch.arange(n) % 10)[torch.randperm(n, generator=g)]
        return torch.utils.data.TensorDataset(X, y), 256, 10
    if kind == "clean":
        X = torch.randn(n, 2, generator=g, dtype=torch.float64)
        w = torch.randn(2, generator=g, dtype=torch.float64)
        y = (X @ w > 0).long()
        return torch.utils.data.TensorDataset(X, y), 2, 2
    raise ValueError(kind)


def linear(d: int, classes: int) -> nn.Module:
    m = nn.Linear(d, classes).to(torch.float64)
    nn.init.zeros_(m.weight)
    nn.init.zeros_(m.bias)
    return m


spec = json.loads(Path(sys.argv[1]).read_text())
out = {"scenarios": {}}
rank = 0
for sc in spec["scenarios"]:
    if sc["data"] == "reference":
        ds = make_data(sc["n"])
        model = make_model()
    else:
        ds, d, c = dataset(sc["data"], sc["n"])
        model = linear(d, c)
    opt = torch.optim.SGD(model.parameters(), lr=sc["lr"])
    cfg = JobConfig(run_dir=sc["run_dir"], checkpoint=False, metrics_period=5, epochs=1000)
    for k, v in sc["config"].items():
        setattr(cfg, k, v)
    cfg.validate()
    tr = Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg)
    tr.fit(max_iterations=sc["steps"], resume=False)
    rank = tr.rank
    out["scenarios"][sc["name"]] = {"history": list(tr.history), "iterations": tr.iteration}
(Path(spec["out_dir"]) / f"rank{rank}.json").write_text(json.dumps(out))
