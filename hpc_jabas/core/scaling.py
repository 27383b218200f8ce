"""Learning-rate (and weight-decay) scaling rules: a factor for a global batch B vs B_ref. Pure.

``lr_scale(B)`` is what the trainer multiplies into the lr of the user's own optimizer and
scheduler (policy.py's module docstring says when each rule is used; ``policy.make_lr_rule`` and
``policy.make_wd_rule`` build them by name).
"""
from __future__ import annotations

import math
from typing import Any

from hpc_jabas.core.validate import is_number
from hpc_jabas.errors import ConfigError


class LRRule:
    """Base lr rule: ``lr_scale(B) -> float`` multiplies the user's scheduler's lr (module docstring)."""

    name = "base"

    def __init__(self, B_ref: int) -> None:
        if isinstance(B_ref, bool) or not is_number(B_ref, nan=False) or not B_ref >= 1 or math.isinf(B_ref):
            raise ConfigError(f"B_ref={B_ref!r} is invalid; the reference batch size must be a number >= 1")
        self.B_ref = float(B_ref)

    def _scale(self, B: float) -> float:
        if isinstance(B, bool) or not is_number(B, nan=False) or not B > 0 or math.isinf(B):
            raise ConfigError(f"B={B!r} is invalid; the global batch size must be a number > 0")
        return float(B) / self.B_ref

    def lr_scale(self, B: float) -> float:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "B_ref": self.B_ref}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ConfigError(f"lr rule state is for {state.get('name')!r}, not {self.name!r}")
        self.B_ref = float(state["B_ref"])


class NoScaling(LRRule):
    """The scheduler's lr as is."""

    name = "none"

    def lr_scale(self, B: float) -> float:
        self._scale(B)
        return 1.0


class SqrtScaling(LRRule):
    """lr * sqrt(B / B_ref) (JABAS's rule)."""

    name = "sqrt"

    def lr_scale(self, B: float) -> float:
        return math.sqrt(self._scale(B))


class LinearScaling(LRRule):
    """lr * B / B_ref (Goyal et al.)."""

    name = "linear"

    def lr_scale(self, B: float) -> float:
        return self._scale(B)
