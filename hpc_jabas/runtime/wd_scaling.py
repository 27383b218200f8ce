"""The weight-decay rule (``wd_rule``, core/adaptive/policy.py ``make_wd_rule``) applied to the optimizer: before
every step each param group's weight decay is its own weight decay times the rule's factor at the B in force. The
adaptive controller (runtime/controller.py) installs it as the optimizer's pre-step hook and checkpoints its state.
"""
from __future__ import annotations

from typing import Any

from hpc_jabas.core.adaptive.scaling import LRRule


class WeightDecayScaling:
    """Each param group's own weight decay (``base``) and what the rule last set there (``written``): a value found
    that differs from the one written was set by the user (or a scheduler) since, and is the new base. The
    optimizer's state holds the scaled values, so a resume needs the base from ``state``."""

    def __init__(self, rule: LRRule) -> None:
        self.rule = rule
        self.base: list[float] | None = None       # the optimizer's own weight decay per param group
        self.written: list[float] | None = None    # what the rule last set (a change elsewhere is a new base)

    def apply(self, groups: list[dict[str, Any]], B: int) -> None:
        """Every step: each of the optimizer's param ``groups``' weight decay = its own x the rule at ``B``."""
        scale = self.rule.lr_scale(B)
        if self.base is None or self.written is None or len(self.base) != len(groups):
            self.base = [float(g.get("weight_decay", 0.0)) for g in groups]
            self.written = list(self.base)
        base, wset = self.base, self.written
        for i, g in enumerate(groups):
            cur = float(g.get("weight_decay", 0.0))
            if cur != wset[i]:                      # set by the user (or a scheduler) since: the new base
                base[i] = cur
            g["weight_decay"] = base[i] * scale
            wset[i] = g["weight_decay"]

    def state(self) -> list[list[float] | None]:
        return [self.base, self.written]

    def load(self, wd: list[list[float] | None] | None) -> None:
        wd = wd or [None, None]
        self.base, self.written = wd[0], wd[1]
