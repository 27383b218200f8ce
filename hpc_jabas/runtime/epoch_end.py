"""What ``Trainer.fit()`` runs at an epoch's end (every rank): the sampler's next epoch, BatchNorm buffers averaged,
the evaluation and the epoch's scheduler step, its line, the epoch's checkpoint first, the callbacks, then the
epoch-end hook's decision (an auto-scaler's move to another allocation, through the decision protocol: rank 0
decides, contained, every rank applies)."""
from __future__ import annotations

from typing import Any

from hpc_jabas.core.adaptive.decision import MoveDecision
from hpc_jabas.log import get_logger
from hpc_jabas.runtime import evaluate
from hpc_jabas.runtime.controller import final_goal

log = get_logger("hpc_jabas.runtime.trainer")


def checkpoints_epoch(tr: Any, epoch: int, fit_epochs: int) -> bool:
    """Whether the end of ``epoch`` (0-based) is checkpointed: every ``checkpoint_every_epochs``-th epoch, the
    fit's last one (of ``fit_epochs``), and every one when an epoch-end hook may move the job (it resumes from that
    checkpoint)."""
    n = tr.cfg.checkpoint_every_epochs
    return n <= 1 or tr.epoch_end_hook is not None or (epoch + 1) % n == 0 or epoch + 1 >= fit_epochs


def end_epoch(tr: Any, fit_epochs: int) -> MoveDecision | None:
    """Every rank, at the end of the sampler's epoch: the move the epoch-end hook made (the job then stops), else
    None."""
    epoch = tr.sampler.epoch
    tr.sampler.new_epoch()
    tr.checkpointer.average_buffers(tr.samples_local)    # BatchNorm buffers: sample-weighted mean
    ev = tr.eval_fn(tr.model) if tr.eval_fn is not None else None
    if evaluate.is_plateau(tr.scheduler):     # ReduceLROnPlateau: rank 0's eval metric, every rank
        evaluate.step_plateau(tr.scheduler, ev, tr.cfg.eval_metric, tr.rank)
    elif tr.scheduler is not None and tr.scheduler_step == "epoch" and final_goal(tr.controller) is None:
        tr.scheduler.step()                   # (goal = "final": at epochs of progress instead, step_end.py)
    if tr.rank == 0:
        tr.metrics.write({"type": "epoch_end", "epoch": epoch, "it": tr.iteration, "eval": ev, "B": tr.B})
        log.info("%s", evaluate.epoch_line(epoch, tr.cfg.epochs, tr.iteration, tr.B, ev))   # the job's log
    # the epoch's checkpoint first: nothing that can fail below (the hook's decide) can lose it
    path = tr.save_checkpoint() if checkpoints_epoch(tr, epoch, fit_epochs) else None
    for cb in tr.callbacks:
        cb.on_epoch_end(tr, epoch)
    hook = tr.epoch_end_hook
    if hook is None:
        return None

    def decide() -> MoveDecision:
        d = hook.decide(tr, epoch)
        tr.checkpointer.save_hook_state(path)     # its state (forecast, ...) for the job resuming from `path`
        return d
    d = tr.decisions.run("epoch_end.decide", tr.iteration, decide, MoveDecision.from_dict,
                         noop=lambda: MoveDecision.stay("contained error in the epoch-end decision"))
    if d is None or not d.move:
        return None
    # act (submit the next job) only now that the checkpoint it resumes from is on disk
    res = tr.decisions.run("epoch_end.act", tr.iteration, lambda: hook.act(tr, d), MoveDecision.from_dict,
                           noop=lambda: MoveDecision.stay("contained error while acting on the move"))
    return res if res is not None and res.move else None
