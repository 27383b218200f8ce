"""Every public name of ``hpc_jabas`` that runs without Slurm, used as a user's script uses it: only
``import hpc_jabas`` (and torch), the script's own command line, a user-written Controller, EpochEndHook and
Callback handed to the Trainer. tests/test_public_api.py copies it into a clean directory and runs it as one
process; it prints one JSON line: what each part saw.

    python public_names_user.py --batch 16 --micro-batch 8 --epochs 2 --run-dir run -q
"""
import io
import json

import torch

from hpc_jabas import (
    ArgumentParser,
    Callback,
    CheckpointError,
    ConfigError,
    Controller,
    Decision,
    DistributedEval,
    EpochEndHook,
    InfeasibleError,
    JabasError,
    JobConfig,
    JobSpec,
    MoveDecision,
    Plan,
    SlurmError,
    SlurmRequest,
    StateError,
    Task,
    Trainer,
    World,
    add_arguments,
    add_verbosity_flags,
    config_from_args,
    configure_from_args,
    configure_logging,
    proportional_plan,
    report_throughput,
    run_main,
)

seen: dict = {"decided_epochs": [], "steps": 0, "errors": []}


class DoubleAtThree(Controller):
    """A user's controller: at iteration 3, B doubles (one rank: the plan is b x 2n), lr scaled alike."""

    def attach(self, trainer):
        self.traj = [(0, trainer.B)]

    def wants_stats(self, iteration):
        return False

    def after_step(self, trainer, rec):
        if trainer.iteration != 3:
            return None
        B = 2 * trainer.B
        at = trainer.iteration + trainer.decision_lead
        self.traj.append((at, B))
        return Decision(at, B, proportional_plan(B, trainer.plan.bs[0], [1.0]), 2.0, reason="user rule")

    def b_trajectory(self):
        return list(self.traj)

    def state_dict(self):
        return {"traj": self.traj}

    def load_state_dict(self, d):
        self.traj = [tuple(t) for t in d["traj"]]


class Stay(EpochEndHook):
    def decide(self, trainer, epoch):
        seen["decided_epochs"].append(epoch)
        return MoveDecision.stay("a user's hook: stay")


class Count(Callback):
    def on_step_end(self, trainer, rec):
        seen["steps"] += 1


def build() -> Task:
    torch.manual_seed(0)
    x = torch.randn(96, 4)
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    model = torch.nn.Linear(4, 2)
    return Task(model, torch.optim.SGD(model.parameters(), lr=0.1), data, torch.nn.CrossEntropyLoss(),
                eval_fn=DistributedEval(data, loss_fn=torch.nn.functional.cross_entropy), callbacks=[Count()])


def main(argv=None):
    ap = ArgumentParser(description="every public name")
    add_arguments(ap)
    add_verbosity_flags(ap)                 # there already: a no-op
    args = ap.parse_args(argv)
    configure_from_args(args)
    configure_logging("warning")
    cfg = config_from_args(args)
    assert isinstance(cfg, JobConfig)
    for bad in (lambda: JobConfig(batch=0).validate(), lambda: Plan(4, (0, 0))):
        try:
            bad()
        except ConfigError as e:             # one line naming the value
            seen["errors"].append(str(e))
    assert all(issubclass(E, JabasError) for E in (CheckpointError, InfeasibleError, SlurmError, StateError))
    spec = JobSpec(task="public_names_user:build", config={"train": {"batch": 16}}, chain_dir="chain",
                   mix={"gpu": 1}, slurm=SlurmRequest(time_min=5))
    seen["spec"] = [spec.task, spec.slurm.time_min]
    task = build()
    world = World.detect(["v100"])
    trainer = Trainer(task.model, task.optimizer, task.dataset, task.loss_fn, config=cfg, eval_fn=task.eval_fn,
                      callbacks=task.callbacks, controller=DoubleAtThree(), epoch_end_hook=Stay(), world=world)
    result = trainer.fit()
    out = io.StringIO()
    rows = report_throughput(trainer, result, file=out)
    seen.update(world=[world.rank, world.size], iterations=result["iterations"], b_trajectory=trainer.b_trajectory(),
                samples=rows[0]["samples"], report=out.getvalue().splitlines()[0].split()[0:2])
    print(json.dumps(seen))


run_main(main)
