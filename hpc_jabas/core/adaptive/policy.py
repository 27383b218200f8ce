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

The policies are objects behind one protocol (``core/policies``: ``Policy``, its base class ``BatchPolicy``, one
module per policy), registered by name in ``core/adaptive/policies/registry.py``, where a program adds its own
(``register_policy``). This module re-exports them and keeps the rules around them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpc_jabas.core.adaptive.policies.base import BatchDecision as BatchDecision
from hpc_jabas.core.adaptive.policies.base import BatchPolicy as BatchPolicy
from hpc_jabas.core.adaptive.policies.base import FixedPolicy as FixedPolicy
from hpc_jabas.core.adaptive.policies.base import Observation as Observation
from hpc_jabas.core.adaptive.policies.base import Policy as Policy
from hpc_jabas.core.adaptive.policies.base import PolicyState as PolicyState
from hpc_jabas.core.adaptive.policies.base import Wish as Wish
from hpc_jabas.core.adaptive.policies.goodput import DEFAULT_GOODPUT_MAX_REACH as DEFAULT_GOODPUT_MAX_REACH
from hpc_jabas.core.adaptive.policies.goodput import DEFAULT_GOODPUT_MAX_STEP as DEFAULT_GOODPUT_MAX_STEP
from hpc_jabas.core.adaptive.policies.goodput import DEFAULT_GOODPUT_MIN_GAIN as DEFAULT_GOODPUT_MIN_GAIN
from hpc_jabas.core.adaptive.policies.goodput import DEFAULT_GOODPUT_WARMUP as DEFAULT_GOODPUT_WARMUP
from hpc_jabas.core.adaptive.policies.goodput import DEFAULT_GOODPUT_WINDOW as DEFAULT_GOODPUT_WINDOW
from hpc_jabas.core.adaptive.policies.goodput import GOODPUT_MEASUREMENTS_PER_PERIOD as GOODPUT_MEASUREMENTS_PER_PERIOD
from hpc_jabas.core.adaptive.policies.goodput import POLLUX_MEMORY_PER_B0 as POLLUX_MEMORY_PER_B0
from hpc_jabas.core.adaptive.policies.goodput import GoodputPolicy as GoodputPolicy
from hpc_jabas.core.adaptive.policies.goodput import default_noise_memory as default_noise_memory
from hpc_jabas.core.adaptive.policies.ramp import RampPolicy as RampPolicy
from hpc_jabas.core.adaptive.policies.registry import AUTO_LR_RULE as AUTO_LR_RULE
from hpc_jabas.core.adaptive.policies.registry import make_policy as make_policy
from hpc_jabas.core.adaptive.policies.registry import policy_class
from hpc_jabas.core.adaptive.policies.registry import register_policy as register_policy
from hpc_jabas.core.adaptive.policies.similarity import SimilarityPolicy as SimilarityPolicy
from hpc_jabas.core.adaptive.scaling import AdaScaleRule, LinearScaling, LRRule, NoScaling, SqrtScaling
from hpc_jabas.core.adaptive.stats import goodput as goodput
from hpc_jabas.core.adaptive.stats import statistical_efficiency as statistical_efficiency
from hpc_jabas.core.config.defaults import DECISIONS_PER_EPOCH
from hpc_jabas.core.config.defaults import DEFAULT_ALPHA as DEFAULT_ALPHA
from hpc_jabas.core.config.defaults import DEFAULT_GAMMA as DEFAULT_GAMMA
from hpc_jabas.core.config.defaults import DEFAULT_GOODPUT_KAPPA as DEFAULT_GOODPUT_KAPPA
from hpc_jabas.core.config.defaults import DEFAULT_P as DEFAULT_P
from hpc_jabas.core.config.defaults import DEFAULT_RAMP_AT as DEFAULT_RAMP_AT
from hpc_jabas.core.config.defaults import DEFAULT_RAMP_FACTOR as DEFAULT_RAMP_FACTOR
from hpc_jabas.core.config.defaults import LR_RULES as LR_RULES
from hpc_jabas.core.config.defaults import POLICIES as POLICIES
from hpc_jabas.core.config.defaults import WD_RULES as WD_RULES
from hpc_jabas.core.config.defaults import canonical_policy as canonical_policy
from hpc_jabas.core.config.validate import integer
from hpc_jabas.core.planning.space import STAY as STAY
from hpc_jabas.errors import ConfigError

_LR_ALIASES = {
    "sqrt": "sqrt", "square-root": "sqrt", "sqrtscaling": "sqrt",
    "linear": "linear", "linearscaling": "linear",
    "adascale": "adascale", "ada-scale": "adascale",
    "none": "none", "noscaling": "none", "constant": "none",
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
    if not policy_class(policy).adaptive or (batch_min is not None and batch_max is not None):
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
    decisions only), as the policy's class says (``BatchPolicy.default_measure_every``). Set by hand: as set for a
    policy that reads statistics (similarity, goodput); others measure nothing between decisions. Unset: goodput
    measures GOODPUT_MEASUREMENTS_PER_PERIOD times a period (p / 10, at least every iteration: Pollux measures at
    every step; a noise-only measurement costs a few scalars); similarity at its decisions only, as JABAS (an
    averaged measurement costs a gradient-sized allreduce)."""
    return policy_class(policy).default_measure_every(measure_every, p)


def decision_period(p: int | None, samples_per_epoch: int, batch: int) -> int:
    """The iterations between decisions: ``p`` when set; unset, a tenth of an epoch's iterations at the initial
    batch (DECISIONS_PER_EPOCH per epoch), at most JABAS's 100 (its p, for epochs of thousands of iterations) and
    at least 1. It depends on the data and the initial B only, never on the mix, so every mix decides alike."""
    if p is not None:
        return integer(p, "p", lo=1)
    n = integer(samples_per_epoch, "samples per epoch", lo=1)
    b = integer(batch, "batch", lo=1)
    return max(1, min(DEFAULT_P, round(math.ceil(n / b) / DECISIONS_PER_EPOCH)))


# ---------------------------------------------------------------- learning-rate rules (classes: scaling.py)


def resolve_lr_rule(name: str, policy: str) -> str:
    """The rule 'auto' stands for with this policy (AUTO_LR_RULE); other names as given."""
    if str(name).strip().lower() == "auto":
        return policy_class(policy).auto_lr_rule
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
