"""The job's planner: one ``Planner`` protocol, built in one place (``make_planner``). Pure.

A planner turns a global batch B (and the balancing speed factors, or None) into a ``Plan`` and
knows which B it realises on its ranks (``batch_space``). Three kinds, chosen by ``cfg.planner``:

* ``optimal``: the exact planner (identical.py, per_rank.py) on the perf model; the declared
  ``speeds`` become per-rank speed factors of the model (``perfmodel.declared_speed_factors``;
  refused for a measured profile), balancing factors multiply them.
* ``lbbsp``: B split in proportion to the ranks' speeds (``lbbsp_speeds``: the declared ones when
  they fit the ranks, else the catalog's), in micro-batches of ``micro_batch`` (identical b) or in
  samples, each rank's in the fewest micro-batches its memory holds (per-rank b).
* ``fixed``: the plan given in ``cfg.plan``; it cannot change B. Declared speeds are refused unless
  the ranks are emulated (then the emulator runs each rank at its declared speed).

**Kind of plan** (docs/invariants.md, invariant 2). Identical b (IIDP) when the model has
batch-coupled layers (``coupled_layers``: the runtime names them, runtime/batchnorm.py), when
``micro_batch`` pins the size, or when ``identical_micro_batch = "true"``; otherwise each rank its
own micro-batch size.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from hpc_jabas.core import gpus as catalog
from hpc_jabas.core.perfmodel import PerfModel, declared_speed_factors
from hpc_jabas.core.planning.identical import plan_batch
from hpc_jabas.core.planning.plan import Plan, proportional_plan, proportional_samples_plan
from hpc_jabas.core.planning.space import BatchSpace, optimal_space, planner_space
from hpc_jabas.errors import ConfigError

log = logging.getLogger(__name__)

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


class Planner(Protocol):
    """What the trainer, the controller and the auto-scaler use of a planner."""

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


def wants_identical_b(cfg: Any, coupled_layers: Sequence[str] = ()) -> bool:
    """The kind of plan (module docstring): True for identical b, False for per-rank sizes."""
    mode = getattr(cfg, "identical_micro_batch", "auto")
    if mode == "false":
        if cfg.micro_batch:
            raise ConfigError(f"identical_micro_batch='false' contradicts micro_batch={cfg.micro_batch}, which "
                              "pins one size on every rank; drop one of them")
        if coupled_layers:
            log.warning("identical_micro_batch='false' with batch-coupled layers (%s): their statistics "
                        "differ between micro-batch sizes", ", ".join(coupled_layers))
        return False
    return mode == "true" or bool(cfg.micro_batch) or bool(coupled_layers)


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


class _JobPlanner:
    """The parts every kind shares: the ranks, the perf model (built on first use), the plan kind,
    and an optional planner function that replaces the kind's own rule (the user's ``planner_fn``)."""

    kind = ""

    def __init__(self, gpus: Sequence[str], perf_model: ModelSource, identical_b: bool,
                 declared: list[float] | None, plan_fn: PlannerFn | None) -> None:
        self.gpus = list(gpus)
        self._model = perf_model
        self._identical_b = identical_b
        self._declared = declared
        self._plan_fn = plan_fn

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


class FixedPlanner(_JobPlanner):
    """The plan of ``cfg.plan`` for every B."""

    kind = "fixed"

    def __init__(self, fixed: Plan | None, *args: Any) -> None:
        super().__init__(*args)
        self.fixed = fixed

    def _plan(self, B: int, factors: list[float] | None) -> Plan:
        assert self.fixed is not None
        return self.fixed


class LbbspPlanner(_JobPlanner):
    """LB-BSP: B split in proportion to ``speeds`` (times the balancing factors)."""

    kind = "lbbsp"

    def __init__(self, b: int, speeds: list[float] | None, *args: Any) -> None:
        super().__init__(*args)
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

    def __init__(self, micro_batch: int | None, min_micro_batch: int | None, *args: Any) -> None:
        super().__init__(*args)
        self.micro_batch = micro_batch
        self.min_micro_batch = min_micro_batch

    @functools.cached_property
    def cands(self) -> list[int] | None:
        """candidate_sizes() on this planner's ranks (computed once: it reads the perf model)."""
        return candidate_sizes(self.micro_batch, self.min_micro_batch, self.gpus, self.model())

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


def make_planner(cfg: Any, gpu_types: Sequence[str], perf_model: ModelSource, coupled_layers: Sequence[str] = (),
                 *, plan_fn: PlannerFn | None = None, identical_b: bool | None = None,
                 speed_factors: Sequence[float] | None | Literal["declared"] = "declared",
                 strict_speeds: bool = True) -> Planner:
    """The job's planner (module docstring): ``cfg`` gives planner, micro_batch, speeds, plan,
    identical_micro_batch and emulate; ``gpu_types`` one type per rank; ``perf_model`` the model or a
    function that builds it (called only by the kinds that need it).

    ``coupled_layers``: the model's batch-coupled layer names (they make plans identical-b).
    ``plan_fn``: a planner function ``(B, factors) -> Plan`` that replaces the kind's rule (the
    user's own); the kind then only gives the batch space, no check runs, plans count as identical b
    and no declared factors apply unless given. ``identical_b`` / ``speed_factors``: the plan kind and
    the declared speed factors when already known (the controller's and the auto-scaler's spaces).
    ``strict_speeds``: lbbsp refuses declared speeds that do not fit ``gpu_types`` (False: it uses
    the catalog's speeds then, for a mix other than the job's).
    """
    kind = getattr(cfg, "planner", "optimal")
    mb = getattr(cfg, "micro_batch", None)
    types = list(gpu_types)
    custom = plan_fn is not None
    if identical_b is None:
        identical_b = True if custom else wants_identical_b(cfg, coupled_layers)
    derive = isinstance(speed_factors, str)          # "declared": from cfg.speeds (optimal only)
    given = None if isinstance(speed_factors, str) or not speed_factors else list(speed_factors)
    if kind == "fixed":
        fixed = None
        if not custom:
            assert cfg.plan, "JobConfig.validate() requires a plan for planner='fixed'"
            if cfg.speeds and not getattr(cfg, "emulate", False):
                raise ConfigError(f"speeds={cfg.speeds} are not used by planner='fixed' (its plan is given); "
                                  "drop speeds, or use planner='optimal' or 'lbbsp'")
            fixed = Plan.parse(cfg.plan)
        return FixedPlanner(fixed, types, perf_model, identical_b, None, plan_fn)
    if kind == "lbbsp":
        speeds = None if custom else lbbsp_speeds(types, getattr(cfg, "speeds", None), strict=strict_speeds)
        return LbbspPlanner(mb or getattr(cfg, "min_micro_batch", None) or 1, speeds, types, perf_model, identical_b,
                            given, plan_fn)
    if derive and not custom:
        pm = perf_model if isinstance(perf_model, PerfModel) else perf_model()
        given = declared_speed_factors(getattr(cfg, "speeds", None), types, pm)
    return OptimalPlanner(mb, getattr(cfg, "min_micro_batch", None), types, perf_model, identical_b, given, plan_fn)


def job_batch_space(cfg: Any, gpus: Sequence[str], model: PerfModel, plan_fn: Callable[[int], Plan] | None = None,
                    *, per_rank: bool = False, speed_factors: Sequence[float] | None = None) -> BatchSpace:
    """The batch space of a job (``cfg``: planner, micro_batch, B_min, B_max, speeds) on ranks ``gpus``:
    ``make_planner(...).batch_space(cfg.B_min, cfg.B_max)`` with the plan kind (``per_rank``) and the
    declared ``speed_factors`` given.

    ``optimal``: ``optimal_space`` (b from ``micro_batch`` when set; ``per_rank``: per-rank sizes).
    ``lbbsp``: multiples of ``micro_batch`` (1 when unset) planned by ``plan_fn`` (default: LB-BSP's
    proportional split by ``lbbsp_speeds``). Times are ``model.iteration_time`` of the plan on ``gpus``.
    """
    kind = getattr(cfg, "planner", "optimal")
    if kind not in ("optimal", "lbbsp"):
        raise ConfigError(f"planner={kind!r} cannot change the batch size; use 'optimal' or 'lbbsp'")
    one = plan_fn
    fn: PlannerFn | None = None if one is None else (lambda B, factors=None: one(B))
    # lbbsp's default plan is the identical-b split in micro-batch units whatever per_rank says
    identical = not per_rank or kind == "lbbsp"
    return make_planner(cfg, gpus, model, plan_fn=fn, identical_b=identical, speed_factors=speed_factors,
                        strict_speeds=False).batch_space(cfg.B_min, cfg.B_max)
