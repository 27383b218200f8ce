"""Issue 36's resume case on every rank: a model with dropout whose loss also draws from numpy and Python's
``random``; a spec's "cases" run one after another in this launch (a fresh model, optimizer and Trainer
each). A case: {"run_dir", "steps", "stop_at" (checkpoint there and stop), "resume", "seed" (the generators'
seed before the model is built; rank r adds r)}; rank r writes <out_dir>/case<k>-rank<r>.json (the final
parameters)."""
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.runtime.trainer import Trainer


def forward(model, batch):
    x, y = batch
    # CPU-side draws besides dropout: numpy and Python's random (a CPU augmentation would draw like this)
    noise = torch.from_numpy(np.random.standard_normal(tuple(x.shape)).astype(np.float32))
    x = x + 0.1 * random.random() * noise
    return nn.functional.cross_entropy(model(x), y)


def run(spec: dict, k: int, out_dir: Path) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(256, 8, generator=g)
    ds = torch.utils.data.TensorDataset(x, (x[:, 0] - x[:, 2] > 0).long())
    torch.manual_seed(11)                                 # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.ReLU(), nn.Linear(32, 2))
    cfg = JobConfig(planner="fixed", plan="b=4 n=3,1", batch=16, epochs=100, run_dir=spec["run_dir"],
                    metrics_period=5)
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), ds, nn.CrossEntropyLoss(),
                 config=cfg, forward_fn=forward)
    seed = spec["seed"] + tr.rank                         # every rank its own streams, as in a real job
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    tr.fit(max_iterations=spec.get("stop_at") or spec["steps"], resume=spec.get("resume", False))
    if spec.get("stop_at"):
        tr.save_checkpoint()
    out = {"iterations": tr.iteration, "resumed_from": tr.resumed_from,
           "params": {n: p.detach().tolist() for n, p in model.state_dict().items()}}
    (out_dir / f"case{k}-rank{tr.rank}.json").write_text(json.dumps(out))


main_spec = json.loads(Path(sys.argv[1]).read_text())
for i, case in enumerate(main_spec["cases"]):
    run(case, i, Path(main_spec["out_dir"]))
