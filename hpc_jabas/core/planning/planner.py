"""The job's planner: one ``Planner`` protocol, built in one place (``make_planner``). Pure.

A planner turns a global batch B (and the balancing speed factors, or None) into a ``Plan`` and
knows which B it realises on its ranks (``batch_space``). It is built from a ``PlanSpec`` (read once from the
job's config: ``PlanSpec.from_config``), the ranks' GPU types and the perf model, by ``make_planner``: the one
place that branches on the planner kind (``_KINDS``). Three kinds, chosen by ``PlanSpec.kind``:

* ``optimal``: the exact planner (identical.py, per_rank.py) on the perf model; the declared
  ``speeds`` become per-rank speed factors of the model (``perfmodel.declared_speed_factors``;
  refused for a measured profile), balancing factors multiply them.
* ``lbbsp``: B split in proportion to the ranks' speeds (``lbbsp_speeds``: the declared ones when
  they fit the ranks, else the catalog's), in micro-batches of ``micro_batch`` (identical b) or in
  samples, each rank's in the fewest micro-batches its memory holds (per-rank b).
* ``fixed``: the plan given in ``PlanSpec.plan``; it cannot change B. Declared speeds are refused unless
  the ranks are emulated (then the emulator runs each rank at its declared speed).

**Kind of plan** (docs/invariants.md, invariant 2). Identical b (IIDP) when the model has
batch-coupled layers (``coupled_layers``: the runtime names them, runtime/batchnorm.py), when
``micro_batch`` pins the size, or when ``identical_micro_batch = "true"``; otherwise each rank its
own micro-batch size.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from hpc_jabas.core.config import gpus as catalog
from hpc_jabas.core.perf.perfmodel import PerfModel, declared_speed_factors
from hpc_jabas.core.planning.grouptimes import group_space
from hpc_jabas.core.planning.identical import plan_batch
from hpc_jabas.core.planning.plan import Plan, proportional_plan, proportional_samples_plan
from hpc_jabas.core.planning.space import BatchSpace, optimal_space, planner_space
from hpc_jabas.errors import ConfigError

if TYPE_CHECKING:
    from hpc_jabas.core.config.sections import JobConfig

PlannerFn = Callable[[int, "list[float] | None"], Plan]
ModelSource = PerfModel | Callable[[], PerfModel]

#: ``min_micro_batch`` when the model has batch-coupled layers (BatchNorm) and the key is unset: their
#: statistics come from each micro-batch alone, and Wu & He (Group Normalization, 2018) measure ResNet-50's
#: ImageNet error rising steeply below 8-16 samples per batch. Found on bench/adaptive_tta.py --image: the
#: similarity policy's B near 36-52 ran as micro-batches of 2 and 4 there, and its accuracy collapsed.
COUPLED_MIN_MICRO_BATCH = 8


def candidate_sizes(micro_batch: int | None, min_micro_batch: int | None, gpus: Sequence[str],
                    model: PerfModel) -> list[int] | None:
    """The micro-batch sizes a plan may use: ``[micro_batch]`` when pinned; else the profiles' measured sizes
    (None: the planner's default) from ``min_micro_batch`` up (the largest measured one when none is that
    large). The trainer's planner, the controller's batch space and the auto-scaler's pricing all take their
    sizes from here, so they realise and price the same B."""
    if micro_batch:
        return [int(micro_batch)]
    lo = int(min_micro_batch or 1)
    if lo <= 1:
        return None
    measured = sorted({b for g in {catalog.normalize(x) for x in gpus} for b in model.profile(g).b})
    keep = [b for b in measured if b >= lo]
    return keep or measured[-1:]


@dataclass(frozen=True)
class PlanSpec:
    """What every planner of a job is built from, read once from its config (``from_config``): the kind
    (``optimal``, ``lbbsp``, ``fixed``), the micro-batch candidates (``micro_batch`` pins one size,
    ``min_micro_batch`` is the smallest the profiles may give: ``candidates``), the plan kind
    (``identical``: the ``identical_micro_batch`` key), the declared per-rank ``speeds`` (speed factors of the
    perf model for ``optimal``, the split for ``lbbsp``), the ``fixed`` kind's ``plan``, and ``emulate``.
    The trainer's planner, the controller's batch space, the auto-scaler's and the simulator's pricing are
    all built from one (``make_planner``). Hashable: a key of the auto-scaler's space cache."""

    kind: str = "optimal"
    micro_batch: int | None = None
    min_micro_batch: int | None = None
    identical: str = "auto"
    speeds: tuple[float, ...] | None = None
    plan: str | None = None
    emulate: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ConfigError(f"planner={self.kind!r} is invalid; use one of {', '.join(_KINDS)}")
        if self.speeds is not None and not isinstance(self.speeds, tuple):
            object.__setattr__(self, "speeds", tuple(float(x) for x in self.speeds))

    @classmethod
    def from_config(cls, cfg: JobConfig | PlanSpec) -> PlanSpec:
        """The spec of a job's config (its planning keys); a PlanSpec is returned as it is."""
        if isinstance(cfg, PlanSpec):
            return cfg
        return cls(kind=cfg.planner, micro_batch=cfg.micro_batch, min_micro_batch=cfg.min_micro_batch,
                   identical=cfg.identical_micro_batch, speeds=None if not cfg.speeds else tuple(cfg.speeds),
                   plan=cfg.plan, emulate=cfg.emulate)

    @classmethod
    def of_keys(cls, keys: object) -> PlanSpec:
        """The spec of any object with some of the planning keys as attributes (absent ones: their defaults):
        ``job_batch_space``'s older callers pass such stand-ins for a JobConfig."""
        if isinstance(keys, PlanSpec):
            return keys
        speeds = getattr(keys, "speeds", None)
        return cls(kind=getattr(keys, "planner", "optimal") or "optimal",
                   micro_batch=getattr(keys, "micro_batch", None),
                   min_micro_batch=getattr(keys, "min_micro_batch", None),
                   identical=getattr(keys, "identical_micro_batch", "auto") or "auto",
                   speeds=None if not speeds else tuple(float(x) for x in speeds),
                   plan=getattr(keys, "plan", None), emulate=bool(getattr(keys, "emulate", False)))

    def replace(self, **kw: Any) -> PlanSpec:
        return dataclasses.replace(self, **kw)

    def candidates(self, gpus: Sequence[str], model: PerfModel) -> list[int] | None:
        """``candidate_sizes`` of this spec on ranks ``gpus``."""
        return candidate_sizes(self.micro_batch, self.min_micro_batch, gpus, model)

    @property
    def changes_B(self) -> bool:
        """This kind can realise other batch sizes (``fixed`` cannot: its plan is given)."""
        return _KINDS[self.kind].changes_B

    @property
    def every_rank_runs(self) -> bool:
        """Every rank gets samples in every plan of this kind (the auto-scaler's bound may assume it)."""
        return _KINDS[self.kind].every_rank_runs


class Planner(Protocol):
    """What the trainer, the controller and the auto-scaler use of a planner."""

    @property
    def spec(self) -> PlanSpec:
        """What this planner was built from."""
        ...

    @property
    def identical_b(self) -> bool:
        """Plans keep one micro-batch size on every rank (IIDP)."""
        ...

    @property
    def declared_factors(self) -> list[float] | None:
        """The per-rank speed factors of the declared speeds that ``plan`` applies (optimal), or None."""
        ...

    def plan(self, B: int, factors: list[float] | None = None) -> Plan:
        """The plan for global batch B; ``factors``: the balancing speed factors per rank, or None."""
        ...

    def batch_space(self, B_min: int, B_max: int) -> BatchSpace:
        """The B in [B_min, B_max] this planner realises on its ranks, timed by the perf model."""
        ...

    def pricing_space(self, B_min: int, B_max: int) -> BatchSpace:
        """The batch space the auto-scaler and the simulator price a mix with (identical b, no declared
        factors): ``optimal``'s rank-group times (grouptimes.py's group_space, no per-rank plans of thousands
        of ranks), else ``batch_space``."""
        ...


def wants_identical_b(spec: PlanSpec | JobConfig, coupled_layers: Sequence[str] = ()) -> bool:
    """The kind of plan (module docstring): True for identical b, False for per-rank sizes. (A forced
    per-rank plan with a pinned ``micro_batch`` is refused by ``JobConfig.validate``; the warning for
    batch-coupled layers is the trainer's.)"""
    s = PlanSpec.from_config(spec)
    if s.identical == "false":
        return False
    return s.identical == "true" or bool(s.micro_batch) or bool(coupled_layers)


def lbbsp_speeds(gpus: Sequence[str], speeds: Sequence[float] | None = None, *, strict: bool = False) -> list[float]:
    """The speeds the lbbsp planner splits B by: the declared ones when they fit, else the catalog's.

    ``strict``: declared speeds that do not fit the ranks are an error (the job's own ranks), not
    replaced by the catalog's (another mix, priced by the auto-scaler)."""
    if speeds and len(speeds) == len(gpus):
        return [float(s) for s in speeds]
    if speeds and strict:
        raise ConfigError(f"speeds lists {len(speeds)} values but the job has {len(gpus)} ranks; "
                          "give one speed per rank")
    return [catalog.get(g).relative_speed for g in gpus]


@dataclass(frozen=True)
class BuildArgs:
    """What ``make_planner`` resolved for a kind's ``build``: the spec, the ranks' GPU types, the perf model (or
    the function that builds it), the plan kind (identical b or not), the declared speed factors given (None:
    none), the user's planner function, whether lbbsp refuses speeds that do not fit the ranks, and whether
    the declared factors are still to be derived from ``spec.speeds`` (``optimal`` only)."""
    spec: PlanSpec
    types: list[str]
    perf_model: ModelSource
    identical_b: bool
    given: list[float] | None
    plan_fn: PlannerFn | None
    strict_speeds: bool
    derive: bool


class _JobPlanner:
    """The parts every kind shares: the ranks, the perf model (built on first use), the plan kind,
    and an optional planner function that replaces the kind's own rule (the user's ``planner_fn``)."""

    kind = ""
    changes_B: ClassVar[bool] = True
    every_rank_runs: ClassVar[bool] = False
    #: its batch space steps in whole micro-batches whatever the plan kind (lbbsp's identical-b split)
    space_in_micro_batches: ClassVar[bool] = False

    def __init__(self, a: BuildArgs, declared: list[float] | None) -> None:
        self._spec = a.spec
        self.gpus = list(a.types)
        self._model = a.perf_model
        self._identical_b = a.identical_b
        self._declared = declared
        self._plan_fn = a.plan_fn

    @property
    def spec(self) -> PlanSpec:
        return self._spec

    @property
    def identical_b(self) -> bool:
        return self._identical_b

    @property
    def declared_factors(self) -> list[float] | None:
        return self._declared

    def model(self) -> PerfModel:
        m = self._model
        return m if isinstance(m, PerfModel) else m()

    def plan(self, B: int, factors: list[float] | None = None) -> Plan:
        if self._plan_fn is not None:
            return self._plan_fn(B, factors)
        return self._plan(B, factors)

    def _plan(self, B: int, factors: list[float] | None) -> Plan:
        raise NotImplementedError

    def batch_space(self, B_min: int, B_max: int) -> BatchSpace:
        raise ConfigError(f"planner={self.kind!r} cannot change the batch size; use 'optimal' or 'lbbsp'")

    def pricing_space(self, B_min: int, B_max: int) -> BatchSpace:
        return self.batch_space(B_min, B_max)

    @classmethod
    def build(cls, a: BuildArgs) -> _JobPlanner:
        raise NotImplementedError


class FixedPlanner(_JobPlanner):
    """The plan of ``PlanSpec.plan`` for every B."""

    kind = "fixed"
    changes_B = False

    def __init__(self, a: BuildArgs, fixed: Plan | None) -> None:
        super().__init__(a, None)
        self.fixed = fixed

    @classmethod
    def build(cls, a: BuildArgs) -> _JobPlanner:
        spec, fixed = a.spec, None
        if a.plan_fn is None:
            if not spec.plan:
                raise ConfigError("planner='fixed' needs plan='b=... n=...', e.g. plan = \"b=4 n=1,3,4\"")
            if spec.speeds and not spec.emulate:     # a config may keep them; the job's ranks cannot use them
                raise ConfigError(f"speeds={list(spec.speeds)} are not used by planner='fixed' (its plan is given); "
                                  "drop speeds, or use planner='optimal' or 'lbbsp'")
            fixed = Plan.parse(spec.plan)
        return cls(a, fixed)

    def _plan(self, B: int, factors: list[float] | None) -> Plan:
        assert self.fixed is not None
        return self.fixed


class LbbspPlanner(_JobPlanner):
    """LB-BSP: B split in proportion to ``speeds`` (times the balancing factors)."""

    kind = "lbbsp"
    space_in_micro_batches = True

    @classmethod
    def build(cls, a: BuildArgs) -> _JobPlanner:
        speeds = None if a.plan_fn is not None else lbbsp_speeds(a.types, a.spec.speeds, strict=a.strict_speeds)
        return cls(a, a.spec.micro_batch or a.spec.min_micro_batch or 1, speeds)

    def __init__(self, a: BuildArgs, b: int, speeds: list[float] | None) -> None:
        super().__init__(a, a.given)
        self.b = b
        self.speeds = speeds
        self._caps: list[int] | None = None
        if not self.identical_b and self._plan_fn is None:
            self.caps()

    def caps(self) -> list[int]:
        """Per rank: the largest micro-batch its memory holds (per-rank plans only)."""
        if self._caps is None:
            pm = self.model()
            caps = [pm.profile(g).max_b for g in self.gpus]
            assert all(c is not None for c in caps)   # ComputeProfile.__post_init__ sets it
            self._caps = [int(c) for c in caps if c is not None]
        return self._caps

    def _plan(self, B: int, factors: list[float] | None) -> Plan:
        assert self.speeds is not None
        sp = [s * (factors[i] if factors else 1.0) for i, s in enumerate(self.speeds)]
        return proportional_plan(B, self.b, sp) if self.identical_b else proportional_samples_plan(B, sp, self.caps())

    def batch_space(self, B_min: int, B_max: int) -> BatchSpace:
        """Multiples of b that ``plan`` realises exactly, timed by the perf model (declared factors)."""
        pm, gl = self.model(), self.gpus
        sfl = list(self.declared_factors) if self.declared_factors else None
        return planner_space(B_min, B_max, self.b, lambda B: self.plan(B, None),
                             lambda plan: pm.iteration_time(plan, gl, sfl), f"lbbsp on {','.join(gl)}, b={self.b}")


class OptimalPlanner(_JobPlanner):
    """The exact planner on the perf model: identical b, or per-rank sizes."""

    kind = "optimal"
    every_rank_runs = True

    @classmethod
    def build(cls, a: BuildArgs) -> _JobPlanner:
        given = a.given
        if a.derive and a.plan_fn is None:
            pm = a.perf_model if isinstance(a.perf_model, PerfModel) else a.perf_model()
            given = declared_speed_factors(list(a.spec.speeds) if a.spec.speeds else None, a.types, pm)
        return cls(a, given)

    def __init__(self, a: BuildArgs, declared: list[float] | None) -> None:
        super().__init__(a, declared)
        self.micro_batch = a.spec.micro_batch
        self.min_micro_batch = a.spec.min_micro_batch

    @functools.cached_property
    def cands(self) -> list[int] | None:
        """candidate_sizes() on this planner's ranks (computed once: it reads the perf model)."""
        return self.spec.candidates(self.gpus, self.model())

    def pricing_space(self, B_min: int, B_max: int) -> BatchSpace:
        return group_space(self.gpus, self.model(), B_min, B_max, self.cands)

    def _plan(self, B: int, factors: list[float] | None) -> Plan:
        sf, declared = factors, self.declared_factors
        if declared is not None:
            sf = [d * (factors[i] if factors else 1.0) for i, d in enumerate(declared)]
        return plan_batch(B, self.gpus, self.model(), b_candidates=self.cands, speed_factors=sf,
                          per_rank=not self.identical_b)

    def batch_space(self, B_min: int, B_max: int) -> BatchSpace:
        return optimal_space(self.gpus, self.model(), B_min, B_max, self.cands,
                             per_rank=not self.identical_b and not self.micro_batch,
                             speed_factors=self.declared_factors)


#: the planner kinds: the one place a kind name selects behaviour
_KINDS: dict[str, type[_JobPlanner]] = {c.kind: c for c in (OptimalPlanner, LbbspPlanner, FixedPlanner)}


def make_planner(spec: PlanSpec | JobConfig, gpu_types: Sequence[str], perf_model: ModelSource,
                 coupled_layers: Sequence[str] = (), *, plan_fn: PlannerFn | None = None,
                 identical_b: bool | None = None,
                 speed_factors: Sequence[float] | None | Literal["declared"] = "declared",
                 strict_speeds: bool = True) -> Planner:
    """The job's planner (module docstring) of ``spec`` (a PlanSpec, or a JobConfig read through
    ``PlanSpec.from_config``) on ranks ``gpu_types`` (one type per rank); ``perf_model`` the model or a
    function that builds it (called only by the kinds that need it).

    ``coupled_layers``: the model's batch-coupled layer names (they make plans identical-b).
    ``plan_fn``: a planner function ``(B, factors) -> Plan`` that replaces the kind's rule (the
    user's own); the kind then only gives the batch space, plans count as identical b and no declared
    factors apply unless given. ``identical_b`` / ``speed_factors``: the plan kind and the declared speed
    factors when already known (the auto-scaler's and the simulator's spaces: identical b, None).
    ``strict_speeds``: lbbsp refuses declared speeds that do not fit ``gpu_types`` (False: it uses
    the catalog's speeds then, for a mix other than the job's).
    """
    s = PlanSpec.from_config(spec)
    custom = plan_fn is not None
    if identical_b is None:
        identical_b = True if custom else wants_identical_b(s, coupled_layers)
    derive = isinstance(speed_factors, str)          # "declared": from spec.speeds (optimal only)
    given = None if isinstance(speed_factors, str) or not speed_factors else list(speed_factors)
    return _KINDS[s.kind].build(BuildArgs(s, list(gpu_types), perf_model, identical_b, given, plan_fn, strict_speeds,
                                          derive))


def job_batch_space(cfg: PlanSpec | JobConfig | Any, gpus: Sequence[str], model: PerfModel,
                    plan_fn: Callable[[int], Plan] | None = None, *, per_rank: bool = False,
                    speed_factors: Sequence[float] | None = None, B_min: int | None = None,
                    B_max: int | None = None) -> BatchSpace:
    """The batch space of a job on ranks ``gpus``: ``make_planner(...).batch_space(B_min, B_max)`` with the
    plan kind (``per_rank``) and the declared ``speed_factors`` given. ``cfg``: a PlanSpec (then give
    ``B_min``/``B_max``) or a config with the planning keys and its ``B_min``/``B_max``.

    ``optimal``: ``optimal_space`` (b from ``micro_batch`` when set; ``per_rank``: per-rank sizes).
    ``lbbsp``: multiples of ``micro_batch`` (1 when unset) planned by ``plan_fn`` (default: LB-BSP's
    proportional split by ``lbbsp_speeds``). Times are ``model.iteration_time`` of the plan on ``gpus``.
    """
    spec = PlanSpec.of_keys(cfg)
    if not spec.changes_B:
        raise ConfigError(f"planner={spec.kind!r} cannot change the batch size; use 'optimal' or 'lbbsp'")
    rng: Any = cfg                                   # a config: its range
    lo = B_min if B_min is not None else int(rng.B_min)
    hi = B_max if B_max is not None else int(rng.B_max)
    one = plan_fn
    fn: PlannerFn | None = None if one is None else (lambda B, factors=None: one(B))
    identical = not per_rank or _KINDS[spec.kind].space_in_micro_batches
    return make_planner(spec, gpus, model, plan_fn=fn, identical_b=identical, speed_factors=speed_factors,
                        strict_speeds=False).batch_space(lo, hi)
