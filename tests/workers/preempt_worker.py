"""Trainer on every rank; at an iteration one rank sends itself a stop signal or SIGKILL (tests/test_preemption.py).

Spec: plan, steps, n, optimizer, lr, run_dir, checkpoint_every / checkpoint_minutes, signal_at =
{"it": k, "rank": r, "signal": "USR1"|"USR2"|"TERM"|"KILL"}, resume. Rank r writes rank<r>.json.
"""
import json
import os
import signal
import sys
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model, make_optimizer  # noqa: E402

from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.core.planning import Plan  # noqa: E402
from hpc_jabas.runtime.hooks import Callback  # noqa: E402
from hpc_jabas.runtime.safepoint import stop_signals  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

spec = json.loads(Path(sys.argv[1]).read_text())
B = Plan.parse(spec["plan"]).B
cfg = JobConfig(planner="fixed", plan=spec["plan"], batch=B, batch_min=1, batch_max=10**9, run_dir=spec["run_dir"],
                epochs=spec.get("epochs", 1000), metrics_period=spec.get("metrics_period", 10),
                checkpoint_every=spec.get("checkpoint_every"), checkpoint_minutes=spec.get("checkpoint_minutes"),
                keep_checkpoints=spec.get("keep_checkpoints", 3),
                **({"safe_point_s": spec["safe_point_s"]} if "safe_point_s" in spec else {})).validate()


class SignalAt(Callback):
    def __init__(self, at):
        self.at = at

    def on_step_end(self, trainer, rec):
        a = self.at
        if a and trainer.rank == a["rank"] and trainer.iteration == a["it"]:
            os.kill(os.getpid(), getattr(signal, "SIG" + a["signal"]))


stop_signals().install()
model = make_model()
tr = Trainer(model, make_optimizer(spec["optimizer"], model.parameters(), spec["lr"]), make_data(spec.get("n", 240)),
             nn.CrossEntropyLoss(), config=cfg,
             callbacks=[SignalAt(None if spec.get("resume") else spec.get("signal_at"))])
res = tr.fit(max_iterations=spec["steps"], resume=spec.get("resume", False))
out = {"rank": tr.rank, "params": {k: v.tolist() for k, v in model.state_dict().items()}, "iterations": tr.iteration,
       "resumed_from": tr.resumed_from, "stopped": res["stopped"], "sampler": tr.sampler.state_dict()}
(Path(spec["out_dir"]) / f"rank{tr.rank}.json").write_text(json.dumps(out))
