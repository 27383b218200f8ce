"""Decisions announced ahead: in force from their ``at_iteration``, not from when they were made.

A DataLoader with workers draws index lists ahead of the training thread (runtime/data.py), so a
decision must name an iteration the loader has not drawn yet: the controller announces it for
``trainer.iteration + trainer.decision_lead``; every rank keeps it here until the trainer reaches
that iteration and applies it then. The loader's batch sampler reads the plan of any iteration
it draws from the same queue (``plan_at``), so the trainer and the loader cut every iteration the
same way. With no lookahead (lead 0) a decision is due at once, as it always was.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hpc_jabas.core.adaptive.decision import Decision
from hpc_jabas.core.planning import Plan


class PendingDecisions:
    """Announced decisions not in force yet, in iteration order (the same on every rank)."""

    def __init__(self) -> None:
        self._q: list[Decision] = []

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Decision]:
        return iter(list(self._q))

    def add(self, d: Decision) -> None:
        if self._q and d.at_iteration < self._q[-1].at_iteration:
            raise RuntimeError(f"decision for iteration {d.at_iteration} announced after one for "
                               f"{self._q[-1].at_iteration}; announcements must not go back in time")
        self._q.append(d)

    def due(self, iteration: int) -> list[Decision]:
        """Remove and return the decisions in force at ``iteration`` (in order; the last one wins)."""
        k = 0
        while k < len(self._q) and self._q[k].at_iteration <= iteration:
            k += 1
        out, self._q = self._q[:k], self._q[k:]
        return out

    def latest(self) -> Decision | None:
        return self._q[-1] if self._q else None

    def plan_at(self, iteration: int, current: Plan) -> Plan:
        """The plan in force at ``iteration`` (>= the trainer's): the last announced one due by then."""
        plan = current
        for d in self._q:
            if d.at_iteration > iteration:
                break
            plan = d.plan
        return plan

    # ---- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> list[dict[str, Any]]:
        return [d.to_dict() for d in self._q]

    def load_state_dict(self, ds: list[dict[str, Any]], world: int,
                        replan: Callable[[int], Plan] | None = None) -> None:
        """``replan(B)``: a plan for this job's ranks when a saved plan was made for another rank count."""
        q = []
        for raw in ds:
            d = Decision.from_dict(raw)
            if d.plan.world_size != world and replan is not None:
                plan = replan(d.B)
                d = Decision(d.at_iteration, plan.B, plan, d.lr_scale, d.reason, d.stats, d.kind)
            q.append(d)
        self._q = q
