"""The similarity policy (JABAS / SimiGrad, docs/formulas.md section 2): the cosine of the two half-batch mean
gradients below gamma grows B towards B(1 + alpha), above shrinks it towards B(1 - alpha); equal or unmeasured
stays. The cosines measured between decisions (``observe``) are averaged into the next decision's. The step is
taken on the unrounded product B_0 prod(1 +- alpha), so the snap's rounding does not accumulate
(core/adaptive/policy.py's docstring says the whole rule)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpc_jabas.core.adaptive.headroom import HeadroomCap
from hpc_jabas.core.adaptive.policies.base import SIMILARITY, BatchDecision, BatchPolicy, Observation, PolicyState, Wish
from hpc_jabas.core.config.defaults import DEFAULT_ALPHA, DEFAULT_GAMMA, DEFAULT_HEADROOM_C, DEFAULT_P
from hpc_jabas.core.config.validate import is_number
from hpc_jabas.core.planning.space import GROW, SHRINK, STAY, BatchSpace, snap_nearest
from hpc_jabas.errors import ConfigError

if TYPE_CHECKING:
    from hpc_jabas.core.config.sections import JobConfig


class SimilarityPolicy(BatchPolicy):
    """JABAS/SimiGrad: similarity < gamma -> grow towards B(1+alpha); > gamma -> shrink towards B(1-alpha)."""

    name = "similarity"
    reads = frozenset({SIMILARITY})
    options = frozenset({"gamma", "alpha", "B_min", "B_max", "p", "headroom_c"})

    def __init__(self, gamma: float = DEFAULT_GAMMA, alpha: float = DEFAULT_ALPHA, B_min: int = 1,
                 B_max: int | None = None, p: int = DEFAULT_P, headroom_c: float = DEFAULT_HEADROOM_C) -> None:
        super().__init__(B_min, B_max, p)
        if not is_number(headroom_c, nan=False) or not 0.0 < headroom_c < math.inf:
            raise ConfigError(f"headroom_c={headroom_c!r} is invalid; it must be a finite number > 0, e.g. 4")
        # a move up beyond headroom_c x the measured curvature headroom is refused (off until one is measured)
        self.cap = HeadroomCap(float(headroom_c))
        if not is_number(gamma, nan=False) or not -1.0 < gamma < 1.0:
            raise ConfigError(f"gamma={gamma!r} is invalid; the similarity target must be in (-1, 1), e.g. 0.1")
        if not is_number(alpha, nan=False) or not 0.0 < alpha < 1.0:
            raise ConfigError(f"alpha={alpha!r} is invalid; the step must be in (0, 1), e.g. 0.1")
        self.gamma = float(gamma)
        self.alpha = float(alpha)

        # the unrounded batch size B * prod(1 +- alpha) and the realised B it belongs to: the next target
        # is computed from it while B is still the one this policy realised, so the snap's rounding
        # errors do not accumulate (otherwise 58 <-> 64 is a fixed point of grow/shrink at alpha 0.1)
        self.exact: float | None = None
        self.last: int | None = None
        self.pending: list[float] = []     # cosines measured since the last decision (observe)
        self.last_mean: tuple[float, int] | None = None   # what the last decision read: (mean cosine, how many)

    def _base(self, B: int) -> float:
        return self.exact if self.exact is not None and self.last == B else float(B)

    @classmethod
    def job_options(cls, cfg: JobConfig) -> dict[str, Any]:
        return {"gamma": cfg.gamma, "alpha": cfg.alpha, "headroom_c": cfg.headroom_c}

    def observe(self, stats: Observation | float | None) -> bool:
        """One cosine measured between decisions (the controller's ``measure_every``; an ``Observation``, or the
        cosine itself): the next decision reads the mean of these and its own. A missing or non-finite value is left
        out. Whether it was taken."""
        if isinstance(stats, Observation):
            self.cap.observe(stats.headroom, stats.headroom_B)
        similarity = stats.similarity if isinstance(stats, Observation) else stats
        if similarity is None or not is_number(similarity, nan=False) or not math.isfinite(similarity):
            return False
        self.pending.append(float(similarity))
        return True

    def decision_stats(self, B: int, *, fresh: bool, between: bool) -> dict[str, Any]:
        """With measurements between decisions: the mean cosine the decision read, and of how many."""
        if self.last_mean is None or not between:
            return {}
        return {"similarity_mean": self.last_mean[0], "similarity_count": self.last_mean[1]}

    def wish(self, state: PolicyState, space: BatchSpace) -> Wish:
        sim, B = state.similarity, int(state.B)
        self.cap.observe(state.headroom, state.headroom_B or B)
        base = self._base(B)
        vals = list(self.pending)
        if sim is not None and is_number(sim, nan=False) and math.isfinite(sim):
            vals.append(float(sim))
        self.pending = []
        if not vals:
            self.last_mean = None
            return Wish(STAY, float(B), "similarity not measured; keep B")
        sim = math.fsum(vals) / len(vals)
        self.last_mean = (sim, len(vals))
        if len(vals) > 1:
            # the mean of the period's cosines: one cosine swings widely from one period to the next
            return self._wish(sim, B, base, f"mean similarity of {len(vals)} measurements={sim:.3f}")
        return self._wish(sim, B, base, f"similarity={sim:.3f}")

    def _wish(self, sim: float, B: int, base: float, what: str) -> Wish:
        if sim < self.gamma:
            lim = self.cap.limit(B)
            if lim is not None and base * (1.0 + self.alpha) > lim:
                if lim <= B:
                    return Wish(STAY, float(B), f"{what} < gamma={self.gamma:g}: grow refused, {self.cap.text(B)}; "
                                                "keep B")
                return Wish(GROW, lim, f"{what} < gamma={self.gamma:g}: grow, capped: {self.cap.text(B)}")
            return Wish(GROW, base * (1.0 + self.alpha), f"{what} < gamma={self.gamma:g}: grow")
        if sim > self.gamma:
            return Wish(SHRINK, base * (1.0 - self.alpha), f"{what} > gamma={self.gamma:g}: shrink")
        return Wish(STAY, float(B), f"{what} == gamma: keep B")

    def decide(self, state: PolicyState | Mapping[str, Any], space: BatchSpace | None = None) -> BatchDecision:
        """As the base class; then remembers the (clipped) unrounded target for the next decision."""
        st = PolicyState.coerce(state)
        sp = self._space(st, space)
        d = super().decide(st, sp)
        if d.moved and not self.cap.allows(int(st.B), d.B):
            # the snap went past the cap (no realisable B between B and it): refused, B stays
            d = BatchDecision(int(st.B), STAY, float(st.B), False,
                              f"{d.reason}; refused: B={d.B} is beyond {self.cap.text(int(st.B))}")
        if d.direction in (GROW, SHRINK) and d.moved and self._forced_past(sp, int(st.B), d):
            # the space had nothing on the asked side near the target, so B went a whole step past it: keep
            # the realised B, or the next opposite move (aimed at the lagging product) falls several steps
            self.exact = float(d.B)
        elif d.direction in (GROW, SHRINK):
            self.exact = d.target                 # already clipped to [B_min, B_max]
        elif d.B != int(st.B) or self.last != int(st.B):
            self.exact = float(d.B)               # pulled, or B set from outside: start afresh from it
        self.last = d.B
        return d

    @staticmethod
    def _forced_past(space: BatchSpace, B: int, d: BatchDecision) -> bool:
        """The realisable B nearest the target is not on the asked side of B: the move overshot the target
        by the space's grain, not by rounding (on multiples of 64, 64 * 1.1 is realised as 128)."""
        nearest = snap_nearest(space, d.target, ref=B)
        return nearest <= B if d.direction == GROW else nearest >= B

    def config(self) -> dict[str, Any]:
        # headroom_c named only where it is not the default (a default job's config and checkpoint are as before)
        return {**super().config(), "gamma": self.gamma, "alpha": self.alpha,
                **({} if self.cap.c == DEFAULT_HEADROOM_C else {"headroom_c": self.cap.c})}

    def state_dict(self) -> dict[str, Any]:
        return {**self.config(), "exact": self.exact, "last": self.last, "pending": list(self.pending),
                **({} if self.cap.h is None else {"headroom": self.cap.state_dict()})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pending = [float(x) for x in state.get("pending", [])]
        if "headroom" in state:
            self.cap.load_state_dict(state["headroom"])
        ex, last = state.get("exact"), state.get("last")
        self.exact = None if ex is None else float(ex)
        self.last = None if last is None else int(last)
