"""What the Trainer does with the script's own command line (core/config/sections.py ``add_arguments``): the lines about
the script's flags that hpc-jabas does not read (the config's ``notes``), and a per-rank batch (``batch_per_rank``,
DDP's and Horovod's habit) made the global batch of this job's ranks, each said once, by rank 0."""
from __future__ import annotations

from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.comm.world import World

log = get_logger(__name__)


def resolve_cli(cfg: JobConfig, world: World, n_samples: int) -> JobConfig:
    """``cfg`` with ``batch`` = ``batch_per_rank`` x the rank count when that is set (validated again); the
    config's notes logged on rank 0. A per-rank batch whose global batch exceeds the dataset is one ConfigError
    line naming both."""
    if world.rank == 0:
        for note in cfg.notes:
            log.info("%s", note)
    per = cfg.batch_per_rank
    if per is None:
        return cfg
    B = per * world.size
    ranks = f"{world.size} rank{'s' if world.size != 1 else ''}"
    if B > n_samples:
        raise ConfigError(f"batch_per_rank={per} x {ranks} = a global batch of {B}, larger than the dataset "
                          f"({n_samples} samples): one iteration cannot hold more samples than an epoch; give "
                          f"{cfg.give('batch_per_rank', max(1, n_samples // world.size))} or less")
    if world.rank == 0:
        log.info("%s %d is each rank's batch: the global batch B = %d x %s = %d (%s %d gives it directly)",
                 cfg.flag_name("batch_per_rank"), per, per, ranks, B, cfg.flag_name("batch"), B)
    return cfg.replace(batch=B, batch_per_rank=None).validate()
