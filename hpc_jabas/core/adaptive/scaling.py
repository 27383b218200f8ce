"""Learning-rate (and weight-decay) scaling rules: a factor for a global batch B vs B_ref. Pure.

``lr_scale(B)`` is what the trainer multiplies into the lr of the user's own optimizer and
scheduler (policy.py's module docstring says when each rule is used; ``policy.make_lr_rule`` and
``policy.make_wd_rule`` build them by name).
"""
from __future__ import annotations

import math
from typing import Any

from hpc_jabas.core.config.validate import is_number
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


class AdaScaleRule(LRRule):
    """AdaScale (Johnson et al., ICML 2020), the lr rule Pollux pairs with goodput: lr * r, the gain

        r = (var + G2) / (var / s + G2) = E|g_B_ref|^2 / E|g_B|^2,   s = B / B_ref,   var = S / B_ref,

    from the gradient noise-scale estimates G2 = |G|^2 and S = tr(Sigma) of one sample's gradient
    (core/adaptive/stats.py), so var is the noise of a B_ref-sample batch's gradient. Equivalently r = s * E(B),
    Pollux's
    statistical efficiency with B_0 = B_ref. r lies between 1 and s: s (linear scaling) where the noise
    dominates the gradient, 1 where it has none (a larger batch then buys no larger step). The controller
    hands it its latest estimates (:meth:`observe`); before the first, r = 1 (the reference batch's lr, as
    AdaScale starts), and while the |G|^2 estimate is <= 0 (the noise swamps it) r = s. A scheduler stepped
    per iteration advances r iterations per iteration (scale-invariant progress: the trainer carries the
    fraction)."""

    name = "adascale"

    def __init__(self, B_ref: int) -> None:
        super().__init__(B_ref)
        self.G2: float | None = None
        self.S: float | None = None

    def observe(self, G2: float | None, S: float | None) -> None:
        """The latest estimates of |G|^2 and tr(Sigma); a missing or non-finite pair is ignored."""
        if G2 is None or S is None or not is_number(G2, nan=False) or not is_number(S, nan=False) \
                or math.isinf(G2) or math.isinf(S):
            return
        self.G2, self.S = float(G2), float(S)

    def gain(self, B: float) -> float:
        s = self._scale(B)
        if self.G2 is None or self.S is None:
            return 1.0
        var = max(0.0, self.S) / self.B_ref           # tr(Sigma) of a B_ref-sample batch's mean gradient
        if self.G2 <= 0.0:
            return s                                  # noise dominates: linear
        return (var + self.G2) / (var / s + self.G2)

    def lr_scale(self, B: float) -> float:
        return self.gain(B)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "G2": self.G2, "S": self.S}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.G2 = None if state.get("G2") is None else float(state["G2"])
        self.S = None if state.get("S") is None else float(state["S"])
