"""The Trainer's parts built from its configuration (docs/design.md, section 1): the configuration resolved, the
planner, the default controller, the emulated GPU of this rank. Pure composition: no collective runs here."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning import Planner
from hpc_jabas.core.planning.planner import PlanSpec, make_planner
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.controller import AdaptiveController
from hpc_jabas.runtime.emulate import Emulator, Slowdown
from hpc_jabas.runtime.hooks import Controller
from hpc_jabas.runtime.resolve import ResolvedConfig, resolve_config
from hpc_jabas.runtime.scriptcli import resolve_cli


def resolve(cfg: JobConfig, world: World, model: torch.nn.Module, feed: Any, planner_fn: Callable | None
            ) -> ResolvedConfig:
    """The configuration every part reads, resolved once and frozen: the script's command line (batch_per_rank,
    runtime/scriptcli.py), then what the job leaves to the model and the data (runtime/resolve.py)."""
    n = len(feed.dataset)
    return resolve_config(resolve_cli(cfg, world, n), model, n, world.rank, planner_fn is not None)


def planner(resolved: ResolvedConfig, gpu_types: list[str], perf_model: Callable[[], PerfModel],
            planner_fn: Callable | None) -> Planner:
    """The job's planner (core/planning/planner.py ``make_planner``, from the config's PlanSpec): its identical or
    per-rank b, declared speeds used; the user's ``planner_fn`` (one b on every rank assumed) replaces its plans,
    the kind still gives the batch space."""
    spec = PlanSpec.from_config(resolved.cfg)   # the resolved smallest b: batch-coupled layers' (runtime/resolve.py)
    if planner_fn is not None:
        return make_planner(spec, gpu_types, perf_model, plan_fn=planner_fn)
    return make_planner(spec, gpu_types, perf_model, resolved.coupled)


def default_controller(cfg: JobConfig, planner: Planner) -> Controller | None:
    """The adaptive controller when the config adapts B or balances; None otherwise."""
    if cfg.policy == "fixed" and cfg.balance == "off":
        return None
    if not planner.spec.changes_B:
        raise ConfigError(f"policy={cfg.policy!r} / balance={cfg.balance!r} re-plan, which a "
                          "fixed plan cannot follow; use planner='optimal' or 'lbbsp'")
    return AdaptiveController(cfg)


def emulator(cfg: JobConfig, gpu_types: list[str], rank: int) -> Emulator | None:
    """This rank's emulated GPU (config key ``emulate``): its type's speed and slowdown; None when not emulating."""
    if not cfg.emulate:
        return None
    speed = cfg.speeds[rank] if cfg.speeds else None
    sd = cfg.slowdown.get(rank)
    slow = Slowdown.parse(sd) if isinstance(sd, str) else sd
    return Emulator(gpu_types[rank], speed=speed, base_s=cfg.emulate_base_s, per_sample_s=cfg.emulate_per_sample_s,
                    slowdown=slow, rank=rank)
