"""Job configuration: one dataclass, :class:`JobConfig`, whose fields are the keys; loaded from TOML (tomllib)
and/or flags; validated.

Every job key is declared once, as a field of :class:`JobConfig`, with its type, default, help text, constraints
and its section (``[train]``, ``[planning]``, ...) as field metadata (core/config/schema.py ``key``, here through
one helper per section: ``_train(...)``, ``_adaptive(...)``). From those fields come the validation
(:func:`check_fields`), the command-line flags (core/config/cliargs.py ``add_arguments``: ``--KEY`` per job key
in a group per section, ``--autoscale-KEY`` per auto-scaling key), the section views (``cfg.train.batch`` is
``cfg.batch``: schema's ``SectionView``) and the configuration reference in docs/config.md
(scripts/gen_config_table.py, from :func:`all_fields`). A value is normalised when it is assigned (a policy alias
becomes its canonical name); :meth:`JobConfig.validate` only checks. Unknown keys and impossible values raise
ConfigError with one line naming the key, the value and what is valid (docs/invariants.md, invariant 11).
The choices and default values come from :mod:`hpc_jabas.core.config.defaults`, so this module imports no
implementation module.

A TOML file may put the job keys at top level or in any table (``[train]``, ``[adaptive]``, ...: the
table name only groups them; every key name is unique); the ``[autoscale]`` table holds the
:class:`AutoscaleConfig` keys (a nested object of its own: ``cfg.autoscale``, with its own checks) and
``[slowdown]`` the per-rank interference.
"""
from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from hpc_jabas.core.config import gpus
from hpc_jabas.core.config.defaults import (
    AMP_MODES,
    BACKENDS,
    BALANCE_MODES,
    BATCH_STARTS,
    DEFAULT_ALPHA,
    DEFAULT_EFFICIENCY,
    DEFAULT_GAMMA,
    DEFAULT_GOAL,
    DEFAULT_GOODPUT_KAPPA,
    DEFAULT_GUARD_COOLDOWN,
    DEFAULT_GUARD_RISE,
    DEFAULT_GUARD_SIGMA,
    DEFAULT_HEADROOM_C,
    DEFAULT_HEADROOM_EVERY,
    DEFAULT_HEADROOM_PROBE,
    DEFAULT_MARGIN,
    DEFAULT_NOISE_TREND,
    DEFAULT_RAMP_AT,
    DEFAULT_RAMP_FACTOR,
    DEFAULT_SEESAW,
    EFFICIENCIES,
    EMU_BASE_S,
    EMU_PER_SAMPLE_S,
    GOALS,
    LR_RULES,
    OBJECTIVES,
    PLANNERS,
    POLICIES,
    RESTART_PRIOR_S,
    TAILS,
    WD_RULES,
    policy_name,
)
from hpc_jabas.core.config.schema import (
    Section,
    SectionOf,
    check_fields,
    field_types,
    in_section,
    key,
    key_fields,
    reject_unknown,
)
from hpc_jabas.core.config.slowdown import Slowdown
from hpc_jabas.errors import ConfigError


def read_toml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A TOML file as a dict; a missing or malformed file is one clear ConfigError. A config or job file names
    the code that runs (a job file's ``task``, ``pythonpath`` and ``python``) and steers what a job does: one
    that another user owns or others may write, or that sits below a directory others may write, is refused
    before it is read (hpc_jabas/trust.py ``check_file``: UntrustedFileError, one line, exit 2). Every config
    TOML goes through here: ``--config`` of a script, ``JobConfig.from_toml``, ``hpc-jabas submit JOB.toml``
    and the job's launcher (``python -m hpc_jabas.runtime.job.launch JOB.toml``) on the node."""
    from hpc_jabas.core.config.textfile import read_toml as read
    from hpc_jabas.trust import TRUST_GROUP_ENV, UntrustedFileError, check_file
    try:
        check_file(path, what)
    except UntrustedFileError as e:      # its trust_group key cannot vouch for the file it is in
        msg = str(e)
        if _GROUP_FIX in msg:
            msg = msg.replace(_GROUP_FIX, f"export {TRUST_GROUP_ENV}=1 (a file's own trust_group key counts only "
                                          "once it has been read)")
        raise UntrustedFileError(msg) from None
    return read(path, what, "a TOML file")


#: the fix trust.py's refusal of a group-writable file names, which cannot apply to the config file itself
_GROUP_FIX = "set trust_group = true in the job's config (hpc-jabas status: --trust-group)"


# ---- the keys --------------------------------------------------------------------------------

#: :func:`key` with its section (core/config/schema.py ``in_section``): the group a key is listed in (the reference,
#: ``--help``) and viewed through (``cfg.train``); in a TOML file, a table's name only groups keys
_train = in_section("train")
_planning = in_section("planning")
_emulation = in_section("emulation")
_adaptive = in_section("adaptive")
_balancing = in_section("balancing")
_output = in_section("output")
_slurm = in_section("slurm")


@dataclass
class AutoscaleConfig(Section):
    """[autoscale] epoch-end choice of the partition mix (Slurm jobs)."""
    objective: str = key("time", "what the mix minimises", choices=OBJECTIVES)
    max_gpus: int = key(8, "most GPUs in a mix", lo=1)
    min_gpus: int = key(1, "fewest GPUs in a mix", lo=1)
    allowed: list[str] | None = key(None, "partition names or GPU types to consider", shown="all",
                                    metavar="P1,P2,...")
    max_partitions: int = key(2, "most partitions in a mix", lo=1)
    margin: float = key(DEFAULT_MARGIN, "move only when the objective improves by more than this fraction", lo=0.0,
                        hi=1.0, hi_open=True)
    restart_prior_s: float = key(RESTART_PRIOR_S, "restart overhead (s) assumed until one is measured", lo=0.0)
    budget: float | None = key(None, "money left for the remaining epochs (objective time-under-budget)", lo=0.0,
                               shown="–")
    deadline_s: float | None = key(None, "seconds left (objective cost-under-deadline)", lo=0.0, shown="–")
    enabled: bool = key(True, "choose a mix at every epoch end")
    partition_types: dict[str, str] | None = key(None, "GPU type per partition where Slurm cannot tell it, "
                                                       "e.g. {gpu = \"v100\"} (flag PART:TYPE, repeatable)",
                                                 shown="from Slurm", metavar="PART:TYPE")
    unit: int = key(1, "GPUs per allocation step of a partition in a mix (0: one whole node of the partition)", lo=0)
    exact_upto: int = key(0, "also offer every GPU count 1..N exactly (few GPUs), whatever the unit", lo=0)
    queue_aware: bool = key(False, "price each candidate's expected queue wait (sbatch --test-only) into its time")
    max_queue_wait_s: float | None = key(None, "never move onto a mix expected to wait longer in the queue (s); "
                                               "implies queue_aware", lo=0.0, shown="off")

    def validate(self) -> AutoscaleConfig:
        check_fields(self, "autoscale.")
        if self.min_gpus > self.max_gpus:
            raise ConfigError(f"autoscale.min_gpus={self.min_gpus} > autoscale.max_gpus={self.max_gpus}; "
                              "need min_gpus <= max_gpus")
        if self.objective == "time-under-budget" and self.budget is None:
            raise ConfigError("autoscale.objective='time-under-budget' needs autoscale.budget (money left)")
        if self.objective == "cost-under-deadline" and self.deadline_s is None:
            raise ConfigError("autoscale.objective='cost-under-deadline' needs autoscale.deadline_s (seconds left)")
        return self

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> AutoscaleConfig:
        """The ``[autoscale]`` table, validated; None or {} gives the defaults."""
        if d is None:
            d = {}
        if not isinstance(d, Mapping):
            raise ConfigError(f"autoscale={d!r} must be a table, e.g. [autoscale] objective = \"cost\"")
        norm = {str(k).replace("-", "_"): v for k, v in d.items()}
        reject_unknown(norm, cls.keys(), "autoscale key")
        return cls(**norm).validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(kw_only=True)
class JobConfig(Section):
    """One job's configuration: every key a field, declared once, with its section as metadata. ``cfg.batch``
    reads and writes a key; ``cfg.train.batch`` reaches the same key through its section (schema's ``SectionView``).

    ``JobConfig(batch=512, policy="similarity")`` takes the keys (an unknown one is one ConfigError line) and
    ``autoscale`` (an :class:`AutoscaleConfig` or its table); it does not validate: :meth:`validate` (called by
    :meth:`from_dict`, ``from_args`` and the Trainer) does.
    """
    # [train] the data and the loop
    epochs: int = _train(1, "epochs to train", lo=1)
    batch: int = _train(256, "initial global batch size B", lo=1)
    batch_per_rank: int | None = _train(None, "the batch of each rank, DDP's and Horovod's habit: the global batch B "
                                              "is this x the job's rank count (said once in the log); set, it "
                                              "replaces batch", lo=1, shown="–", metavar="N")
    eval_metric: str = _train("loss", "the evaluation result's key (eval_fn returns a dict) that ReduceLROnPlateau "
                                      "steps on at each epoch end", metavar="KEY")
    micro_batch: int | None = _train(None, "micro-batch size b", lo=1, shown="the planner's choice")
    min_micro_batch: int | None = _train(None, "smallest micro-batch size b the planner uses (identical b: the "
                                               "profiles' measured sizes from this one up)", lo=1,
                                         shown="8 when the model has BatchNorm layers, else 1")
    seed: int = _train(0, "seed of the sample order (one seeded permutation per epoch)", lo=0)
    tail: str = _train("shrink", "epoch tail: shrink (the last iteration takes the r < B samples left) or drop them",
                       choices=TAILS)
    clip_grad_norm: float | None = _train(None, "clip the gradient to this global norm after the allreduce, before the "
                                                "step", lo=0.0, lo_open=True, shown="off", metavar="NORM")
    amp: str = _train("off", "mixed precision: the forward under torch.autocast bf16, or fp16 with loss scaling "
                             "(inf/nan steps skipped on every rank)", choices=AMP_MODES)
    backend: str = _train("auto", "communication backend: horovod, torch (torch.distributed: Gloo on CPU, NCCL on "
                                  "CUDA) or auto (Horovod when it imports, else torch); docs/backends.md",
                          choices=BACKENDS)
    bucket_cap_mb: float | None = _train(None, "torch backend: DistributedDataParallel's gradient bucket size in MB "
                                               "(on Horovod its fusion buffer, HOROVOD_FUSION_THRESHOLD, plays this "
                                               "part)", lo=0.0, lo_open=True, shown="DDP's 25", metavar="MB")
    find_unused_parameters: bool = _train(False, "torch backend: DistributedDataParallel's find_unused_parameters (a "
                                                 "forward that leaves parameters out of the loss, e.g. a branch)")
    static_graph: bool = _train(False, "torch backend: DistributedDataParallel's static_graph; only false: a rank's "
                                       "micro-batches accumulate under DDP's no_sync, which a static graph does not "
                                       "support (torch's reducer fails an internal assert)")
    broadcast_buffers: bool = _train(False, "torch backend: DistributedDataParallel's broadcast_buffers; only false: "
                                            "ranks run unequal micro-batch counts, so a broadcast in every forward "
                                            "would not match across ranks (BatchNorm buffers are averaged over the "
                                            "ranks at each epoch end instead)")
    # [planning] how B is split into micro-batches per rank
    planner: str = _planning("optimal", "optimal (perf model + exact planner), lbbsp (B split in proportion to speeds) "
                                        "or fixed (the plan key)", choices=PLANNERS)
    plan: str | None = _planning(None, "explicit plan, e.g. 'b=4 n=1,3,4' (its flag implies --planner fixed)",
                                 shown="–", metavar="PLAN")
    identical_micro_batch: str = _planning("auto", "one micro-batch size b on every rank (IIDP) or per-rank sizes: "
                                                   "auto = identical when micro_batch is set or the model has "
                                                   "BatchNorm layers", choices=("auto", "true", "false"))
    gpu_types: list[str] | None = _planning(None, "GPU type per rank, catalog names, e.g. v100,p100,rtx2060",
                                            shown="from Slurm or CUDA, else v100", metavar="T1,T2,...")
    speeds: list[float] | None = _planning(None, "declared per-rank speeds for lbbsp and emulation, e.g. 1,0.5,0.25",
                                           lo=0.0, lo_open=True, shown="catalog", metavar="S1,S2,...")
    profile_dir: str | None = _planning(None, "perf-model directory written by hpc-jabas profile",
                                        shown="the emulated model", metavar="DIR")
    # [emulation] CPU ranks that stand for GPU types
    emulate: bool = _emulation(False, "emulate the GPU types on CPU ranks: t(b) = (emulate_base_s + "
                                      "emulate_per_sample_s * b) / speed per micro-batch")
    emulate_base_s: float = _emulation(EMU_BASE_S, "emulation: seconds per micro-batch on a V100", lo=0.0)
    emulate_per_sample_s: float = _emulation(EMU_PER_SAMPLE_S, "emulation: seconds per sample on a V100", lo=0.0)
    slowdown: dict[int, str] = _emulation({}, "emulation: injected interference per rank, e.g. {0 = "
                                              "\"factor=3,start=50\"} (flag RANK:SPEC, repeatable; "
                                              "kind=step|ramp|periodic, end, period, duty)", metavar="RANK:SPEC")
    # [adaptive] the batch-size policy and the lr rule
    policy: str = _adaptive("fixed", "batch-size policy (similarity: JABAS/SimiGrad; noise-scale: Pollux goodput; "
                                      "ramp: B x ramp_factor at each ramp_at)",
                            choices=POLICIES, canon=policy_name)
    p: int | None = _adaptive(None, "iterations between batch-size decisions (unset: a tenth of an epoch's iterations "
                              "at the initial batch, at most 100)", lo=1, shown="epoch/10")
    measure_every: int | None = _adaptive(None, "measure the gradient statistics every N iterations between decisions "
                                                "too: noise-scale takes each noise-scale measurement (noise-only: no "
                                                "half-batch sum) into its estimate and decides first once its "
                                                "warm-up's 4 are in; similarity decides on the mean of the period's "
                                                "cosines (each measurement an extra gradient-sized allreduce)",
                                          lo=1, shown="noise-scale: p/10; similarity: decisions only", metavar="N")
    noise_memory: float | None = _adaptive(None, "noise-scale policy: the noise-scale estimate's memory in training "
                                                 "samples (Pollux: about 1000 x batch)", lo=0.0, lo_open=True,
                                           shown="min(1000 x batch, one epoch)", metavar="SAMPLES")
    batch_start: str = _adaptive("batch", "where an adaptive run starts: batch, or knee (the smallest B in [batch, "
                                          "batch_max] whose doubling adds at most 5 percent modelled samples/s on this "
                                          "mix; the lr warmed up from batch's over the first decision period, batch "
                                          "stays the lr reference)", choices=BATCH_STARTS)
    kappa: float = _adaptive(DEFAULT_GOODPUT_KAPPA, "noise-scale policy: batch sizes are priced with kappa x the "
                                                    "measured noise scale (1: Pollux's pricing)", lo=0.0, lo_open=True)
    noise_trend: bool = _adaptive(DEFAULT_NOISE_TREND, "noise-scale policy: price batch sizes with the noise scale "
                                                       "carried halfway to the next decision along its trend (the "
                                                       "estimate's lag removed); false: the estimate as measured")
    efficiency: str = _adaptive(DEFAULT_EFFICIENCY, "noise-scale policy: the per-sample price of a batch size: pollux "
                                                    "(E(B), the lr re-tuned at every B) or linear (E_lin on the "
                                                    "measured curvature headroom, for the linear lr rule; pollux "
                                                    "until a headroom is measured)", choices=EFFICIENCIES)
    headroom_c: float = _adaptive(DEFAULT_HEADROOM_C, "noise-scale and similarity policies: a move of B by k is "
                                                      "refused beyond headroom_c x the measured curvature headroom h "
                                                      "(off while h is not measured)", lo=0.0, lo_open=True)
    headroom_probe: int = _adaptive(DEFAULT_HEADROOM_PROBE, "adaptive policies: measure the curvature headroom h on a "
                                                            "fixed probe batch of this many samples at decision rounds "
                                                            "(one forward and two backwards on rank 0; 0: never, the "
                                                            "headroom cap stays off)", lo=0, metavar="SAMPLES")
    headroom_every: int = _adaptive(DEFAULT_HEADROOM_EVERY, "with headroom_probe: probe every N-th decision round (the "
                                                            "first round probes)", lo=1, metavar="N")
    seesaw: bool = _adaptive(DEFAULT_SEESAW, "adaptive policies: Seesaw's late-phase floor: where the lr schedule has "
                                             "cut the lr by alpha < 1 from its peak, B >= batch_ref / alpha (capped "
                                             "by the headroom) with the lr kept (SGD) or x sqrt(alpha) (Adam)")
    goal: str = _adaptive(DEFAULT_GOAL, "adaptive policies: time (the epoch budget in samples) or final (in "
                                        "statistical progress, Pollux's: the run goes on until the progress of epochs "
                                        "x the data at batch is made)", choices=GOALS)
    alpha: float = _adaptive(DEFAULT_ALPHA, "step of a batch-size change", lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    gamma: float = _adaptive(DEFAULT_GAMMA, "gradient-similarity target of the similarity policy", lo=-1.0, hi=1.0,
                             lo_open=True, hi_open=True)
    batch_min: int | None = _adaptive(None, "smallest global batch B", lo=1,
                                      shown="batch; adaptive policies: min(batch, the smallest micro-batch)")
    batch_max: int | None = _adaptive(None, "largest global batch B", lo=1,
                                      shown="batch; adaptive policies: max(batch, one epoch's samples)")
    lr_rule: str = _adaptive("auto", "lr scale for a batch B vs batch_ref, on the user's own scheduler's lr "
                             "(auto: sqrt with similarity and ramp, linear with noise-scale)",
                             choices=LR_RULES)
    batch_ref: int | None = _adaptive(None, "reference batch of the lr rule", lo=1, shown="batch")
    ramp_at: list[float] = _adaptive(list(DEFAULT_RAMP_AT), "ramp policy: fractions of the run (in samples) at which "
                                                            "B is multiplied by ramp_factor",
                                     lo=0.0, hi=1.0, lo_open=True, hi_open=True)
    ramp_factor: float = _adaptive(DEFAULT_RAMP_FACTOR, "ramp policy: the factor B is multiplied by at each ramp_at",
                                   lo=0.0, lo_open=True)
    wd_rule: str = _adaptive("none", "weight decay vs B: none, or linear (weight decay x B / batch_ref)",
                             choices=WD_RULES)
    guard: bool = _adaptive(True, "divergence guard on adaptive moves: a move that raises B or the lr is undone when "
                                  "the mean loss after it rises beyond its noise band (guard_sigma, guard_rise), then "
                                  "no move above the restored B for guard_cooldown decision periods")
    guard_sigma: float = _adaptive(DEFAULT_GUARD_SIGMA, "divergence guard: the rise that reverts, in standard errors "
                                                        "of the difference of the loss means after and before a move",
                                   lo=0.0, lo_open=True)
    guard_rise: float = _adaptive(DEFAULT_GUARD_RISE, "divergence guard: the rise that reverts must also exceed this "
                                                      "fraction of the mean loss before the move", lo=0.0)
    guard_cooldown: int = _adaptive(DEFAULT_GUARD_COOLDOWN, "divergence guard: decision periods without a move above "
                                                            "the restored B after a revert (doubling with each "
                                                            "further revert)", lo=0)
    # [balancing] online load balancing
    balance: str = _balancing("off", "online load balancing: reactive (last measured speed) or predictive (NARX-style "
                                     "RLS on past speeds and load signals)", choices=BALANCE_MODES)
    p_balance: int = _balancing(10, "iterations between rebalancing decisions", lo=1)
    balance_threshold: float = _balancing(0.05, "re-plan only above this predicted gain (fraction)", lo=0.0)
    calibrate: bool = _balancing(False, "opt-in: fit each rank's measured micro-batch times to the profile online "
                                        "(factor, offset per call) and plan with the calibrated model "
                                        "(core/perf/calibration.py)")
    # [output] metrics and checkpoints
    run_dir: str | None = _output(None, "directory of metrics.jsonl and checkpoints", metavar="DIR",
                                  shown="runs/SCRIPT-HASH: the script's name and a hash of its configuration")
    metrics_period: int = _output(10, "iterations between metric flushes (at the first safe point agreement after "
                                      "them)", lo=1)
    checkpoint: bool = _output(True, "write a checkpoint at every epoch end (and at the periodic and signal safe "
                                     "points)")
    keep_checkpoints: int = _output(3, "checkpoints kept", lo=1)
    resume_finished: bool = _output(False, "hpc-jabas submit: submit a chain whose last job already finished the "
                                           "epochs (else refused); a script's rerun of a finished run_dir trains "
                                           "nothing, says so in one line on stdout and exits 0 (with this key: a log "
                                           "line instead)")
    checkpoint_every_epochs: int = _output(1, "checkpoint at every N-th epoch end (the last epoch's always; with an "
                                              "epoch-end hook, every epoch's)", lo=1, metavar="N")
    checkpoint_every: int | None = _output(None, "also checkpoint inside an epoch every N iterations",
                                           lo=1, shown="off", metavar="N")
    checkpoint_minutes: float | None = _output(None, "also checkpoint inside an epoch every T minutes (rank 0's clock)",
                                               lo=0.0, lo_open=True, shown="off", metavar="T")
    safe_point_s: float = _output(0.5, "about this many seconds between the ranks' agreements at iteration boundaries "
                                  "(stop signals, non-finite losses, the clock's checkpoints; metrics flush there); 0: "
                                  "every iteration", lo=0.0)
    trust_group: bool = _output(False, "accept checkpoints and chain records that the file's group may write (else "
                                       "only the owner, this user or root, may write them)")
    # [slurm] the Slurm jobs of a chain: time limit, signals, requeues
    time_min: int = _slurm(60, "time limit of every Slurm job of the chain (minutes)", lo=1)
    signal_lead_s: int = _slurm(60, "seconds before the time limit at which Slurm signals the job (USR1 for sbatch, "
                                    "USR2 for submitit) so that it checkpoints and requeues", lo=1)
    max_timeouts: int = _slurm(3, "requeues after hitting the time limit before the chain stops (preemptions do "
                                  "not count)", lo=0)
    max_failures: int = _slurm(2, "resubmissions of a chain's failed jobs (a killed rank, a lost node) from the last "
                                  "good checkpoint, with backoff (method sbatch)", lo=0)
    # [autoscale] a table of its own, with its own checks and flags (--autoscale-KEY)
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)

    # the sections' views (cfg.train.batch is cfg.batch), one per section of the keys above
    train = SectionOf()
    planning = SectionOf()
    emulation = SectionOf()
    adaptive = SectionOf()
    balancing = SectionOf()
    output = SectionOf()
    slurm = SectionOf()

    def __new__(cls, *args: Any, **kw: Any) -> Self:
        """An unknown key is one ConfigError line naming it and the closest key (not the TypeError of the
        dataclass's ``__init__``, which takes the keys with their types)."""
        reject_unknown(kw, cls.keys(), "config key")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if not isinstance(self.autoscale, AutoscaleConfig):         # its table, e.g. JobConfig(autoscale={...})
            norm = {str(k).replace("-", "_"): v for k, v in (self.autoscale or {}).items()}
            reject_unknown(norm, AutoscaleConfig.keys(), "autoscale key")
            self.autoscale = AutoscaleConfig(**norm)

    def frozen(self) -> JobConfig:
        """A deep copy that refuses every assignment, to a key or a section (FrozenInstanceError); the Trainer's
        resolved configuration. Its copies (``copy.deepcopy``, :meth:`replace`) are not frozen."""
        out = copy.deepcopy(self)
        out.autoscale.freeze()
        out.freeze()
        return out

    def replace(self, **changes: Any) -> JobConfig:
        """A deep copy (not frozen) with ``changes`` (flat keys) assigned; not validated."""
        reject_unknown(changes, JobConfig.keys(), "config key")
        out = copy.deepcopy(self)
        for name, value in changes.items():
            setattr(out, name, value)
        return out

    def validate(self) -> JobConfig:
        """``self`` if every key is valid (unchanged), else one ConfigError line."""
        check_fields(self)
        self.autoscale.validate()
        for g in self.gpu_types or []:
            gpus.normalize(g)                 # unknown type: one line naming it and the known ones
        for spec in self.slowdown.values():
            Slowdown.parse(spec)              # one line naming the spec and its bad part
        if self.planner == "fixed" and not self.plan:
            raise ConfigError("planner='fixed' needs plan='b=... n=...', e.g. plan = \"b=4 n=1,3,4\"")
        self._check_planning()
        if self.batch_start == "knee" and self.policy not in ("similarity", "noise-scale"):
            raise ConfigError(f"batch_start='knee' needs an adaptive policy (similarity or noise-scale), not "
                              f"policy={self.policy!r}; use batch_start='batch'")
        self.check_backend_keys(self.backend)
        if self.run_dir is not None and not self.run_dir:         # Path("") is the current directory
            raise ConfigError(f"run_dir='' is empty; give a directory ({self.give('run_dir', 'DIR')}), or leave it "
                              "unset for the default runs/SCRIPT-HASH")
        bmin, bmax = self.B_min, self.B_max
        if bmin > bmax:
            raise ConfigError(f"batch_min={bmin} > batch_max={bmax}; need batch_min <= batch_max")
        if self.batch_per_rank is None and not bmin <= self.batch <= bmax:     # per rank: checked once resolved
            raise ConfigError(f"batch={self.batch} is outside [batch_min={bmin}, batch_max={bmax}]")
        return self

    def check_backend_keys(self, backend: str) -> None:
        """The keys one backend has and the other lacks, against ``backend`` (the configured one here; the Trainer
        calls it again with the backend "auto" resolved to): one ConfigError line."""
        if self.broadcast_buffers:
            raise ConfigError("broadcast_buffers=true cannot run here: DistributedDataParallel would broadcast the "
                              "buffers in every forward, and the ranks run unequal micro-batch counts, so those "
                              "broadcasts would not match across ranks; leave it false (BatchNorm buffers are "
                              "averaged over the ranks, weighted by samples, at each epoch end)")
        if self.static_graph:
            raise ConfigError("static_graph=true cannot run here: a rank's micro-batches accumulate their gradients "
                              "under DistributedDataParallel's no_sync, which DDP's static graph does not support "
                              "(torch's reducer fails an internal assert in the next backward); leave it false "
                              "(find_unused_parameters = true covers a graph with unused parameters)")
        if backend != "horovod":
            return
        if self.bucket_cap_mb is not None:
            raise ConfigError(f"bucket_cap_mb={self.bucket_cap_mb:g} is the torch backend's DDP bucket size; on "
                              "backend='horovod' set HOROVOD_FUSION_THRESHOLD (bytes) instead, or use backend='torch'")
        if self.find_unused_parameters:
            raise ConfigError("find_unused_parameters=true is DistributedDataParallel's (the torch backend); "
                              "backend='horovod' needs no such setting (its hooks reduce the gradients the backward "
                              "computes): drop it, or use backend='torch'")

    def _check_planning(self) -> None:
        """The planning keys' cross-field rules (one ConfigError line each)."""
        if self.identical_micro_batch == "false" and self.micro_batch:
            raise ConfigError(f"identical_micro_batch='false' contradicts micro_batch={self.micro_batch}, which "
                              "pins one size on every rank; drop one of them")

    @property
    def notes(self) -> tuple[str, ...]:
        """What ``add_arguments`` found in the script's own parser and does not read, one line each, with what to
        use instead (the Trainer logs them once, on rank 0)."""
        return tuple(self.__dict__.get("_notes", ()))

    def flag_name(self, name: str) -> str:
        """How this script's command line gives key ``name`` (error lines name it): our flag, or the script's own
        flag or positional that ``add_arguments`` reads as the key; without either, ``NAME (the config key)``."""
        return str((self.__dict__.get("_flags") or {}).get(name) or f"{name} (the config key)")

    def give(self, name: str, value: Any) -> str:
        """How this script's command line sets key ``name`` to ``value`` (``--batch 64``, ``total_epochs 4``);
        where the script has no flag of ours, the config key and the flag a script with them has."""
        flags = self.__dict__.get("_flags") or {}
        if name in flags:
            return f"{flags[name]} {value}"
        return f"{name} = {value} (the config key; --{name.replace('_', '-')} {value} as a flag)"

    def with_cli(self, notes: typing.Iterable[str], flags: Mapping[str, str]) -> JobConfig:
        """``self``, carrying what ``from_args`` learnt of the script's command line (:attr:`notes`,
        :meth:`flag_name`); copies (``replace``, ``frozen``) keep it."""
        object.__setattr__(self, "_notes", tuple(notes))
        object.__setattr__(self, "_flags", dict(flags))
        return self

    @property
    def B_min(self) -> int:
        return self.batch_min if self.batch_min is not None else self.batch

    @property
    def B_max(self) -> int:
        return self.batch_max if self.batch_max is not None else self.batch

    @classmethod
    def keys(cls) -> list[str]:
        """Every top-level key: the job keys of all sections, then ``autoscale`` (a table)."""
        return [*SECTION_OF, "autoscale"]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobConfig:
        """Flat keys and/or tables of keys (any table name), ``[autoscale]``; validated."""
        flat, auto = flatten(d)
        return cls(**flat, autoscale=AutoscaleConfig.from_dict(auto)).validate()

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> JobConfig:
        flat, auto = flatten(read_toml(path))
        flat.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict({**flat, "autoscale": auto})

    def to_dict(self) -> dict[str, Any]:
        """Flat job keys plus ``autoscale`` (a dict): what :meth:`from_dict` reads back."""
        out = {name: getattr(self, name) for name in SECTION_OF}
        out = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v) for k, v in out.items()}
        out["autoscale"] = self.autoscale.to_dict()
        return out


#: job key -> its section, in the keys' order (the order of the reference and the flag groups)
SECTION_OF: dict[str, str] = {f.name: f.metadata["section"] for f in key_fields(JobConfig)}
#: the sections, in order: each a view of JobConfig (cfg.train) and a group of flags; autoscale is a table of its own
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(SECTION_OF.values()))
#: tables whose value is the key's own value, not a group of keys
_TABLE_KEYS = ("slowdown", "autoscale")


def section_fields(section: str) -> list[dataclasses.Field[Any]]:
    """The fields of one section's keys, in order (``section_fields("slurm")``: the flags of hpc-jabas submit)."""
    return [f for f in key_fields(JobConfig) if SECTION_OF[f.name] == section]


#: keys that leave what a run computes unchanged: the default run directory's name does not depend on them
#: (``--epochs 20`` continues the ``--epochs 10`` run)
_RUN_DIR_FREE = frozenset({"epochs", *(k for k, s in SECTION_OF.items() if s in ("output", "slurm"))})


def default_run_dir(cfg: JobConfig, script: str) -> str:
    """``runs/<script>-<hash>``: the run directory of a config that names none, unique to the script (its path,
    as given) and to the keys that change what it computes (not epochs, not the output and Slurm keys)."""
    import hashlib
    import json
    keys = {k: v for k, v in cfg.to_dict().items() if k not in _RUN_DIR_FREE and k != "autoscale"}
    digest = hashlib.sha256(json.dumps([script, keys], sort_keys=True, default=str).encode()).hexdigest()[:8]
    stem = Path(script).stem or "python"
    return f"runs/{stem}-{digest}"


def flatten(d: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(job keys, autoscale table) of a TOML-like dict: tables other than slowdown/autoscale are groups
    of job keys (their names do not matter); dashes in key names become underscores. A section's name with a
    value that is no table (``train = 5``, ``[[train]]``) is one ConfigError line."""
    flat: dict[str, Any] = {}
    auto: dict[str, Any] = {}
    for k, v in d.items():
        k = str(k).replace("-", "_")
        if k == "autoscale":
            if v is not None and not isinstance(v, Mapping):
                raise ConfigError(f"autoscale={v!r} must be a table, e.g. [autoscale] objective = \"cost\"")
            auto.update(v or {})
        elif isinstance(v, Mapping) and k not in _TABLE_KEYS:
            inner, more = flatten(v)
            flat.update(inner)
            auto.update(more)
        elif k in SECTIONS:
            raise ConfigError(_not_a_table(k, v))
        else:
            flat[k] = v
    return flat, auto


def _not_a_table(section: str, v: Any) -> str:
    """The one line for a section name given a value (``train = 5``) or an array of tables (``[[train]]``)."""
    first = next(k for k, s in SECTION_OF.items() if s == section)
    if isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v):
        return (f"[[{section}]] is an array of {len(v)} table(s) where one [{section}] table belongs; write its keys "
                f"under a single [{section}] header (e.g. [{section}] {first} = ...)")
    return (f"{section}={v!r} must be a table of keys ([{section}] is a section, e.g. [{section}] {first} = ..., or "
            f"give {first} = ... before any header), not a value of type {type(v).__name__}")


# ---- every key, for the flags (cliargs.py) and the reference (scripts/gen_config_table.py) ---------

def all_fields() -> list[tuple[str, dataclasses.Field[Any], Any]]:
    """(section, field, type) of every key: the job keys in their sections' order, then autoscale's."""
    job, auto = field_types(JobConfig), field_types(AutoscaleConfig)
    return ([(SECTION_OF[f.name], f, job[f.name]) for f in key_fields(JobConfig)]
            + [("autoscale", f, auto[f.name]) for f in key_fields(AutoscaleConfig)])

