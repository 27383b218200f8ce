"""Distributed evaluation at every epoch end and ReduceLROnPlateau on its result (3 ranks).
Only rank 0's eval result feeds the scheduler (the others return a wrong "score" on purpose)."""
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model  # noqa: E402

from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.evaluate import DistributedEval  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

spec = json.loads(Path(sys.argv[1]).read_text())
ds, val = make_data(spec["n"]), make_data(spec["n_val"], seed=5)
model = make_model()
opt = torch.optim.SGD(model.parameters(), lr=spec["lr"])
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=0)
cfg = JobConfig(planner="fixed", plan=spec["plan"], batch=1, epochs=spec["epochs"], eval_metric="score",
                run_dir=spec["out_dir"] + "/run", checkpoint=False, metrics_period=100)
dist_eval = DistributedEval(val, loss_fn=nn.CrossEntropyLoss(), batch_size=spec["eval_batch"])
seen: list[dict] = []


def eval_fn(m):
    ev = dist_eval(m)
    rank = tr.rank
    score = spec["scores"][len(seen)] if rank == 0 else -1e9 * (rank + 1)
    seen.append({"ev": ev, "lr": opt.param_groups[0]["lr"],
                 "params": {k: v.tolist() for k, v in m.state_dict().items()}})
    return dict(ev, score=score)


tr = Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg, scheduler=sched, eval_fn=eval_fn)
tr.fit(resume=False)
out = {"rank": tr.rank, "seen": seen, "lr": opt.param_groups[0]["lr"]}
out["backend"] = comm.backend()          # the backend this run really took
(Path(spec["out_dir"]) / f"rank{tr.rank}.json").write_text(json.dumps(out))
