"""A user's script with the curvature-headroom probe on (``headroom_probe``): ``import hpc_jabas`` only, its own model,
data and optimizer, the goodput policy on two emulated ranks. Spec: {"cases": [...], "out_dir"}; a case:
{"run_dir", "epochs" (fit to this many), "resume", "seesaw", "backend", "optimizer" ("sgd" | "adam"), "goal"};
rank r writes <out_dir>/case<k>-rank<r>.json (iterations, samples, resumed_from, the scheduler's epochs, the final
parameters)."""
import json
import sys
from pathlib import Path

import torch
from torch import nn

import hpc_jabas


def run(spec: dict, k: int, out_dir: Path) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(512, 10, generator=g)
    y = ((x[:, 0] + 0.5 * x[:, 1] - x[:, 2]) > 0).long()
    flip = torch.rand(512, generator=g) < 0.2                       # label noise: a noise scale to measure
    ds = torch.utils.data.TensorDataset(x, torch.where(flip, 1 - y, y))
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01) if spec.get("optimizer") == "adam" else \
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # a step schedule: x 0.25 after the first epoch (Seesaw's floor reads the cut)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.25)
    cfg = hpc_jabas.JobConfig(gpu_types=["v100", "v100"], emulate=True, emulate_base_s=1e-4,
                              emulate_per_sample_s=1e-5, policy="noise-scale", batch=16, batch_min=8,
                              batch_max=256, micro_batch=8, p=4, headroom_probe=64, headroom_every=2,
                              seesaw=bool(spec.get("seesaw")), epochs=spec["epochs"], run_dir=spec["run_dir"],
                              backend=spec.get("backend", "auto"), metrics_period=4, goal=spec.get("goal", "time"))
    tr = hpc_jabas.Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg, scheduler=sched)
    res = tr.fit(epochs=spec["epochs"], resume=bool(spec.get("resume")))
    out = {"iterations": tr.iteration, "resumed_from": tr.resumed_from, "samples": res["samples"],
           "sched_epochs": sched.last_epoch,
           "params": {n: p.detach().tolist() for n, p in model.state_dict().items()}}
    (out_dir / f"case{k}-rank{tr.rank}.json").write_text(json.dumps(out))


main_spec = json.loads(Path(sys.argv[1]).read_text())
for i, case in enumerate(main_spec["cases"]):
    run(case, i, Path(main_spec["out_dir"]))
