"""The job's planner function: which planner, which kind of plan, and the declared speeds.

``default_planner(cfg, model, gpu_types, perf_model)`` returns ``planner_fn(B, factors)`` (factors:
the balancing speed factors, or None), whether plans keep one micro-batch size on every rank, and the
speed factors of the declared ``speeds``:

* **Kind of plan** (docs/invariants.md, invariant 2). Identical b (IIDP) when the model has batch-coupled
  layers (any ``torch.nn.modules.batchnorm._BatchNorm``), when ``micro_batch`` pins the size, or
  when ``identical_micro_batch = "true"``; otherwise each rank its own micro-batch size.
* **Declared speeds** are used by every planner that plans: ``optimal`` turns them into per-rank speed
  factors of the perf model (``perfmodel.declared_speed_factors``; refused for a measured profile),
  ``lbbsp`` splits B in proportion to them; ``fixed`` cannot use them and refuses them unless the ranks
  are emulated (then the emulator runs each rank at its declared speed).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpc_jabas.core.plan import Plan
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger

log = get_logger(__name__)

PlannerFn = Callable[[int, "list[float] | None"], Plan]


def batch_coupled_layers(model: torch.nn.Module) -> list[str]:
    """Class names of the layers whose output depends on the batch's composition (BatchNorm)."""
    return sorted({type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)})


def wants_identical_b(cfg: Any, model: torch.nn.Module) -> bool:
    mode = getattr(cfg, "identical_micro_batch", "auto")
    coupled = batch_coupled_layers(model)
    if mode == "false":
        if cfg.micro_batch:
            raise ConfigError(f"identical_micro_batch='false' contradicts micro_batch={cfg.micro_batch}, which "
                              "pins one size on every rank; drop one of them")
        if coupled:
            log.warning("identical_micro_batch='false' with batch-coupled layers (%s): their statistics "
                        "differ between micro-batch sizes", ", ".join(coupled))
        return False
    return mode == "true" or bool(cfg.micro_batch) or bool(coupled)


def default_planner(cfg: Any, model: torch.nn.Module, gpu_types: Sequence[str],
                    perf_model: Callable[[], Any]) -> tuple[PlannerFn, bool, list[float] | None]:
    """(planner_fn, identical_b, declared speed factors) for the job (module docstring)."""
    identical = wants_identical_b(cfg, model)
    if cfg.planner == "fixed":
        assert cfg.plan, "JobConfig.validate() requires a plan for planner='fixed'"
        if cfg.speeds and not cfg.emulate:
            raise ConfigError(f"speeds={cfg.speeds} are not used by planner='fixed' (its plan is given); "
                              "drop speeds, or use planner='optimal' or 'lbbsp'")
        fixed = Plan.parse(cfg.plan)

        def fixed_plan(B: int, factors: list[float] | None = None) -> Plan:
            return fixed
        return fixed_plan, identical, None
    pm = perf_model()
    types = list(gpu_types)
    if cfg.planner == "lbbsp":
        from hpc_jabas.core import gpus
        from hpc_jabas.core.plan import proportional_plan, proportional_samples_plan
        base = cfg.speeds or [gpus.get(g).relative_speed for g in types]
        b = cfg.micro_batch or 1
        caps = [pm.profile(g).max_b for g in types]

        def lbbsp(B: int, factors: list[float] | None = None) -> Plan:
            sp = [s * (factors[i] if factors else 1.0) for i, s in enumerate(base)]
            return proportional_plan(B, b, sp) if identical else proportional_samples_plan(B, sp, caps)
        return lbbsp, identical, None
    from hpc_jabas.core.perfmodel import declared_speed_factors
    from hpc_jabas.core.planner import plan_batch
    cands = [cfg.micro_batch] if cfg.micro_batch else None
    declared = declared_speed_factors(cfg.speeds, types, pm)

    def optimal(B: int, factors: list[float] | None = None) -> Plan:
        sf = factors
        if declared is not None:
            sf = [d * (factors[i] if factors else 1.0) for i, d in enumerate(declared)]
        return plan_batch(B, types, pm, b_candidates=cands, speed_factors=sf, per_rank=not identical)
    return optimal, identical, declared
