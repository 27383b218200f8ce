"""Adaptive global-batch-size policies and learning-rate rules. Pure: plain Python.

Batch policies (background.md sections 1 and 5). Every ``p`` iterations the rank-0 controller
hands a policy a ``PolicyState`` (current B, iteration, latest statistics) and gets the new B:

- ``FixedPolicy``: keep B.
- ``SimilarityPolicy`` (JABAS / SimiGrad): cosine similarity of the two half-batch gradients
  below the target gamma -> B grows by a factor (1 + alpha); above -> B shrinks by (1 - alpha);
  equal -> keep. Every step moves B by at least one sample so small batches do not get stuck.
- ``NoiseScalePolicy`` (McCandlish et al. / Pollux): B = k * B_noise.

Every policy clips to [B_min, B_max] and then applies an injected ``snap(B) -> int`` (default:
identity), so a planner can return the nearest B it can realise exactly (B = b * M). The snapped
value is returned as is: the planner owns realisability.

Learning-rate rules return a multiplicative ``lr_scale`` that the trainer applies on top of the
user's own scheduler (lr = scheduler_lr * lr_scale): ``SqrtScaling`` (JABAS default),
``LinearScaling``, ``AdaScale`` (Johnson et al. 2020, as in Pollux) and ``NoScaling``.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hpc_jabas.errors import ConfigError

Snap = Callable[[int], int]

POLICIES = ("fixed", "similarity", "noise-scale")
_POLICY_ALIASES = {
    "fixed": "fixed", "none": "fixed", "constant": "fixed",
    "similarity": "similarity", "simigrad": "similarity", "jabas": "similarity",
    "noise-scale": "noise-scale", "noise_scale": "noise-scale", "noisescale": "noise-scale",
    "gns": "noise-scale", "pollux": "noise-scale",
}
LR_RULES = ("sqrt", "linear", "adascale", "none")
_LR_ALIASES = {
    "sqrt": "sqrt", "square-root": "sqrt", "sqrtscaling": "sqrt",
    "linear": "linear", "linearscaling": "linear",
    "adascale": "adascale",
    "none": "none", "noscaling": "none", "constant": "none",
}


@dataclass(frozen=True)
class PolicyState:
    """What a policy sees: the current global batch B, the iteration, the latest statistics.

    ``similarity``: cosine similarity of the two half-batch mean gradients (None if not measured).
    ``b_noise``: the smoothed gradient noise scale (None if unknown, inf if the signal is lost).
    """

    B: int
    iteration: int = 0
    similarity: float | None = None
    b_noise: float | None = None

    @classmethod
    def coerce(cls, state: PolicyState | Mapping[str, Any]) -> PolicyState:
        if isinstance(state, PolicyState):
            return state
        if isinstance(state, Mapping):
            extra = set(state) - {"B", "iteration", "similarity", "b_noise"}
            if extra or "B" not in state:
                raise ConfigError(f"policy state {dict(state)!r} is invalid; give keys B (required), "
                                  "iteration, similarity, b_noise")
            return cls(**state)
        raise ConfigError(f"policy state {state!r} is invalid; give a PolicyState or a dict with key B")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _int_at_least(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not (isinstance(value, float) and value.is_integer()):
        raise ConfigError(f"{name}={value!r} is invalid; it must be an integer >= {low}")
    if value < low:
        raise ConfigError(f"{name}={value!r} is invalid; it must be an integer >= {low}")
    return int(value)


class BatchPolicy:
    """Base: holds the bounds, the decision period p and the snap callable.

    Subclasses implement ``_target(state) -> float | None`` (None: keep the current B);
    ``decide`` clips the target to [B_min, B_max], rounds and snaps it.
    """

    name = "base"

    def __init__(self, B_min: int = 1, B_max: int | None = None, p: int = 100, snap: Snap | None = None) -> None:
        self.B_min = _int_at_least("B_min", B_min, 1)
        self.B_max = None if B_max is None else _int_at_least("B_max", B_max, 1)
        if self.B_max is not None and self.B_min > self.B_max:
            raise ConfigError(f"B_min={B_min} is larger than B_max={B_max}; need 1 <= B_min <= B_max")
        self.p = _int_at_least("p", p, 1)
        if snap is not None and not callable(snap):
            raise ConfigError(f"snap={snap!r} is not callable; give a function B -> int or None")
        self.snap: Snap = snap if snap is not None else (lambda B: B)

    def due(self, iteration: int) -> bool:
        """True at the iterations where a decision is taken (every p, not at iteration 0)."""
        return iteration > 0 and iteration % self.p == 0

    def clip(self, B: float) -> int:
        B = max(float(self.B_min), float(B))
        if self.B_max is not None:
            B = min(float(self.B_max), B)
        return int(round(B))

    def decide(self, state: PolicyState | Mapping[str, Any]) -> int:
        st = PolicyState.coerce(state)
        current = _int_at_least("B", st.B, 1)
        target = self._target(st)
        B = self.clip(current if target is None else target)
        out = self.snap(B)
        if isinstance(out, bool) or not isinstance(out, (int, float)) or out < 1 or int(out) != out:
            raise ConfigError(f"snap({B}) returned {out!r}; it must return an integer >= 1")
        return int(out)

    def _target(self, state: PolicyState) -> float | None:  # pragma: no cover - overridden
        return None

    def config(self) -> dict:
        return {"name": self.name, "B_min": self.B_min, "B_max": self.B_max, "p": self.p}

    # policies carry no learned state; the dicts exist so a checkpoint can record the config
    def state_dict(self) -> dict:
        return self.config()

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") != self.name:
            raise ConfigError(f"policy state is for {state.get('name')!r}, not {self.name!r}")


class FixedPolicy(BatchPolicy):
    """Keep the current B (still clipped and snapped)."""

    name = "fixed"


class SimilarityPolicy(BatchPolicy):
    """JABAS/SimiGrad: grow B by (1+alpha) when similarity < gamma, shrink by (1-alpha) when above."""

    name = "similarity"

    def __init__(self, gamma: float, alpha: float = 0.1, B_min: int = 1, B_max: int | None = None,
                 p: int = 100, snap: Snap | None = None) -> None:
        super().__init__(B_min, B_max, p, snap)
        if not _is_number(gamma) or not -1.0 < gamma < 1.0:
            raise ConfigError(f"gamma={gamma!r} is invalid; the similarity target must be in (-1, 1), e.g. 0.1")
        if not _is_number(alpha) or not 0.0 < alpha < 1.0:
            raise ConfigError(f"alpha={alpha!r} is invalid; the step must be in (0, 1), e.g. 0.1")
        self.gamma = float(gamma)
        self.alpha = float(alpha)

    def _target(self, state: PolicyState) -> float | None:
        sim = state.similarity
        if sim is None or not _is_number(sim):
            return None
        B = int(state.B)
        if sim < self.gamma:
            return max(B + 1, round(B * (1.0 + self.alpha)))
        if sim > self.gamma:
            return min(B - 1, round(B * (1.0 - self.alpha)))
        return None

    def config(self) -> dict:
        return {**super().config(), "gamma": self.gamma, "alpha": self.alpha}


class NoiseScalePolicy(BatchPolicy):
    """B = clip(k * B_noise). Unknown noise scale keeps B; an infinite one goes to B_max."""

    name = "noise-scale"

    def __init__(self, k: float = 1.0, B_min: int = 1, B_max: int | None = None, p: int = 100,
                 snap: Snap | None = None) -> None:
        super().__init__(B_min, B_max, p, snap)
        if not _is_number(k) or not k > 0 or math.isinf(k):
            raise ConfigError(f"k={k!r} is invalid; the noise-scale multiplier must be a finite number > 0")
        self.k = float(k)

    def _target(self, state: PolicyState) -> float | None:
        bn = state.b_noise
        if bn is None or not _is_number(bn):
            return None
        if math.isinf(bn):
            return math.inf if self.B_max is not None else None
        return self.k * bn

    def config(self) -> dict:
        return {**super().config(), "k": self.k}


_POLICY_KEYS = {
    "fixed": {"B_min", "B_max", "p", "snap"},
    "similarity": {"gamma", "alpha", "B_min", "B_max", "p", "snap"},
    "noise-scale": {"k", "B_min", "B_max", "p", "snap"},
}


def make_policy(name: str, **cfg: Any) -> BatchPolicy:
    """Build a policy by name: 'fixed', 'similarity' (needs gamma, B_max) or 'noise-scale' (needs B_max).

    Unknown names or keys and impossible values raise ConfigError with one line.
    """
    key = _POLICY_ALIASES.get(str(name).strip().lower())
    if key is None:
        raise ConfigError(f"unknown batch policy {name!r}; valid policies: {', '.join(POLICIES)}")
    bad = sorted(set(cfg) - _POLICY_KEYS[key])
    if bad:
        raise ConfigError(f"unknown option(s) {', '.join(bad)} for policy {key!r}; "
                          f"valid options: {', '.join(sorted(_POLICY_KEYS[key]))}")
    if key != "fixed" and cfg.get("B_max") is None:
        raise ConfigError(f"policy {key!r} needs B_max (the largest global batch size allowed)")
    if key == "similarity" and "gamma" not in cfg:
        raise ConfigError("policy 'similarity' needs gamma, the similarity target in (-1, 1), e.g. 0.1")
    cls = {"fixed": FixedPolicy, "similarity": SimilarityPolicy, "noise-scale": NoiseScalePolicy}[key]
    return cls(**cfg)


# ---------------------------------------------------------------- learning-rate rules


class LRRule:
    """Base lr rule: ``lr_scale(B, G2=None, S=None) -> float`` multiplies the scheduler's lr."""

    name = "base"

    def __init__(self, B_ref: int) -> None:
        if isinstance(B_ref, bool) or not _is_number(B_ref) or not B_ref >= 1 or math.isinf(B_ref):
            raise ConfigError(f"B_ref={B_ref!r} is invalid; the reference batch size must be a number >= 1")
        self.B_ref = float(B_ref)

    def _scale(self, B: float) -> float:
        if isinstance(B, bool) or not _is_number(B) or not B > 0 or math.isinf(B):
            raise ConfigError(f"B={B!r} is invalid; the global batch size must be a number > 0")
        return float(B) / self.B_ref

    def lr_scale(self, B: float, G2: float | None = None, S: float | None = None) -> float:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"name": self.name, "B_ref": self.B_ref}

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") != self.name:
            raise ConfigError(f"lr rule state is for {state.get('name')!r}, not {self.name!r}")
        self.B_ref = float(state["B_ref"])


class NoScaling(LRRule):
    name = "none"

    def lr_scale(self, B, G2=None, S=None) -> float:
        self._scale(B)
        return 1.0


class SqrtScaling(LRRule):
    """lr * sqrt(B / B_ref) (JABAS's rule)."""

    name = "sqrt"

    def lr_scale(self, B, G2=None, S=None) -> float:
        return math.sqrt(self._scale(B))


class LinearScaling(LRRule):
    """lr * B / B_ref (Goyal et al.)."""

    name = "linear"

    def lr_scale(self, B, G2=None, S=None) -> float:
        return self._scale(B)


class AdaScale(LRRule):
    """AdaScale gain (Johnson et al. 2020), as Pollux uses it.

    With scale s = B / B_ref, |G|^2 = G2 and per-sample gradient variance tr(Sigma) = S (the
    units of ``stats.noise_scale_terms``), the variance of a B_ref-sample gradient is
    var = S / B_ref and the gain is

        r = (var + G2) / (var / s + G2)

    which lies between 1 and s (between s and 1 when B < B_ref). This is the textbook
    r = (sigma^2 + mu^2) / (sigma^2/s + mu^2) with sigma^2 the B_ref-batch variance; with B_ref = 1
    it reads r = (S + G2) / (S/s + G2). Missing or unusable statistics give 1.0.

    ``advance`` also accumulates the scale-invariant progress sum(r) that AdaScale uses to stretch
    the schedule; a trainer may evaluate its scheduler at ``progress`` instead of the raw step.
    """

    name = "adascale"

    def __init__(self, B_ref: int) -> None:
        super().__init__(B_ref)
        self.progress = 0.0

    def lr_scale(self, B, G2=None, S=None) -> float:
        s = self._scale(B)
        if G2 is None or S is None or not _is_number(G2) or not _is_number(S):
            return 1.0
        if math.isinf(G2) or math.isinf(S):
            return 1.0
        var = max(0.0, float(S)) / self.B_ref
        g2 = max(0.0, float(G2))
        den = var / s + g2
        if den <= 0.0:
            return 1.0
        return (var + g2) / den

    def advance(self, B, G2=None, S=None) -> float:
        """One optimizer step at batch B: add the gain to ``progress`` and return it."""
        r = self.lr_scale(B, G2, S)
        self.progress += r
        return r

    def state_dict(self) -> dict:
        return {**super().state_dict(), "progress": self.progress}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.progress = float(state.get("progress", 0.0))


def make_lr_rule(name: str, B_ref: int) -> LRRule:
    """'sqrt' (default in JABAS), 'linear', 'adascale' or 'none'."""
    key = _LR_ALIASES.get(str(name).strip().lower())
    if key is None:
        raise ConfigError(f"unknown lr rule {name!r}; valid rules: {', '.join(LR_RULES)}")
    cls = {"sqrt": SqrtScaling, "linear": LinearScaling, "adascale": AdaScale, "none": NoScaling}[key]
    return cls(B_ref)
