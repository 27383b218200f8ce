"""The configuration's choices and default values: the one definition of each.

:mod:`hpc_jabas.core.config.sections` declares the job keys with these; the modules that implement the
keys (policy, sampler, perfmodel, autoscale) import them from here, so the config depends on no
implementation module. Only names and numbers live here, and the alias table of the batch policies.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

from hpc_jabas.errors import ConfigError

# ---- [train] ----------------------------------------------------------------------------------
#: epoch tail: the last iteration takes the r < B samples left (shrink) or they are dropped
TAILS = ("shrink", "drop")
AMP_MODES = ("off", "bf16", "fp16")
#: communication backends (runtime/comm/seam.py): auto = Horovod when it imports, else torch.distributed
BACKENDS = ("horovod", "torch", "auto")

# ---- [planning], [balancing] ------------------------------------------------------------------
PLANNERS = ("optimal", "lbbsp", "fixed")
BALANCE_MODES = ("off", "reactive", "predictive")

# ---- [emulation] ------------------------------------------------------------------------------
#: the emulated GPU times, t(b) = (EMU_BASE_S + EMU_PER_SAMPLE_S * b) / speed: defaults of the job keys
#: emulate_base_s, emulate_per_sample_s, of ``PerfModel.emulated`` and of ``hpc-jabas profile --emulate``
EMU_BASE_S = 0.002            # fixed cost of one micro-batch on a V100 (kernel launches, ...)
EMU_PER_SAMPLE_S = 0.0002     # seconds per sample on a V100

# ---- [adaptive] -------------------------------------------------------------------------------
#: name or alias -> policy name: the built-in policies; core/adaptive/policies/registry.py's register_policy adds to it
POLICY_ALIASES = {
    "fixed": "fixed", "none": "fixed", "constant": "fixed",
    "similarity": "similarity", "simigrad": "similarity", "jabas": "similarity",
    "noise-scale": "noise-scale", "noise_scale": "noise-scale", "noisescale": "noise-scale",
    "gns": "noise-scale", "pollux": "noise-scale", "goodput": "noise-scale",
    "ramp": "ramp", "batch-ramp": "ramp", "batch-warmup": "ramp",
}


class PolicyNames(Sequence[str]):
    """The policy names, live: POLICY_ALIASES's values in order (the built-in ones, then any registered), so the
    config's choices follow the policy registry. Equal to the tuple of its names."""

    def __init__(self, table: Mapping[str, str]) -> None:
        self._table = table

    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self._table.values()))

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self.names()[i]

    def __len__(self) -> int:
        return len(self.names())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __eq__(self, other: object) -> bool:
        return self.names() == (tuple(other) if isinstance(other, (tuple, list, PolicyNames)) else other)

    def __hash__(self) -> int:
        return hash(self.names())

    def __repr__(self) -> str:
        return repr(self.names())


POLICIES = PolicyNames(POLICY_ALIASES)
DEFAULT_P = 100         # JABAS: iterations between decisions; also the cap of the epoch-relative default
#: p unset: this many decisions per epoch at the initial B (at most DEFAULT_P iterations apart, at least 1)
DECISIONS_PER_EPOCH = 10
DEFAULT_ALPHA = 0.1     # JABAS: +-10% per decision
#: the goodput policy prices batch sizes with kappa x the measured noise scale (docs/formulas.md, section 3): the
#: simple noise scale tr(Sigma)/|G|^2 can underestimate the batch size training tolerates (McCandlish et al.'s
#: B_crit against B_simple); 1 is Pollux's pricing
DEFAULT_GOODPUT_KAPPA = 1.0
#: the goodput policy prices batch sizes with the noise scale carried halfway to the next decision along its trend
#: (docs/formulas.md, section 3): on by default since two development runs of bench/adaptive_tta.py (10 seeds per
#: task) found it no worse than the estimate as measured on every task and without its target misses on digits
DEFAULT_NOISE_TREND = True
#: how the goodput policy prices a batch size's per-sample efficiency (core/adaptive/headroom.py): "pollux", Pollux's
#: E(B) = (B_noise + B0) / (B_noise + B) (the lr re-tuned at every B), or "linear", E_lin on the measured curvature
#: headroom (the lr scaled linearly from the user's B; Pollux's E until a headroom is measured)
EFFICIENCIES = ("pollux", "linear")
DEFAULT_EFFICIENCY = "pollux"
#: a move of B by k is refused beyond c x h, h the measured curvature headroom (core/adaptive/headroom.py; only where
#: h is
#: measured): c in [3.60, 5.26) fits four tasks' grids (bench/RESULTS.md, bench/adaptive_experiments.py)
DEFAULT_HEADROOM_C = 4.0
#: the curvature-headroom probe at the controller's decision rounds (runtime/headroom_probe.py, docs/adaptive.md): the
#: samples of its fixed probe batch (0: no probe, the headroom cap stays off) and every how many decision rounds it
#: runs (one forward and two backwards on the probe batch, on rank 0)
DEFAULT_HEADROOM_PROBE = 0
DEFAULT_HEADROOM_EVERY = 10
#: what an adaptive run spends its epoch budget on (docs/adaptive.md): "time" (the budget in samples: the run ends
#: after ``epochs`` epochs of samples) or "final" (the budget in statistical progress, Pollux's: the run goes on
#: until the progress of ``epochs`` epochs at the initial batch is made)
GOALS = ("time", "final")
DEFAULT_GOAL = "time"
#: Seesaw's late-phase floor (core/adaptive/seesaw.py): where the lr schedule has cut the lr by alpha < 1 from its
#: peak, B is held at least at batch_ref / alpha (capped by the headroom) and the lr cut undone by the lr rule
DEFAULT_SEESAW = False
DEFAULT_GAMMA = 0.1     # JABAS: ResNet-50 / GNMT / Faster R-CNN (0.3 for ViT)
#: where an adaptive run starts: the given batch, or the profiled throughput's knee (core/planning/space.py
#: ``throughput_knee``)
BATCH_STARTS = ("batch", "knee")
#: the knee: the smallest B whose doubling raises the modelled samples/s by at most this fraction
KNEE_RISE = 0.05
LR_RULES = ("auto", "sqrt", "linear", "adascale", "none")
WD_RULES = ("none", "linear")
#: the ramp policy multiplies the initial B by DEFAULT_RAMP_FACTOR at each of these fractions of the run
DEFAULT_RAMP_AT = (0.25, 0.5, 0.75)
DEFAULT_RAMP_FACTOR = 2.0
#: the divergence guard on adaptive moves (core/adaptive/guard.py, docs/formulas.md section 8): a move up is undone
#: when the
#: mean loss after it exceeds the mean before it by GUARD_SIGMA standard errors and by GUARD_RISE of it; then no
#: move above the restored B for GUARD_COOLDOWN decision periods (doubling with each further revert)
DEFAULT_GUARD_SIGMA = 5.0
DEFAULT_GUARD_RISE = 0.1
DEFAULT_GUARD_COOLDOWN = 10


def canonical_policy(name: str) -> str:
    """'fixed', 'similarity', 'noise-scale' or 'ramp' for a policy name or alias (e.g. 'goodput')."""
    key = POLICY_ALIASES.get(str(name).strip().lower())
    if key is None:
        raise ConfigError(f"unknown batch policy {name!r}; valid policies: {', '.join(POLICIES)}")
    return key


def policy_name(value: Any) -> Any:
    """The canonical name of a known policy alias; any other value unchanged (the check names it)."""
    return POLICY_ALIASES.get(value.strip().lower(), value) if isinstance(value, str) else value


# ---- [autoscale] ------------------------------------------------------------------------------
OBJECTIVES = ("time", "cost", "time-under-budget", "cost-under-deadline")
#: restart overhead (s) assumed until one is measured on the chain
RESTART_PRIOR_S = 30.0
#: a move must improve the objective by more than this fraction (hysteresis: no move on a small predicted gain,
#: no ping-pong between two nearly equal mixes)
DEFAULT_MARGIN = 0.05
