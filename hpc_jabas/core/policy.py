"""Adaptive global-batch-size policies and learning-rate rules. Pure: plain Python.

Every ``p`` iterations the rank-0 controller hands a policy a ``PolicyState`` (current B,
iteration, latest statistics) and the job's ``BatchSpace`` (planning/space.py: the B the planner
realises on this mix, with predicted iteration times) and gets a ``BatchDecision``:

- ``FixedPolicy`` ("fixed"): stay.
- ``SimilarityPolicy`` ("similarity"; JABAS / SimiGrad, docs/formulas.md,
  section 2): the cosine similarity of the two
  half-batch mean gradients below gamma -> grow towards B * (1 + alpha); above -> shrink towards
  B * (1 - alpha); equal or unmeasured -> stay. Defaults as in JABAS: gamma = 0.1, alpha = 0.1,
  p = 100. B here is the unrounded product B_0 * prod(1 +- alpha) while the current B is the one
  the policy last realised (else the current B), so 20 grow/shrink pairs end next to
  B_0 * ((1 + alpha)(1 - alpha))^20 on any batch space, not at a rounding fixed point. Where the space
  is coarser than the step (multiples of 64 at B = 64: the nearest realisable B to the target is not on
  the asked side), the move goes a whole step past the target and the policy keeps the realised B
  instead, so a shrink after such grows goes one step back, not to where the lagging product points.
- ``GoodputPolicy`` ("noise-scale"; Pollux's goodput on the gradient noise scale,
  docs/formulas.md section 3): the realisable
  B in [B_min, B_max] that maximises (B / t_iter(B)) * E(B), E(B) = (B_noise + B_0) / (B_noise + B),
  with t_iter from the perf model and planner for this mix; B_0 the initial batch (it scales E by a
  constant, so it never changes the choice). B_noise = mean(S) / mean(G2) over the last ``window``
  (20) fresh measurements. Re-evaluated every p iterations (default 100), after a warm-up of 3
  fresh measurements, at most 2x up or down per decision (with no realisable B in that trust
  region: one step to the nearest realisable B toward the argmax). An unresolved noise scale
  (mean G2 <= 0) grows B within the trust region: E = 1 for every B, as in Pollux.

- ``RampPolicy`` ("ramp"; a batch-size warm-up, the schedule practitioners run): B = B_0 *
  factor^k once the run has passed k of the fractions ``at`` (in samples of the configured epochs),
  realised as the nearest realisable B; defaults factor 2 at 25%, 50% and 75% of the run (config
  keys ``ramp_factor``, ``ramp_at``). Its lr rule "auto" is sqrt.

The policy's wish (a direction and a target, or a chosen B) becomes a realisable B' through
``planning.space.snap_toward``: grow gives B' > B unless B is the largest realisable B <= B_max,
shrink gives B' < B unless B is the smallest >= B_min, stay gives B' == B. The decision's
``reason`` says what the policy asked, and when B could not move, why.

Learning-rate rules return ``lr_scale``, a factor the trainer multiplies into the lr of the
user's own optimizer and scheduler for every step (lr = scheduler_lr * lr_scale). The scheduler
keeps stepping as the user set it up (per epoch, or per iteration), unaware of B; the factor is
recomputed at every batch-size decision from the new B:

- ``SqrtScaling`` ("sqrt", JABAS's rule): sqrt(B / B_ref);
- ``LinearScaling`` ("linear", Goyal et al.): B / B_ref;
- ``NoScaling`` ("none"): 1;
- ``AdaScaleRule`` ("adascale", Pollux's rule): the gain r = (S + G2) / (S / s + G2), s = B / B_ref,
  from the controller's smoothed noise-scale estimates, re-read at every decision; r runs from 1 (no
  noise) to s (noise-dominated), so it is at most the linear rule's factor. A scheduler stepped per
  iteration advances r steps per iteration (scale-invariant progress, the fraction carried by the
  trainer); one stepped per epoch steps once per pass over the data, as with every rule.
- "auto" (the default): sqrt with the similarity and ramp policies, linear with goodput (AUTO_LR_RULE).

Weight decay (``wd_rule``, default "none"): "linear" multiplies every param group's weight decay by
B / B_ref at every step ("Power Lines", NeurIPS 2025: the optimal AdamW weight decay scales
linearly with B at fixed model and data size); ``make_wd_rule``.

B_ref is the batch the user's lr was tuned for (``batch_ref``, default the initial batch).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from hpc_jabas.core.defaults import DECISIONS_PER_EPOCH, DEFAULT_NOISE_TREND
from hpc_jabas.core.defaults import DEFAULT_ALPHA as DEFAULT_ALPHA
from hpc_jabas.core.defaults import DEFAULT_GAMMA as DEFAULT_GAMMA
from hpc_jabas.core.defaults import DEFAULT_GOODPUT_KAPPA as DEFAULT_GOODPUT_KAPPA
from hpc_jabas.core.defaults import DEFAULT_P as DEFAULT_P
from hpc_jabas.core.defaults import DEFAULT_RAMP_AT as DEFAULT_RAMP_AT
from hpc_jabas.core.defaults import DEFAULT_RAMP_FACTOR as DEFAULT_RAMP_FACTOR
from hpc_jabas.core.defaults import LR_RULES as LR_RULES
from hpc_jabas.core.defaults import POLICIES as POLICIES
from hpc_jabas.core.defaults import WD_RULES as WD_RULES
from hpc_jabas.core.defaults import canonical_policy as canonical_policy
from hpc_jabas.core.planning.space import GROW, SET, SHRINK, STAY, BatchSpace, snap_nearest, snap_toward
from hpc_jabas.core.scaling import AdaScaleRule, LinearScaling, LRRule, NoScaling, SqrtScaling
from hpc_jabas.core.stats import NoiseMemory, NoiseWindow, goodput, statistical_efficiency
from hpc_jabas.core.validate import integer, is_number
from hpc_jabas.errors import ConfigError

#: what lr_rule = "auto" (the default) means for each policy: JABAS pairs its similarity rule with
#: sqrt scaling; Pollux pairs goodput with AdaScale, whose gain is ~B/B_ref while B << B_noise (the
#: regime goodput picks), so linear scaling is the closest rule we offer (bench/adaptive_tta.py: with
#: sqrt, goodput's large B never reached the target accuracy).
AUTO_LR_RULE = {"fixed": "sqrt", "similarity": "sqrt", "noise-scale": "linear", "ramp": "sqrt"}
_LR_ALIASES = {
    "sqrt": "sqrt", "square-root": "sqrt", "sqrtscaling": "sqrt",
    "linear": "linear", "linearscaling": "linear",
    "adascale": "adascale", "ada-scale": "adascale",
    "none": "none", "noscaling": "none", "constant": "none",
}

#: noise-scale measurements the goodput policy waits for before it moves B (its first decisions)
DEFAULT_GOODPUT_WARMUP = 3
#: the goodput policy moves B by at most this factor per decision (a trust region around the current B)
DEFAULT_GOODPUT_MAX_STEP = 2.0
#: the goodput policy averages the |G|^2 and tr(Sigma) estimates of its last this many measurements (with a
#: memory in samples unset: ``make_policy`` and the API; a job's default is the memory, ``default_noise_memory``)
DEFAULT_GOODPUT_WINDOW = 20
#: the trust region's widest factor: after decisions that each stop at the region's edge on the same side (the
#: goodput argmax lies further out), the next may move by max_step^k, up to this (Pollux has no region at all)
DEFAULT_GOODPUT_MAX_REACH = 16.0
#: a job's goodput policy measures the noise scale this many times per decision period (measure_every = p / this,
#: at least every iteration): noise-only measurements cost a few scalars, not a gradient-sized allreduce
GOODPUT_MEASUREMENTS_PER_PERIOD = 10
#: Pollux's estimate decays by 0.999^(B / B0) per step: a memory of B0 / -ln(0.999), about 1,000 x B0 samples
POLLUX_MEMORY_PER_B0 = 1.0 / -math.log(0.999)
#: the goodput policy moves B only for a predicted goodput gain of at least this fraction (Pollux's 5%: a
#: smaller predicted gain is within the estimate's noise, and each move also moves the lr)
DEFAULT_GOODPUT_MIN_GAIN = 0.05


@dataclass(frozen=True)
class PolicyState:
    """What a policy sees: the current global batch B, the iteration, the latest statistics.

    ``similarity``: cosine similarity of the two half-batch mean gradients (None if not measured).
    ``b_noise``: the smoothed gradient noise scale (None if unknown, inf if the signal is lost).
    ``g2``, ``s``: this iteration's fresh unbiased estimates of |G|^2 and tr(Sigma)
    (stats.noise_scale_terms; None: no fresh measurement). The goodput policy averages them itself.
    ``progress``: the fraction of the run done, in samples (what the ramp policy reads; None: unknown).
    ``samples``: the samples trained since the previous fresh measurement, what a fresh (g2, s) stands for in
    an estimate with a memory in samples (``noise_memory``; None: one iteration's, B).
    """

    B: int
    iteration: int = 0
    similarity: float | None = None
    b_noise: float | None = None
    g2: float | None = None
    s: float | None = None
    progress: float | None = None
    samples: float | None = None

    @classmethod
    def coerce(cls, state: PolicyState | Mapping[str, Any]) -> PolicyState:
        if isinstance(state, PolicyState):
            return state
        if isinstance(state, Mapping):
            extra = set(state) - {"B", "iteration", "similarity", "b_noise", "g2", "s", "progress", "samples"}
            if extra or "B" not in state:
                raise ConfigError(f"policy state {dict(state)!r} is invalid; give keys B (required), "
                                  "iteration, similarity, b_noise, g2, s, progress, samples")
            return cls(**state)
        raise ConfigError(f"policy state {state!r} is invalid; give a PolicyState or a dict with key B")


@dataclass(frozen=True)
class Wish:
    """What a policy asks before snapping: a direction (grow, shrink, stay, or set = this B) and a target."""

    direction: str
    target: float
    reason: str


@dataclass(frozen=True)
class BatchDecision:
    """The realised decision: new B, what was asked (direction, target), whether B moved, why."""

    B: int
    direction: str
    target: float
    moved: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"B": self.B, "direction": self.direction, "target": self.target, "moved": self.moved,
                "reason": self.reason}


class BatchPolicy:
    """Base: bounds [B_min, B_max] and the decision period p. Subclasses implement ``wish``."""

    name = "base"

    def __init__(self, B_min: int = 1, B_max: int | None = None, p: int = DEFAULT_P) -> None:
        self.B_min = integer(B_min, "B_min", lo=1)
        self.B_max = None if B_max is None else integer(B_max, "B_max", lo=1)
        if self.B_max is not None and self.B_min > self.B_max:
            raise ConfigError(f"B_min={B_min} is larger than B_max={B_max}; need 1 <= B_min <= B_max")
        self.p = integer(p, "p", lo=1)

    def wish(self, state: PolicyState, space: BatchSpace) -> Wish:
        return Wish(STAY, float(state.B), "keep B")

    def _space(self, state: PolicyState, space: BatchSpace | None) -> BatchSpace:
        hi = self.B_max if self.B_max is not None else max(self.B_min, int(state.B))
        if space is None:
            return BatchSpace.integers(self.B_min, hi)
        if (space.B_min, space.B_max) != (self.B_min, hi):
            raise ValueError(f"batch space range [{space.B_min}, {space.B_max}] differs from the policy's "
                             f"[{self.B_min}, {hi}]")
        return space

    def decide(self, state: PolicyState | Mapping[str, Any], space: BatchSpace | None = None) -> BatchDecision:
        """The policy's wish, realised with ``snap_toward`` on ``space`` (default: every integer in range)."""
        st = PolicyState.coerce(state)
        integer(st.B, "B", lo=1)
        sp = self._space(st, space)
        w = self.wish(st, sp)
        tgt = min(max(w.target, float(sp.B_min)), float(sp.B_max))
        s = snap_toward(sp, int(st.B), w.direction, tgt)
        reason = w.reason + (f"; {s.note}" if s.note else "")
        if w.direction in (GROW, SHRINK) and s.moved:
            reason += f"; {w.direction} {st.B} -> {s.B}"
        return BatchDecision(s.B, w.direction, tgt, s.moved, reason)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "B_min": self.B_min, "B_max": self.B_max, "p": self.p}

    # policies carry no learned state; the dicts exist so a checkpoint can record the config
    def state_dict(self) -> dict[str, Any]:
        return self.config()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ConfigError(f"policy state is for {state.get('name')!r}, not {self.name!r}")


class FixedPolicy(BatchPolicy):
    """Keep the current B."""

    name = "fixed"


class SimilarityPolicy(BatchPolicy):
    """JABAS/SimiGrad: similarity < gamma -> grow towards B(1+alpha); > gamma -> shrink towards B(1-alpha)."""

    name = "similarity"

    def __init__(self, gamma: float = DEFAULT_GAMMA, alpha: float = DEFAULT_ALPHA, B_min: int = 1,
                 B_max: int | None = None, p: int = DEFAULT_P) -> None:
        super().__init__(B_min, B_max, p)
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

    def observe(self, similarity: float | None) -> bool:
        """One cosine measured between decisions (the controller's ``measure_every``): the next decision reads
        the mean of these and its own. A missing or non-finite value is left out. Whether it was taken."""
        if similarity is None or not is_number(similarity, nan=False) or not math.isfinite(similarity):
            return False
        self.pending.append(float(similarity))
        return True

    def wish(self, state: PolicyState, space: BatchSpace) -> Wish:
        sim, B = state.similarity, int(state.B)
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
            return Wish(GROW, base * (1.0 + self.alpha), f"{what} < gamma={self.gamma:g}: grow")
        if sim > self.gamma:
            return Wish(SHRINK, base * (1.0 - self.alpha), f"{what} > gamma={self.gamma:g}: shrink")
        return Wish(STAY, float(B), f"{what} == gamma: keep B")

    def decide(self, state: PolicyState | Mapping[str, Any], space: BatchSpace | None = None) -> BatchDecision:
        """As the base class; then remembers the (clipped) unrounded target for the next decision."""
        st = PolicyState.coerce(state)
        sp = self._space(st, space)
        d = super().decide(st, sp)
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
        return {**super().config(), "gamma": self.gamma, "alpha": self.alpha}

    def state_dict(self) -> dict[str, Any]:
        return {**self.config(), "exact": self.exact, "last": self.last, "pending": list(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pending = [float(x) for x in state.get("pending", [])]
        ex, last = state.get("exact"), state.get("last")
        self.exact = None if ex is None else float(ex)
        self.last = None if last is None else int(last)


class GoodputPolicy(BatchPolicy):
    """Pollux's goodput on our planner: B = argmax over realisable B of (B / t_iter(B)) * E(B).

    The noise scale: each fresh measurement brings the unbiased estimates (G2, S) of |G|^2 and
    tr(Sigma) (``PolicyState.g2`` / ``s``, stats.noise_scale_terms); the policy averages each over
    its last ``window`` measurements and divides the averages (``stats.NoiseWindow``, McCandlish et
    al.); with ``noise_memory`` (a job's default: ``default_noise_memory``, set at attach through
    :meth:`use_memory`) it averages them with a memory of that many training samples instead
    (``stats.NoiseMemory``, Pollux's estimate). Measurements between decisions come in through
    :meth:`observe` (the controller's ``measure_every``). A caller without raw estimates may pass a smoothed
    ``b_noise`` instead (used only while the estimate is empty).

    As Pollux, B moves only for a predicted goodput gain of at least ``min_gain`` (5%) over the current B.
    Guards beyond Pollux: no move before ``warmup`` fresh measurements (a decision without a new
    measurement, e.g. after a skipped fp16 step, does not count), and at most ``max_step`` x per
    decision (the argmax within [B / max_step, B * max_step]; when no realisable B lies inside,
    the nearest realisable B on the side of the global argmax). An unresolved noise scale (the
    averaged |G|^2 <= 0, B_noise = inf) is read as Pollux reads it: noise dominates the gradient,
    E(B) = 1, so B grows to the fastest B above it within the trust region."""

    name = "noise-scale"

    def __init__(self, B0: int | None = None, B_min: int = 1, B_max: int | None = None, p: int = DEFAULT_P,
                 warmup: int = DEFAULT_GOODPUT_WARMUP, max_step: float = DEFAULT_GOODPUT_MAX_STEP,
                 window: int = DEFAULT_GOODPUT_WINDOW, min_gain: float = DEFAULT_GOODPUT_MIN_GAIN,
                 noise_memory: float | None = None, max_reach: float = DEFAULT_GOODPUT_MAX_REACH,
                 kappa: float = DEFAULT_GOODPUT_KAPPA, noise_trend: bool = DEFAULT_NOISE_TREND) -> None:
        super().__init__(B_min, B_max, p)
        if not isinstance(noise_trend, bool):
            raise ConfigError(f"noise_trend={noise_trend!r} is invalid; it must be true or false")
        self.noise_trend, self._measured = noise_trend, cast("float | None", None)   # the last measured B_noise
        if not is_number(kappa, nan=False) or not 0.0 < kappa < math.inf:
            raise ConfigError(f"kappa={kappa!r} is invalid; the factor on the measured noise scale must be a "
                              "finite number > 0, e.g. 1 (Pollux's pricing) or 4")
        self.kappa = float(kappa)
        if not is_number(min_gain, nan=False) or not 0.0 <= min_gain < 1.0:
            raise ConfigError(f"min_gain={min_gain!r} is invalid; the smallest predicted goodput gain that moves "
                              "B must be in [0, 1), e.g. 0.05")
        self.min_gain = float(min_gain)
        self.B0 = self.B_min if B0 is None else integer(B0, "B0", lo=1)
        self.warmup = integer(warmup, "warmup", lo=0)
        if not is_number(max_step, nan=False) or not max_step > 1.0:
            raise ConfigError(f"max_step={max_step!r} is invalid; the largest factor per decision must be > 1, "
                              "e.g. 2 (math.inf: no limit)")
        self.max_step = float(max_step)
        self.window = integer(window, "window", lo=1)
        self.noise_memory = None if noise_memory is None else float(noise_memory)
        self.noise: NoiseWindow | NoiseMemory = NoiseWindow(self.window) if noise_memory is None \
            else NoiseMemory(noise_memory)
        self.seen = 0
        if not is_number(max_reach, nan=False) or not max_reach > 1.0:
            raise ConfigError(f"max_reach={max_reach!r} is invalid; the trust region's widest factor must be > 1, "
                              "e.g. 16 (at most max_step: the region never widens)")
        self.max_reach = max(float(max_reach), self.max_step)
        # the trust region's factor for the next decision, and the side its last decision stopped at the edge of
        # (+1 up, -1 down, 0: the argmax was inside): two edge stops in a row on one side widen it (x max_step)
        self.reach = self.max_step
        self.edge = 0

    def observe(self, g2: float | None, s: float | None, samples: float | None = None) -> bool:
        """One fresh estimate (G2, S) into the noise-scale estimate, between decisions or at one; ``samples``:
        the samples trained since the previous fresh one (None: counted as one). A missing or non-finite
        estimate is left out. Whether it was taken."""
        if g2 is None or s is None or not (is_number(g2, nan=False) and is_number(s, nan=False)) \
                or not (math.isfinite(g2) and math.isfinite(s)):
            return False
        n = samples if is_number(samples, nan=False) and samples is not None and samples > 0 else 1.0
        self.noise.add(float(g2), float(s), float(n))
        self.seen += 1
        return True

    def _observe(self, state: PolicyState) -> float | None:
        """Take this state's fresh measurement, if any; the noise scale to decide on (None: none)."""
        g2, s = state.g2, state.s
        if g2 is not None or s is not None:
            self.observe(g2, s, state.samples if state.samples is not None else state.B)
        elif state.b_noise is not None and is_number(state.b_noise, nan=False) and state.b_noise >= 0 \
                and not self.noise.count:
            self.seen += 1                         # a caller's smoothed estimate: one measurement per call
            return float(state.b_noise)
        return self.noise.b_noise

    def priced(self, b_noise: float | None, B: float | None = None) -> float | None:
        """The noise scale B is priced with: kappa x the measured one (None stays None), with ``noise_trend``
        carried p B / 2 samples ahead, halfway to the next decision (``NoiseMemory.ahead``)."""
        if b_noise is not None and self.noise_trend and B is not None and isinstance(self.noise, NoiseMemory):
            b_noise = self.noise.ahead(self.p * float(B) / 2.0) or b_noise
        return None if b_noise is None else self.kappa * b_noise

    def _bn_text(self, bn: float) -> str:
        m, k = self._measured, "" if self.kappa == 1.0 else f"kappa={self.kappa:g} x "
        ahead = self.noise_trend and m is not None and bn != self.kappa * m
        return f"B_noise={bn:.4g}" + (f" (trend: {m:.4g} measured, {k}priced ahead)" if ahead else
                                       f" ({k}measured)" if k else "")

    def wish(self, state: PolicyState, space: BatchSpace) -> Wish:
        self._measured = self._observe(state)
        bn = self.priced(self._measured, state.B)
        if bn is None:
            return Wish(STAY, float(state.B), "no noise scale yet; keep B")
        if self.seen <= self.warmup:
            # the first estimates of |G|^2 are noisy (often <= 0): wait for a few before moving B
            return Wish(STAY, float(state.B), f"noise scale warming up ({self.seen} of {self.warmup} "
                                              f"measurements, B_noise={bn:.4g}); keep B")
        rows: list[tuple[int, float]] = []
        for B, t in space.table():
            if t is None:
                raise ValueError("the goodput policy needs a batch space with iteration times (a perf model)")
            rows.append((B, t))
        if not rows:
            return Wish(STAY, float(state.B), "no realisable batch in range; keep B")
        cur = int(state.B)
        unresolved = math.isinf(bn)
        if unresolved:
            # |G|^2 averaged <= 0: the noise swamps the signal at this B, so every B is statistically
            # as efficient (E = 1) and the argmax is the fastest B; only growing can resolve it
            rows = [r for r in rows if r[0] > cur]
            if not rows:
                return Wish(STAY, float(cur), f"noise scale unresolved (|G|^2 estimate <= 0 over "
                                              f"{self.noise.count} measurements); B={cur} is already the largest")
        # a trust region: at most reach x (or / reach) per decision, so one noisy estimate cannot move B (and
        # the lr that follows it) across the whole range at once; reach = max_step, wider after edge stops
        # (wider only toward the side where the last decisions found the argmax beyond the edge)
        reach = self.reach
        lo = cur / (reach if self.edge < 0 else self.max_step)
        hi = cur * (reach if self.edge > 0 else self.max_step)
        key = lambda r: (-goodput(r[0], r[1], bn, self.B0), abs(r[0] - cur), r[0])  # noqa: E731
        near = [r for r in rows if lo <= r[0] <= hi]
        Bg = min(rows, key=key)[0]
        # an unresolved estimate (E = 1 everywhere) is no confident argmax: it never widens the region
        self._next_reach(0 if unresolved else 1 if Bg > hi else -1 if Bg < lo else 0)
        how = "goodput argmax" if reach == self.max_step else f"goodput argmax within x{reach:g}"
        if not near:
            # nothing realisable inside the trust region: one step to the nearest realisable B on the
            # side of the global argmax (never a jump across the range, never silently unbounded)
            side = [r for r in rows if (r[0] > cur if Bg > cur else r[0] < cur)]
            if Bg == cur or not side:
                return Wish(STAY, float(cur), f"{self._bn_text(bn)}: goodput argmax is B={cur}; keep B")
            near = [min(side, key=lambda r: abs(r[0] - cur))]
            how = f"one step toward the goodput argmax B={Bg} (none realisable in [{lo:.4g}, {hi:.4g}])"
        Bs, ts = min(near, key=key)
        E = statistical_efficiency(Bs, bn, self.B0)
        now = dict(rows).get(cur) if not unresolved else None
        if now is not None and Bs != cur:
            gain = goodput(Bs, ts, bn, self.B0) / goodput(cur, now, bn, self.B0) - 1.0
            if gain < self.min_gain:
                return Wish(STAY, float(cur), f"{self._bn_text(bn)}: {how} B={Bs} predicts {100 * gain:.1f}% more "
                                              f"goodput, under the {100 * self.min_gain:g}% a move needs; keep B")
        pre = (f"noise scale unresolved (|G|^2 estimate <= 0 over {self.noise.count} measurements): grow; "
               if unresolved else f"{self._bn_text(bn)}, ")
        return Wish(GROW if unresolved else SET, float(Bs),
                    f"{pre}{how} B={Bs} ({Bs / ts:.4g} samples/s x E={E:.3f})")

    def use_memory(self, memory: float | None) -> None:
        """The estimate's memory in training samples (None: the last ``window`` measurements), set once the job
        knows its epoch (the controller's attach, the simulator's start); a change restarts the estimate."""
        m = None if memory is None else float(memory)
        if m == self.noise_memory:
            return
        self.noise = NoiseWindow(self.window) if m is None else NoiseMemory(m)
        self.noise_memory = m
        self.seen = 0

    def _next_reach(self, edge: int) -> None:
        """After a decision whose goodput argmax lay beyond the trust region's edge on side ``edge`` (0: inside):
        the same side as the decision before widens the next region on that side by max_step (up to max_reach): two
        estimates in a row put the argmax out there, so B need not crawl to it one factor of 2 a period; a
        turn, or an argmax inside, resets it to max_step."""
        self.reach = min(self.reach * self.max_step, self.max_reach) if edge and edge == self.edge else self.max_step
        self.edge = edge

    def config(self) -> dict[str, Any]:
        return {**super().config(), "B0": self.B0, "warmup": self.warmup, "max_step": self.max_step,
                "max_reach": self.max_reach, "window": self.window, "min_gain": self.min_gain, "kappa": self.kappa,
                "noise_trend": self.noise_trend, **({} if self.noise_memory is None else
                                                    {"noise_memory": self.noise_memory})}

    def state_dict(self) -> dict[str, Any]:
        return {**self.config(), "seen": self.seen, "noise": self.noise.state_dict(), "reach": self.reach,
                "edge": self.edge}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.seen = int(state.get("seen", self.warmup))
        self.reach = min(max(float(state.get("reach", self.max_step)), self.max_step), self.max_reach)
        self.edge = int(state.get("edge", 0))
        if state.get("noise_memory") != self.noise_memory:
            # the estimate's kind changed since the checkpoint (window <-> memory in samples): it restarts
            self.noise = NoiseWindow(self.window) if self.noise_memory is None else NoiseMemory(self.noise_memory)
            self.seen = 0
        elif "noise" in state:
            self.noise.load_state_dict(state["noise"])


class RampPolicy(BatchPolicy):
    """A batch-size warm-up schedule: B = B0 * factor^k after the k-th of the fractions ``at`` of the
    run (in samples), clipped to [B_min, B_max] and realised as the nearest realisable B.

    What practitioners run as the baseline to adaptive batching (DeepSeek-V3 grows its batch over
    the first tokens; Merrill et al. 2025 warm the batch up for OLMo). The stage depends only on the
    run's progress and B0, never on statistics or the mix, so every mix decides the same B."""

    name = "ramp"

    def __init__(self, B0: int | None = None, at: Any = DEFAULT_RAMP_AT, factor: float = DEFAULT_RAMP_FACTOR,
                 B_min: int = 1, B_max: int | None = None, p: int = DEFAULT_P) -> None:
        super().__init__(B_min, B_max, p)
        self.B0 = self.B_min if B0 is None else integer(B0, "B0", lo=1)
        if isinstance(at, (str, bytes)) or not hasattr(at, "__iter__"):
            raise ConfigError(f"ramp at={at!r} is invalid; give fractions of the run, e.g. [0.25, 0.5, 0.75]")
        fr = list(at)
        if not all(is_number(f) and 0.0 < f < 1.0 for f in fr) or fr != sorted(fr) or len(set(fr)) != len(fr):
            raise ConfigError(f"ramp at={fr!r} is invalid; give increasing fractions of the run in (0, 1), "
                              "e.g. [0.25, 0.5, 0.75]")
        if not is_number(factor, nan=False) or not factor > 0 or factor == 1.0 or math.isinf(factor):
            raise ConfigError(f"ramp factor={factor!r} is invalid; B is multiplied by it at each stage, e.g. 2")
        self.at = tuple(float(f) for f in fr)
        self.factor = float(factor)

    def stage(self, progress: float) -> int:
        """How many of the fractions ``at`` the run has passed."""
        return sum(1 for f in self.at if progress >= f)

    def wish(self, state: PolicyState, space: BatchSpace) -> Wish:
        pr = state.progress
        if pr is None or not is_number(pr, nan=False):
            return Wish(STAY, float(state.B), "run progress unknown; keep B")
        k = self.stage(float(pr))
        tgt = self.B0 * self.factor ** k
        return Wish(SET, float(tgt), f"ramp: progress {float(pr):.3f}, stage {k} of {len(self.at)}: "
                                     f"B0={self.B0} x {self.factor:g}^{k} = {tgt:g}")

    def config(self) -> dict[str, Any]:
        return {**super().config(), "B0": self.B0, "at": list(self.at), "factor": self.factor}


_POLICY_KEYS = {
    "fixed": {"B_min", "B_max", "p"},
    "similarity": {"gamma", "alpha", "B_min", "B_max", "p"},
    "noise-scale": {"B0", "B_min", "B_max", "p", "warmup", "max_step", "max_reach", "window", "noise_memory",
                    "kappa", "noise_trend"},
    "ramp": {"B0", "at", "factor", "B_min", "B_max", "p"},
}


@dataclass(frozen=True)
class BatchRange:
    """The B range an adaptive policy moves in, and how it was chosen (``default_batch_range``)."""
    lo: int
    hi: int
    rule: str        # one line: what was set by hand and what the defaults rule gave

    def to_dict(self) -> dict[str, Any]:
        return {"batch_min": self.lo, "batch_max": self.hi, "rule": self.rule}


def default_batch_range(policy: str, batch: int, batch_min: int | None, batch_max: int | None, *,
                        samples_per_epoch: int, min_micro_batch: int) -> BatchRange | None:
    """The range an adaptive policy gets where ``batch_min``/``batch_max`` are unset (None: the policy is
    ``fixed``, or both bounds were given).

    The rule: ``batch_min`` = min(batch, min_micro_batch), ``batch_max`` = max(batch, samples per epoch). Within
    it the job's batch space (planning/space.py) keeps the B the mix runs exactly: from one smallest micro-batch
    per rank up, a B past what one micro-batch per rank holds as accumulated micro-batches. The range depends on
    the data and the model (min_micro_batch) only, never on the mix, so every job of a chain decides in the same
    range, as with ``decision_period``. A bound set by hand is kept."""
    if canonical_policy(policy) == "fixed" or (batch_min is not None and batch_max is not None):
        return None
    small = integer(min_micro_batch, "min_micro_batch", lo=1)
    n = integer(samples_per_epoch, "samples per epoch", lo=1)
    lo = batch_min if batch_min is not None else min(batch, small)
    hi = batch_max if batch_max is not None else max(batch, n)
    parts = [f"batch_min={lo} (set)" if batch_min is not None else
             f"batch_min={lo} = min(batch {batch}, the smallest micro-batch {small}); the mix runs B from one such "
             "micro-batch per rank up",
             f"batch_max={hi} (set)" if batch_max is not None else
             f"batch_max={hi} = max(batch {batch}, one epoch {n})"]
    return BatchRange(lo, hi, f"policy {canonical_policy(policy)!r} moves B in [{lo}, {hi}]: " + "; ".join(parts)
                      + " (set batch_min/batch_max to choose)")


def default_measure_every(policy: str, measure_every: int | None, p: int) -> int | None:
    """The iterations between a job's statistic measurements for ``policy`` at decision period ``p`` (None: at
    decisions only). Set by hand: as set (similarity and goodput; other policies measure nothing between
    decisions). Unset: goodput measures GOODPUT_MEASUREMENTS_PER_PERIOD times a period (p / 10, at least every
    iteration: Pollux measures at every step; a noise-only measurement costs a few scalars); similarity at its
    decisions only, as JABAS (an averaged measurement costs a gradient-sized allreduce)."""
    key = canonical_policy(policy)
    if key not in ("noise-scale", "similarity"):
        return None
    if measure_every is not None:
        return integer(measure_every, "measure_every", lo=1)
    if key == "noise-scale":
        return max(1, round(integer(p, "p", lo=1) / GOODPUT_MEASUREMENTS_PER_PERIOD))
    return None


def default_noise_memory(noise_memory: float | None, batch: int, samples_per_epoch: int) -> float:
    """The goodput estimate's memory in training samples: as set, else Pollux's (about 1,000 x the initial batch)
    but at most one epoch, so the estimate follows a noise scale that grows as the loss falls within a run of a
    few epochs (Pollux's runs are hundreds of epochs long)."""
    if noise_memory is not None:
        return float(noise_memory)
    b = integer(batch, "batch", lo=1)
    n = integer(samples_per_epoch, "samples per epoch", lo=1)
    return float(min(POLLUX_MEMORY_PER_B0 * b, n))


def decision_period(p: int | None, samples_per_epoch: int, batch: int) -> int:
    """The iterations between decisions: ``p`` when set; unset, a tenth of an epoch's iterations at the initial
    batch (DECISIONS_PER_EPOCH per epoch), at most JABAS's 100 (its p, for epochs of thousands of iterations) and
    at least 1. It depends on the data and the initial B only, never on the mix, so every mix decides alike."""
    if p is not None:
        return integer(p, "p", lo=1)
    n = integer(samples_per_epoch, "samples per epoch", lo=1)
    b = integer(batch, "batch", lo=1)
    return max(1, min(DEFAULT_P, round(math.ceil(n / b) / DECISIONS_PER_EPOCH)))


def make_policy(name: str, **cfg: Any) -> BatchPolicy:
    """Build a policy by name or alias: 'fixed', 'similarity', 'noise-scale' (the goodput policy) or
    'ramp'.

    'similarity', 'noise-scale' and 'ramp' need B_max. Unknown names or keys and impossible values raise
    ConfigError with one line.
    """
    key = canonical_policy(name)
    bad = sorted(set(cfg) - _POLICY_KEYS[key])
    if bad:
        raise ConfigError(f"unknown option(s) {', '.join(bad)} for policy {key!r}; "
                          f"valid options: {', '.join(sorted(_POLICY_KEYS[key]))}")
    if key != "fixed" and cfg.get("B_max") is None:
        raise ConfigError(f"policy {key!r} needs B_max (the largest global batch size allowed)")
    cls: type[BatchPolicy] = {"fixed": FixedPolicy, "similarity": SimilarityPolicy,
                              "noise-scale": GoodputPolicy, "ramp": RampPolicy}[key]
    return cls(**cfg)


# ---------------------------------------------------------------- learning-rate rules (classes: scaling.py)


def resolve_lr_rule(name: str, policy: str) -> str:
    """The rule 'auto' stands for with this policy (AUTO_LR_RULE); other names as given."""
    if str(name).strip().lower() == "auto":
        return AUTO_LR_RULE[canonical_policy(policy)]
    return name


def lr_rule_name(name: str, policy: str = "similarity") -> str:
    """The canonical name of the lr rule a job runs: 'auto' resolved for its policy, aliases read."""
    key = _LR_ALIASES.get(str(resolve_lr_rule(name, policy)).strip().lower())
    if key is None:
        raise ConfigError(f"unknown lr rule {name!r}; valid rules: {', '.join(LR_RULES)}")
    return key


def make_lr_rule(name: str, B_ref: int, policy: str = "similarity") -> LRRule:
    """'auto' (the policy's own rule: AUTO_LR_RULE), 'sqrt' (JABAS), 'linear' (Goyal), 'adascale' (Pollux's
    AdaScale gain from the noise-scale estimates) or 'none'."""
    key = lr_rule_name(name, policy)
    cls: type[LRRule] = {"sqrt": SqrtScaling, "linear": LinearScaling, "adascale": AdaScaleRule,
                         "none": NoScaling}[key]
    return cls(B_ref)


# ---------------------------------------------------------------- weight-decay rule


def make_wd_rule(name: str, B_ref: int) -> LRRule:
    """The weight-decay factor for a batch B: 'none' (the default: the optimizer's weight decay as is)
    or 'linear' (weight decay * B / B_ref; "Power Lines", NeurIPS 2025: at fixed model and data size
    the optimal AdamW weight decay scales linearly with B). Same interface as an lr rule."""
    key = str(name).strip().lower()
    if key not in WD_RULES:
        raise ConfigError(f"unknown weight-decay rule {name!r}; valid rules: {', '.join(WD_RULES)}")
    return LinearScaling(B_ref) if key == "linear" else NoScaling(B_ref)
