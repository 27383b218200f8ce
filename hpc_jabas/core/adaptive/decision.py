"""What rank 0 decides and every rank applies (invariants 4 and 8).

Two decision types ride on the one protocol (runtime/protocol.py):

- ``Decision``: a batch-size or balancing decision, applied by every rank at ``at_iteration``.
  ``kind`` says where it came from: "batch" (policy -> new B -> planner), "rebalance" (same B,
  new plan from measured speeds) or "noop" (nothing changes: what rank 0 broadcasts when its
  decide step raised, so that the job goes on).
- ``MoveDecision``: the epoch-end auto-scaler's "stay or move to this partition mix"; after the
  move is acted on (the next job submitted) it also names that job.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, cast

from hpc_jabas.core.planning.plan import Plan

DecisionKind = Literal["batch", "rebalance", "noop"]
KINDS: tuple[DecisionKind, ...] = ("batch", "rebalance", "noop")


@dataclass(frozen=True, init=False)
class Decision:
    """From ``at_iteration`` on, ``plan`` (which carries the global batch: ``B`` is ``plan.B``) and ``lr_scale``.

    Built as ``Decision(at_iteration, B, plan, lr_scale, ...)``: ``B`` is the plan's B, said for the reader (None:
    the plan's); one that differs from it is refused (ValueError), as the decision could not be applied."""

    at_iteration: int
    plan: Plan
    lr_scale: float
    reason: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    kind: DecisionKind = "batch"

    def __init__(self, at_iteration: int, B: int | None, plan: Plan, lr_scale: float, reason: str = "",
                 stats: dict[str, Any] | None = None, kind: DecisionKind = "batch") -> None:
        if kind not in KINDS:
            raise ValueError(f"decision kind {kind!r} is not one of {KINDS}")
        if B is not None and B != plan.B:
            raise ValueError(f"decision B={B} differs from its plan's B={plan.B} ({plan}); give the plan's B")
        for k, v in (("at_iteration", at_iteration), ("plan", plan), ("lr_scale", lr_scale), ("reason", reason),
                     ("stats", {} if stats is None else stats), ("kind", kind)):
            object.__setattr__(self, k, v)

    @property
    def B(self) -> int:
        """The global batch from ``at_iteration`` on: the plan's."""
        return self.plan.B

    @classmethod
    def noop(cls, at_iteration: int, B: int, plan: Plan, lr_scale: float, reason: str = "") -> Decision:
        """Keep B, the plan and the lr scale as they are."""
        return cls(at_iteration, B, plan, lr_scale, reason=reason, kind="noop")

    def to_dict(self) -> dict[str, Any]:
        return {"at_iteration": self.at_iteration, "B": self.B, "plan": self.plan.to_dict(),
                "lr_scale": self.lr_scale, "reason": self.reason, "stats": dict(self.stats), "kind": self.kind}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Decision:
        kind = d.get("kind", "batch")
        if kind not in KINDS:
            raise ValueError(f"decision kind {kind!r} is not one of {KINDS}")
        return cls(int(d["at_iteration"]), int(d["B"]), Plan.from_dict(d["plan"]), float(d["lr_scale"]),
                   str(d.get("reason", "")), dict(d.get("stats", {})), cast(DecisionKind, kind))


@dataclass(frozen=True)
class MoveDecision:
    """Stay on this allocation, or move the job to ``mix`` (partition -> GPU count)."""

    move: bool
    mix: dict[str, int] | None = None
    reason: str = ""
    job_id: str | None = None          # the next job, once submitted (the "act" step)

    def __post_init__(self) -> None:
        if self.move and not self.mix:
            raise ValueError("a move needs a partition mix")

    @classmethod
    def stay(cls, reason: str = "") -> MoveDecision:
        return cls(False, None, reason)

    def to_dict(self) -> dict[str, Any]:
        return {"move": self.move, "mix": dict(self.mix) if self.mix else None, "reason": self.reason,
                "job_id": self.job_id}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoveDecision:
        mix = d.get("mix")
        job = d.get("job_id")
        return cls(bool(d["move"]), {str(k): int(v) for k, v in mix.items()} if mix else None,
                   str(d.get("reason", "")), str(job) if job is not None else None)
