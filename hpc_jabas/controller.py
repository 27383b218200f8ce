"""Rank-0 decisions, broadcast so that every rank switches at the same iteration (invariant 4).

A controller is called by the trainer on every rank after every iteration. On a decision
round (every p iterations) rank 0 decides from the gradient statistics of that iteration
(policy -> new B -> planner -> lr rule) and ``comm.broadcast_object`` carries the Decision;
every rank applies it at ``at_iteration`` (the next iteration), not earlier or later.
"""
from __future__ import annotations

from .decision import Decision
from .plan import Plan


class BaseController:
    p: int = 1

    def attach(self, trainer) -> None:
        self.trainer = trainer

    def wants_stats(self, iteration: int) -> bool:
        return False

    def is_round(self, done_iterations: int) -> bool:
        return done_iterations % self.p == 0

    def decide(self, trainer, rec: dict) -> Decision | None:  # rank 0 only
        return None

    def after_step(self, trainer, rec: dict) -> Decision | None:
        """Collective on decision rounds: rank 0 decides, everyone receives the same Decision."""
        if not self.is_round(trainer.iteration):
            return None
        from . import comm
        d = self.decide(trainer, rec) if trainer.rank == 0 else None
        payload = comm.broadcast_object(d.to_dict() if d is not None else None, root_rank=0, name="hj.decision")
        if payload is None:
            return None
        d = Decision.from_dict(payload)
        self.on_decision(trainer, d)
        return d

    def on_decision(self, trainer, d: Decision) -> None:
        if trainer.rank == 0:
            trainer.metrics.write({"type": "decision", **d.to_dict()})

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        pass


class ScriptedController(BaseController):
    """Applies a given schedule {iteration: plan or B}: a known B trajectory (tests, replays)."""

    def __init__(self, schedule: dict[int, "Plan | str | int"], lr_rule=None):
        self.schedule = {int(k): v for k, v in schedule.items()}
        self.lr_rule = lr_rule
        self.p = 1

    def is_round(self, done_iterations: int) -> bool:
        return done_iterations in self.schedule

    def decide(self, trainer, rec):
        v = self.schedule[trainer.iteration]
        if isinstance(v, int):
            plan = trainer.planner_fn(v, None)
        elif isinstance(v, str):
            plan = Plan.parse(v)
        else:
            plan = v
        lr = self.lr_rule(plan.B) if self.lr_rule else trainer.lr_scale
        return Decision(trainer.iteration, plan.B, plan, float(lr), reason="scripted")
