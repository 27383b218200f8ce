"""Trainer on every rank from a JSON spec; rank r writes rank<r>.json (params, per-iteration history).

A spec with "cases" (a list of specs, each with its own out_dir) runs them one after another in this one
launch (mpi_util.run_ranks_cases): a fresh model, optimizer, data and Trainer per case."""
import json
import sys
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model, make_optimizer  # noqa: E402

from hpc_jabas.core.adaptive.decision import Decision  # noqa: E402
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.core.planning import Plan  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.controller import ScriptedController  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402


class LrScripted(ScriptedController):
    """lr scale changes ride on the same decisions."""

    def __init__(self, schedule, lrs):
        super().__init__(schedule)
        self.lrs = lrs

    def decide(self, trainer, rec):
        d = super().decide(trainer, rec)
        return Decision(d.at_iteration, d.B, d.plan, float(self.lrs.get(trainer.iteration, d.lr_scale)), d.reason)


class Measuring(ScriptedController):
    """Measures the gradient statistics every iteration, B kept (tests/test_uneven_stats_mpi.py)."""

    def wants_stats(self, iteration):
        return True


def _watch_deferral(tr: Trainer, defer: bool) -> tuple[list[int], list[bool]]:
    """The iterations whose measurement the trainer deferred, and each read of the optimizer's held measurement
    (True: one was held); ``defer`` False switches deferral off (tests/test_deferred_stats_mpi.py)."""
    deferred: list[int] = []
    held: list[bool] = []
    begin, read = tr.opt.begin, tr.opt.read_held
    if not defer and tr.controller is not None:
        tr.controller.defers_stats = lambda iteration: False           # type: ignore[attr-defined]

    def watched_begin(*a, **k):
        if k.get("defer"):
            deferred.append(tr.iteration)
        return begin(*a, **k)

    def watched_read():
        r = read()
        held.append(r[0])
        return r
    tr.opt.begin, tr.opt.read_held = watched_begin, watched_read      # type: ignore[method-assign]
    return deferred, held


def run(spec: dict) -> None:
    ds = make_data(spec.get("n", 240))
    model = make_model()
    opt = make_optimizer(spec["optimizer"], model.parameters(), spec["lr"])
    run_dir = spec.get("run_dir") or spec["out_dir"] + "/run"
    cfg = JobConfig(planner="fixed", plan=spec["plan"], batch=1, run_dir=run_dir,
                    seed=spec.get("seed", 0), tail=spec.get("tail", "shrink"), epochs=spec.get("epochs", 1000),
                    emulate=spec.get("emulate", False), gpu_types=spec.get("gpu_types"),
                    metrics_period=spec.get("metrics_period", 10), checkpoint=spec.get("checkpoint", True))
    cfg.batch = Plan.parse(spec["plan"]).B
    cfg.batch_min, cfg.batch_max = 1, 10**9
    for k, v in spec.get("config", {}).items():   # adaptive runs: policy, p, gamma, planner, ...
        setattr(cfg, k, {int(r): x for r, x in v.items()} if k == "slowdown" else v)
    cfg.validate()
    ctrl = None
    if spec.get("measure"):
        ctrl = Measuring({})
    elif spec.get("schedule"):
        lrs = {int(k): v for k, v in (spec.get("lr_scales") or {}).items()}
        ctrl = LrScripted(spec["schedule"], lrs) if lrs else ScriptedController(spec["schedule"])
    tr = Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg, controller=ctrl)
    deferred, held = _watch_deferral(tr, spec.get("defer", True))
    stop_at = spec.get("stop_at")
    res = tr.fit(max_iterations=stop_at or spec["steps"], resume=spec.get("resume", False))
    if stop_at:
        tr.save_checkpoint()
    out = {"rank": tr.rank, "params": {k: v.tolist() for k, v in model.state_dict().items()},
           "history": list(tr.history), "iterations": tr.iteration, "samples_local": tr.samples_local,
           "compute_local_s": tr.compute_local_s, "resumed_from": tr.resumed_from,
           "sampler": tr.sampler.state_dict(), "result": res,
           "trajectory": tr.controller.b_trajectory() if tr.controller is not None else None,
           "backend": comm.backend(), "deferred": deferred, "held": sum(held)}
    (Path(spec["out_dir"]) / f"rank{tr.rank}.json").write_text(json.dumps(out))
    if spec.get("shutdown"):         # the next case may run on the other backend (tests/test_backend_*.py)
        comm.shutdown()


main_spec = json.loads(Path(sys.argv[1]).read_text())
for one in main_spec.get("cases") or [main_spec]:
    run(one)
