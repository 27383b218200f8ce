"""Containment of rank 0's decision steps (invariant 8), on every rank; rank r writes rank<r>.json.

mode "decide": an AdaptiveController whose decide step raises (or returns a plan that does not
fit the job) on rank 0 at the iterations in spec["fail_at"].
mode "hooks": the user's scheduler stepped per epoch and per iteration; callbacks counted.
mode "epoch_end": the epoch-end auto-scaler whose cluster view raises at the first epoch end;
the job stops after a later epoch end and a fresh trainer and hook resume and finish the run.
"""
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model, make_optimizer  # noqa: E402

from hpc_jabas.core.adaptive.decision import Decision  # noqa: E402
from hpc_jabas.core.config.jobspec import JobSpec  # noqa: E402
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.core.planning import Plan  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.controller import AdaptiveController  # noqa: E402
from hpc_jabas.runtime.hooks import Callback  # noqa: E402
from hpc_jabas.runtime.job.lifecycle import EpochEndAutoscaler  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

spec = json.loads(Path(sys.argv[1]).read_text())


class FailingController(AdaptiveController):
    """The policy step fails on rank 0 at chosen iterations: an exception, or a malformed decision."""

    def __init__(self, cfg, fail_at: dict[int, str]):
        super().__init__(cfg)
        self.fail_at = fail_at

    def decide(self, trainer, rec):
        how = self.fail_at.get(trainer.iteration)
        if how == "raise":
            raise ZeroDivisionError(f"injected policy failure at iteration {trainer.iteration}")
        d = super().decide(trainer, rec)
        if how == "bad_plan":      # an internal bug: a plan for 2 ranks in a 3-rank job
            return Decision(trainer.iteration, 8, Plan(4, (1, 1)), d.lr_scale, reason="bad")
        return d


class View:
    types = {"v100": "v100", "rtx2060": "rtx2060"}
    free = {"v100": 0, "rtx2060": 2}
    billing = {"v100": 2.0, "rtx2060": 1.0}


calls = []


def flaky_cluster(partition_types):
    """Rank 0's cluster view: broken at the first epoch end, fine afterwards."""
    calls.append(1)
    if len(calls) == 1:
        raise KeyError("injected: sinfo output without a GRES column")
    return View()


def config(**kw):
    cfg = JobConfig(run_dir=spec["run_dir"], seed=0, metrics_period=spec.get("metrics_period", 4), **kw)
    for k, v in spec.get("config", {}).items():
        setattr(cfg, k, v)
    return cfg.validate()


def result(tr, **extra):
    return {"rank": tr.rank, "history": list(tr.history), "iterations": tr.iteration, "epoch": tr.sampler.epoch,
            "contained_errors": tr.decisions.contained_errors,
            "params": {k: v.tolist() for k, v in tr.model.state_dict().items()}, **extra}


class Counter(Callback):
    def __init__(self):
        self.first, self.steps, self.epochs = 0, [], []

    def on_first_step(self, trainer):
        self.first += 1

    def on_step_end(self, trainer, rec):
        self.steps.append(rec["it"])

    def on_epoch_end(self, trainer, epoch):
        self.epochs.append(epoch)


ds = make_data(spec.get("n", 240))
model = make_model()
opt = make_optimizer("momentum", model.parameters(), 0.05)
if spec["mode"] == "hooks":
    out = {"rank": 0}
    for step in ("epoch", "iteration"):
        m = make_model()
        o = make_optimizer("sgd", m.parameters(), 0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(o, lambda k: 0.5 ** k)
        cb = Counter()
        spec["run_dir"] = f"{spec['out_dir']}/run-{step}"
        tr = Trainer(m, o, ds, nn.CrossEntropyLoss(), config=config(), scheduler=sched, scheduler_step=step,
                     callbacks=[cb])
        tr.fit(resume=False)
        out[step] = {"last_epoch": sched.last_epoch, "lr": o.param_groups[0]["lr"], "first": cb.first,
                     "steps": cb.steps, "epochs": cb.epochs, "iterations": tr.iteration}
        out["rank"] = tr.rank
elif spec["mode"] == "decide":
    cfg = config()
    ctrl = FailingController(cfg, {int(k): v for k, v in spec["fail_at"].items()})
    tr = Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg, controller=ctrl)
    tr.fit(max_iterations=spec["steps"], resume=False)
    out = result(tr, trajectory=ctrl.b_trajectory())
else:
    job = JobSpec(task="m:f", config={"autoscale": {"objective": "time", "restart_prior_s": 1e6}},
                  chain_dir=spec["out_dir"], mix={"v100": 3})
    cfg = config()
    hook = EpochEndAutoscaler(job, read_cluster=flaky_cluster)
    tr = Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg, epoch_end_hook=hook)
    # stop right after an epoch end's decide, as a job that moves does: that epoch's checkpoint
    # was written before the decide, so the hook's new state lives only in its side file
    tr.fit(epochs=spec["stop_after_epochs"], resume=False)
    out = result(tr, hook_state=hook.state_dict(), cluster_calls=len(calls))
    # the next job resumes from the run directory: the hook's state after that decide comes back
    hook2 = EpochEndAutoscaler(job, read_cluster=flaky_cluster)
    m2 = make_model()
    tr2 = Trainer(m2, make_optimizer("momentum", m2.parameters(), 0.05), ds, nn.CrossEntropyLoss(),
                  config=config(), epoch_end_hook=hook2)
    out["resumed"] = tr2.maybe_resume()
    out["resumed_hook_state"] = hook2.state_dict()
    out["resumed_iteration"] = tr2.iteration
    tr2.fit(resume=False)
    out["final"] = {"epoch": tr2.sampler.epoch, "iterations": tr2.iteration,
                    "contained_errors": tr2.decisions.contained_errors,
                    "moved_to": tr2.moved_to.to_dict() if tr2.moved_to else None}
out["backend"] = comm.backend()
(Path(spec["out_dir"]) / f"rank{tr.rank}.json").write_text(json.dumps(out))
