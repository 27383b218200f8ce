"""What follows every iteration's step in ``Trainer.train_step`` (every rank, in this order): the record kept
(history, the metrics' pending records, the calibration's samples), the iteration counted, the scheduler's
per-iteration steps, a calibration round, the controller's decision applied (rank 0 decided it, every rank applies
it at the iteration it names), the decisions due now, the epoch-end hook's and the callbacks' ``on_step_end``, and
the metrics flushed at the safe point's agreement boundaries."""
from __future__ import annotations

from typing import Any

from hpc_jabas.runtime import evaluate
from hpc_jabas.runtime.controller import final_goal
from hpc_jabas.runtime.record import StepRecord


def after_step(tr: Any, rec: StepRecord) -> None:
    """Every rank, once the iteration ``rec`` stepped: its record handed to the parts, the boundary's decisions."""
    it, plan = tr.iteration, tr.plan          # (read once: the TrainState's descriptors)
    tr.history.append({"it": it, "B": plan.B, "plan": str(plan), "lr_scale": tr.lr_scale})
    tr.iteration_metrics.add(rec)
    tr.calib.observe(rec)
    tr.iteration = it = it + 1
    if tr.scheduler is not None and tr.scheduler_step == "iteration":
        for _ in range(tr.state.scheduler_steps(tr.resolved.scale_invariant)):   # AdaScale: lr_scale steps
            tr.scheduler.step()
    if tr.calib.is_round(it):
        tr.calib.sync()                       # collective: the decision sees the calibrated model
    if tr.controller is not None:
        d = tr.controller.after_step(tr, rec)
        if d is not None:
            tr.apply(d)
        fin = final_goal(tr.controller)       # goal = "final": a per-epoch scheduler steps at epochs of progress
        if fin is not None and tr.scheduler is not None and tr.scheduler_step == "epoch" and \
                not evaluate.is_plateau(tr.scheduler):
            for _ in range(fin.epochs_due() or 0):
                tr.scheduler.step()
    tr.state.apply_due()                      # decisions announced earlier for this iteration
    if tr.epoch_end_hook is not None:
        tr.epoch_end_hook.on_step_end(tr, rec)
    for cb in tr.callbacks:
        cb.on_step_end(tr, rec)
    if len(tr.iteration_metrics) >= tr.cfg.metrics_period and tr.safe_points.agrees_at(it):
        tr.flush_metrics()                    # at the safe point's agreement boundaries (fewer collectives)
