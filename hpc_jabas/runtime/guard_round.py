"""The divergence guard on moves up (core/adaptive/guard.py) as the adaptive controller (runtime/controller.py) runs
it: every rank keeps its part of each iteration's loss (iteration, samples, loss sum, step skipped) until the next
decision round, where one small allreduce gives rank 0 the whole batch's loss of each, what metrics.jsonl records
as ``loss``; rank 0 then judges the last move up before the policy's decision takes effect (``consent``): a
revert is the decision, and a move up during the cool-down, or before the last one is judged, keeps B.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpc_jabas.core.adaptive.decision import Decision
from hpc_jabas.core.adaptive.guard import DivergenceGuard
from hpc_jabas.core.planning import Plan
from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.runtime.hooks import TrainerView
from hpc_jabas.runtime.record import StepRecord

if TYPE_CHECKING:
    import logging

    from hpc_jabas.core.adaptive.guard import Revert

#: (iteration, samples, loss sum, step skipped): one iteration's loss as this rank keeps it until the next round
LossRow = tuple[int, float, float, bool]


class GuardRound:
    """The guard, this rank's pending losses, and the guard's part of a decision round."""

    def __init__(self, guard: DivergenceGuard) -> None:
        self.guard = guard
        self.losses: list[LossRow] = []

    def record(self, rec: StepRecord) -> None:
        """Every rank, every iteration: its part of the iteration's loss."""
        self.losses.append((int(rec.it), float(rec.samples), float(rec.loss_sum), bool(rec.skipped)))

    def gather(self, trainer: TrainerView) -> None:
        """Collective (every rank, on policy rounds): the whole batch's loss of every iteration since the last
        round, as metrics.jsonl records it (the ranks' loss sums over the batch's samples), into the guard."""
        import torch

        rows, self.losses = self.losses, []
        if not rows:
            return
        sums = comm.allreduce_sum(torch.tensor([r[2] for r in rows], dtype=torch.float64), name="hj.guard.loss")
        if trainer.rank == 0:
            for (it, n, _, skipped), s in zip(rows, sums.tolist()):
                if not skipped:                  # an fp16 step the scaler skipped (inf/nan) trained nothing
                    self.guard.observe(it, s / n if n > 0 else float("nan"))

    def consent(self, trainer: TrainerView, d: Decision, announced: tuple[int, Plan, float],
                revert_plan: Callable[[int], Plan], log: logging.Logger) -> Decision:
        """Rank 0, the policy's decision ``d`` made: the guard's verdict on the last move up (a revert is the
        decision, its plan from ``revert_plan(B)``), else ``d`` or, when the guard holds a move up back, the
        announced B and lr scale."""
        g = self.guard
        rv = g.check(trainer.iteration, d.at_iteration)
        B_now, plan_now, lr_now = announced
        if rv is not None:
            return self._revert(trainer, rv, d, B_now, revert_plan, log)
        why = g.allow(trainer.iteration, B_now, lr_now, d.B, d.lr_scale)
        if why is not None:
            stats = {**d.stats, "guard_blocked": {"B": d.B, "lr_scale": d.lr_scale}}
            d = Decision(d.at_iteration, B_now, plan_now, lr_now, reason=f"{d.reason}; {why}", stats=stats)
        if g.last is not None:
            d.stats["guard"] = g.last.to_dict()          # the verdict on the last move up: accepted
        g.moved(d.at_iteration, B_now, lr_now, d.B, d.lr_scale)
        return d

    def _revert(self, trainer: TrainerView, rv: Revert, d: Decision, B_before: int,
                revert_plan: Callable[[int], Plan], log: logging.Logger) -> Decision:
        """The guard undid the last move up: back to its B and lr scale, said in one line and one record. The
        policy has decided (its statistics taken, as without the guard), its wish is dropped."""
        plan = revert_plan(rv.B)
        log.warning("%s", rv.line(d.at_iteration))
        rec = {"type": "guard", "it": trainer.iteration, "at_iteration": d.at_iteration, **rv.to_dict(),
               "B": plan.B, "policy_wished": d.B}
        trainer.metrics.write(rec)
        stats = {**d.stats, "guard": rv.to_dict(), "B_before": B_before}
        return Decision(d.at_iteration, plan.B, plan, float(rv.lr_scale),
                        reason=f"divergence guard: revert to B={plan.B} (the loss rose from {rv.band.pre_mean:.4g} "
                               f"to {rv.band.post_mean:.4g} at B={rv.B_bad}); the policy wished B={d.B}",
                        stats=stats)

    def state_dict(self, one_rank: bool) -> dict[str, Any]:
        """The guard's state; with ``one_rank`` the pending losses too (they are then the whole batch's; with more
        ranks each holds its own part until the next round, and rank 0 alone writes the checkpoint)."""
        return {"guard": self.guard.state_dict(),
                "guard_pending": [list(r) for r in self.losses] if one_rank else None}

    def load_state_dict(self, d: dict[str, Any], one_rank: bool) -> None:
        if d.get("guard"):
            self.guard.load_state_dict(d["guard"])
            pend = d.get("guard_pending")
            self.losses = [(int(r[0]), float(r[1]), float(r[2]), bool(r[3])) for r in pend] \
                if pend is not None and one_rank else []
