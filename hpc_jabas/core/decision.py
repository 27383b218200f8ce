"""The Decision rank 0 broadcasts: what every rank applies, and at which iteration (invariant 4)."""
from __future__ import annotations

from dataclasses import dataclass, field

from hpc_jabas.core.plan import Plan


@dataclass(frozen=True)
class Decision:
    at_iteration: int
    B: int
    plan: Plan
    lr_scale: float
    reason: str = ""
    stats: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"at_iteration": self.at_iteration, "B": self.B, "plan": self.plan.to_dict(),
                "lr_scale": self.lr_scale, "reason": self.reason, "stats": dict(self.stats)}

    @classmethod
    def from_dict(cls, d: dict) -> Decision:
        return cls(int(d["at_iteration"]), int(d["B"]), Plan.from_dict(d["plan"]), float(d["lr_scale"]),
                   d.get("reason", ""), dict(d.get("stats", {})))
