"""The Trainer's configuration, resolved once and frozen: :func:`resolve_config`.

What the user's JobConfig leaves to the job is decided here, in this order, on a copy (the caller's JobConfig
is not changed), before the Trainer builds its parts:

1. ``run_dir`` unset: the directory of this script and configuration (core/config/sections.py ``default_run_dir``);
2. a model with batch-coupled layers (BatchNorm) and neither ``micro_batch`` nor ``min_micro_batch``:
   ``min_micro_batch`` is the coupled minimum (core/planning/planner.py ``COUPLED_MIN_MICRO_BATCH``), unless the
   user's ``planner_fn`` makes the plans;
3. an adaptive policy without ``batch_min``/``batch_max``: the range it can move in (core/adaptive/policy.py
   ``default_batch_range``, which reads the smallest micro-batch resolved in 2).

The result is frozen (``JobConfig.frozen``): every part of the Trainer reads the same configuration, whatever
order its methods are called in, and an assignment to it raises.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpc_jabas.core.adaptive.policy import canonical_policy, default_batch_range, lr_rule_name
from hpc_jabas.core.config.sections import JobConfig, default_run_dir
from hpc_jabas.core.planning.planner import COUPLED_MIN_MICRO_BATCH
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.batchnorm import batch_coupled_layers
from hpc_jabas.runtime.comm.exits import process_rank

log = get_logger(__name__)


@dataclass(frozen=True)
class ResolvedConfig:
    """The Trainer's configuration (frozen) and what was resolved with it."""
    cfg: JobConfig
    coupled: tuple[str, ...]               # the model's batch-coupled layer classes (BatchNorm)
    batch_range: dict[str, Any] | None     # the adaptive range given here (None: the config's own, or fixed)

    @property
    def min_split(self) -> int:
        """The smallest half of a measuring iteration's single micro-batch (core/planning/sampler.py
        ``split_single_micro``):
        with batch-coupled layers, at least the minimum micro-batch."""
        if not self.coupled:
            return 1
        return self.cfg.micro_batch or self.cfg.min_micro_batch or COUPLED_MIN_MICRO_BATCH

    @property
    def scale_invariant(self) -> bool:
        """AdaScale: progress in scale-invariant iterations (a per-iteration scheduler steps lr_scale times)."""
        cfg = self.cfg
        return cfg.policy != "fixed" and lr_rule_name(cfg.lr_rule, canonical_policy(cfg.policy)) == "adascale"


def _script() -> str:
    return str(Path(sys.argv[0]).resolve()) if sys.argv and sys.argv[0] not in ("", "-c") else "python"


def resolve_config(config: JobConfig, model: torch.nn.Module, samples_per_epoch: int, rank: int,
                   custom_planner: bool = False) -> ResolvedConfig:
    """``config`` (validated) resolved for this model and dataset (see the module's docstring), frozen; each
    choice said once (rank 0). ``custom_planner``: the user's ``planner_fn`` makes the plans."""
    changes: dict[str, Any] = {}
    if config.run_dir is None:              # a default unique to the script and its configuration
        changes["run_dir"] = default_run_dir(config, _script())
        if process_rank() == 0:             # before the backend starts: the launcher's rank
            log.info("run_dir %s (this script and configuration; --run-dir to choose)", changes["run_dir"])
    coupled = tuple(batch_coupled_layers(model))
    if coupled and not custom_planner:
        if config.identical_micro_batch == "false":
            log.warning("identical_micro_batch='false' with batch-coupled layers (%s): their statistics "
                        "differ between micro-batch sizes", ", ".join(coupled))
        if config.min_micro_batch is None and not config.micro_batch:
            # BatchNorm's statistics come from each micro-batch: the planner, the controller's batch space and
            # the auto-scaler read the job's smallest b from the trainer's config (core/planning/planner.py)
            changes["min_micro_batch"] = COUPLED_MIN_MICRO_BATCH
    cfg = config.replace(**changes)
    batch_range = None
    if cfg.policy != "fixed" and (cfg.batch_min is None or cfg.batch_max is None):
        rng = default_batch_range(cfg.policy, cfg.batch, cfg.batch_min, cfg.batch_max,
                                  samples_per_epoch=samples_per_epoch,
                                  min_micro_batch=cfg.micro_batch or cfg.min_micro_batch or 1)
        if rng is not None:
            cfg.batch_min, cfg.batch_max = rng.lo, rng.hi
            batch_range = rng.to_dict()
            if rank == 0:
                log.info("%s", rng.rule)
    return ResolvedConfig(cfg.frozen(), coupled, batch_range)
