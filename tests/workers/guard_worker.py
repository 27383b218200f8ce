"""One Trainer (one rank, or several under mpirun) for tests/test_trust.py and tests/test_guards.py.

Spec: plan, steps, n, optimizer, lr (a float or "nan"), run_dir, out_dir, resume, checkpoint_every,
num_workers (0: the TensorDataset itself; else a DataLoader with that many workers and a worker_init_fn
that records each worker's pid), prefetch_factor, signal_at = {"it": k, "to": "self"|"workers"|"both",
"signal": "TERM", "where": "step_end"|"forward", "kill_workers": "one"|"all"}, amp, inf_loss_at (the
loss of that iteration times inf; on rank inf_rank only when given), poison_at (the weights set to NaN
after that iteration's step). Rank r writes rank<r>.json: params, iterations, stopped, resumed_from, the
error line (class and message) when fit raised a JabasError, the worker pids, and whether each worker
was alive after the signal.
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model, make_optimizer  # noqa: E402

from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.core.planning import Plan  # noqa: E402
from hpc_jabas.errors import JabasError  # noqa: E402
from hpc_jabas.runtime.hooks import Callback  # noqa: E402
from hpc_jabas.runtime.safepoint import stop_signals  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

spec = json.loads(Path(sys.argv[1]).read_text())
out_dir = Path(spec["out_dir"])
PIDS = out_dir / f"worker_pids{os.environ.get('OMPI_COMM_WORLD_RANK', '0')}"     # each rank its own workers


def record_pid(worker_id):            # the user's worker_init_fn: the Trainer chains it
    with open(PIDS, "a") as f:
        f.write(f"{os.getpid()}\n")


def worker_pids():
    if not PIDS.exists():
        return []
    return sorted({int(x) for x in PIDS.read_text().split()})


NEXT = {"it": 0}                     # the iteration the trainer runs next (for the forward below)
ALIVE = []                           # after the signal: is each worker still alive
SKIPPED = []                         # iterations whose fp16 step the loss scaler skipped


class SignalAt(Callback):
    def __init__(self, at):
        self.at = at

    def on_step_end(self, trainer, rec):
        NEXT["it"] = trainer.iteration
        if rec.get("skipped"):
            SKIPPED.append(rec["it"])
        if spec.get("poison_at") is not None and trainer.iteration - 1 == spec["poison_at"]:
            with torch.no_grad():
                for p in trainer.model.parameters():
                    p.fill_(float("nan"))
        a = self.at
        if a and a.get("where", "step_end") == "step_end" and trainer.iteration == a["it"] \
                and trainer.rank == a.get("rank", 0):
            fire(a)


def fire(a):
    """Send the stop signal (to this process, its workers or both), then SIGKILL some workers."""
    sig = getattr(signal, "SIG" + a.get("signal", "TERM"))
    if a.get("to", "both") in ("workers", "both"):
        for pid in worker_pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    if a.get("to", "both") in ("self", "both"):
        os.kill(os.getpid(), sig)
    time.sleep(0.5)
    ALIVE.extend(_alive(pid) for pid in worker_pids())
    kill = {"one": worker_pids()[:1], "all": worker_pids()}.get(a.get("kill_workers") or "", [])
    for pid in kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def tr_rank():
    return int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


B = Plan.parse(spec["plan"]).B
cfg = JobConfig(planner="fixed", plan=spec["plan"], batch=B, batch_min=1, batch_max=10**9, run_dir=spec["run_dir"],
                epochs=spec.get("epochs", 1000), metrics_period=spec.get("metrics_period", 10),
                checkpoint_every=spec.get("checkpoint_every"), amp=spec.get("amp", "off"),
                trust_group=spec.get("trust_group", False)).validate()
stop_signals().install()
model = make_model(dtype=torch.float32 if spec.get("amp", "off") != "off" else torch.float64)
lr = float(spec["lr"])
opt = make_optimizer(spec["optimizer"], model.parameters(), lr)
ds = make_data(spec.get("n", 240), dtype=next(model.parameters()).dtype)
data = ds
if spec.get("num_workers"):
    data = torch.utils.data.DataLoader(ds, num_workers=int(spec["num_workers"]), worker_init_fn=record_pid,
                                       persistent_workers=True, prefetch_factor=spec.get("prefetch_factor", 2))
out = {"error": None}
try:
    loss_fn = nn.CrossEntropyLoss()

    def forward(m, batch):
        a = spec.get("signal_at")
        if a and a.get("where") == "forward" and NEXT["it"] == a["it"] and not spec.get("resume") \
                and not NEXT.get("fired"):
            NEXT["fired"] = True           # mid-iteration: this iteration's other micro-batches are still to read
            fire(a)
        loss = loss_fn(m(batch[0]), batch[1])
        inf = NEXT["it"] == spec.get("inf_loss_at") and spec.get("inf_rank", tr_rank()) == tr_rank()
        return loss * float("inf") if inf else loss
    tr = Trainer(model, opt, data, loss_fn, config=cfg, forward_fn=forward,
                 callbacks=[SignalAt(None if spec.get("resume") else spec.get("signal_at"))])
    NEXT["it"] = tr.iteration
    res = tr.fit(max_iterations=spec["steps"], resume=spec.get("resume", False))
    out.update(rank=tr.rank, iterations=tr.iteration, stopped=res["stopped"], resumed_from=tr.resumed_from,
               params={k: v.tolist() for k, v in model.state_dict().items()},
               skipped=SKIPPED)
except JabasError as e:
    out["error"] = [type(e).__name__, str(e)]
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
out["worker_pids"] = worker_pids()
out["alive_after_signal"] = ALIVE
(out_dir / f"rank{rank}.json").write_text(json.dumps(out))
