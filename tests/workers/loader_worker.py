"""Trainer fed by a torch DataLoader with worker processes, on every rank; rank r writes rank<r>.json.

spec["scenarios"]: list of {name, kind ("tuple" | "dict"), n, steps, plan, schedule {iteration: plan},
lr_scales {iteration: scale}, optimizer, lr, num_workers, persistent, stop_at (optional), config (optional:
JobConfig keys for the adaptive controller instead of the scripted schedule)}, run one
after the other in one mpirun. The data are tests/reference.py's, served sample by sample with each
sample's id (so the workers index and collate: tuples (x, y, id) or dicts {"x", "y", "id"});
forward_fn records the ids this rank trains on, with the iteration and epoch. With ``stop_at`` the
run stops there, checkpoints, and a fresh model, optimizer and trainer resume it from the run
directory and finish.
"""
import json
import sys
from pathlib import Path

from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model, make_optimizer  # noqa: E402

from hpc_jabas.core.adaptive.decision import Decision  # noqa: E402
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.core.planning import Plan  # noqa: E402
from hpc_jabas.runtime.controller import ScriptedController  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402


class IdData(Dataset):
    def __init__(self, n: int, kind: str):
        self.X, self.y = make_data(n).tensors
        self.kind = kind

    def __len__(self):
        return len(self.X)

    def __getitem__(self, i):
        if self.kind == "dict":
            return {"x": self.X[i], "y": self.y[i], "id": i}
        return self.X[i], self.y[i], i


class LrScripted(ScriptedController):
    """lr scale changes ride on the scripted decisions, keyed by the iteration they take effect at."""

    def __init__(self, schedule, lrs):
        super().__init__(schedule)
        self.lrs = lrs

    def decide(self, trainer, rec):
        d = super().decide(trainer, rec)
        return Decision(d.at_iteration, d.B, d.plan, float(self.lrs.get(d.at_iteration, d.lr_scale)), d.reason)


def trainer_for(sc: dict, run_dir: str, seen: list) -> Trainer:
    ds = IdData(sc["n"], sc["kind"])
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=sc["num_workers"],
                        persistent_workers=sc["persistent"])          # batch_size/shuffle: replaced
    model = make_model()
    opt = make_optimizer(sc["optimizer"], model.parameters(), sc["lr"])
    if sc.get("config"):                  # the adaptive controller (policy, planner, ... from the config)
        cfg = JobConfig(run_dir=run_dir, epochs=1000, metrics_period=10, checkpoint=False, **sc["config"])
        ctrl = None
    else:
        cfg = JobConfig(planner="fixed", plan=sc["plan"], batch=Plan.parse(sc["plan"]).B, run_dir=run_dir,
                        epochs=1000, metrics_period=10, checkpoint=bool(sc.get("stop_at")))
        cfg.batch_min, cfg.batch_max = 1, 10**9
        ctrl = LrScripted(sc["schedule"], {int(k): v for k, v in sc.get("lr_scales", {}).items()})
    cfg.validate()
    loss = nn.CrossEntropyLoss()
    box: list[Trainer] = []

    def forward(model, batch):
        if sc["kind"] == "dict":
            x, y, ids = batch["x"], batch["y"], batch["id"]
        else:
            x, y, ids = batch
        tr = box[0]
        seen.append([tr.iteration, tr.sampler.epoch, ids.tolist()])
        return loss(model(x), y)

    tr = Trainer(model, opt, loader, loss, config=cfg, controller=ctrl, forward_fn=forward)
    box.append(tr)
    return tr


spec = json.loads(Path(sys.argv[1]).read_text())
out: dict = {"scenarios": {}}
rank = 0
for sc in spec["scenarios"]:
    run_dir = str(Path(spec["out_dir"]) / sc["name"])
    seen: list = []
    tr = trainer_for(sc, run_dir, seen)
    rank = tr.rank
    stop_at = sc.get("stop_at")
    tr.fit(max_iterations=stop_at or sc["steps"], resume=False)
    history = list(tr.history)
    lead = tr.decision_lead
    resumed = None
    if stop_at:
        tr.save_checkpoint()
        pending = [d.at_iteration for d in tr.pending]
        tr = trainer_for(sc, run_dir, seen)
        tr.fit(max_iterations=sc["steps"], resume=True)
        history += list(tr.history)
        resumed = {"from": tr.resumed_from, "pending_at_stop": pending}
    out["scenarios"][sc["name"]] = {
        "params": {k: v.tolist() for k, v in tr.model.state_dict().items()}, "seen": seen, "history": history,
        "iterations": tr.iteration, "lead": lead, "resumed": resumed,
        "workers": tr.feed.loader.num_workers, "persistent": tr.feed.loader.persistent_workers}
(Path(spec["out_dir"]) / f"rank{rank}.json").write_text(json.dumps(out))
