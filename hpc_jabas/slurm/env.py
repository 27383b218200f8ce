"""One typed view of what Slurm tells a process through its environment. Pure (reads a mapping).

Like Lightning's ``SLURMEnvironment`` and submitit's ``JobEnvironment``, this is the one table of Slurm's
variables: every module of hpc_jabas reads them through :class:`SlurmEnv` (tests/test_slurm_env_class.py
checks the source of the others). ``SlurmEnv()`` reads ``os.environ`` at each access (so a variable set
later is seen); ``SlurmEnv(mapping)`` reads that mapping (tests, a job's recorded environment).

The rules, one each:

* job id: ``SLURM_HET_JOB_ID`` (a heterogeneous job: the leader's id, the one squeue, sacct and scancel
  take for the whole job), else ``SLURM_JOB_ID``, else the legacy ``SLURM_JOBID``;
* inside Slurm: a job id is set, or ``SLURMD_NODENAME`` (slurmd started this process);
* batch: inside Slurm and not an interactive ``srun --pty`` step (``SLURM_PTY_PORT``);
* heterogeneous components: ``SLURM_HET_SIZE`` (Slurm < 20.02: ``SLURM_PACK_SIZE``) groups k with
  ``SLURM_JOB_NODELIST_HET_GROUP_k``, ``SLURM_JOB_PARTITION_HET_GROUP_k``, ``SLURM_NTASKS_HET_GROUP_k``
  (``..._PACK_GROUP_k``). A het step's task is not told its component's index, so a rank's component is
  the group whose node list holds its node (``SLURMD_NODENAME``), and its partition that group's (on the
  local Slurm 22.05 cluster a task also sees ``SLURM_JOB_ID`` = the leader's id, no ``SLURM_HET_JOB_ID``,
  and its component's ``SLURM_JOB_PARTITION``: tests/test_slurm_env_class.py, LOCAL_HET_STEP);
* requeue count: ``SLURM_RESTART_COUNT`` (0 on the first run);
* the signals (class constants): ``TIME_LIMIT_SIGNAL`` (hpc-jabas's ``--signal=B:USR1@<lead>``),
  ``REQUEUE_SIGNAL`` (submitit's USR2: checkpoint and requeue), ``STOP_SIGNALS`` (those two and SIGTERM:
  scancel, preemption, the time limit itself), the order of the safe point's agreement vector.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from hpc_jabas.core.config.validate import parse_int
from hpc_jabas.slurm.text import expand_hostlist

#: prefixes of the variables Slurm sets for a job, its steps and its commands (SLURM_CONF aside)
JOB_PREFIXES = ("SLURM_", "SLURMD_", "SBATCH_", "SALLOC_", "SRUN_", "SPANK_")
CONF = "SLURM_CONF"        # names the cluster (slurm.conf), not the job: it passes into a submission


@dataclass(frozen=True)
class HetGroup:
    """One component of a heterogeneous job, as its environment describes it."""

    index: int
    nodelist: str | None
    partition: str | None
    ntasks: int | None


class SlurmEnv:
    """The Slurm job environment of this process (module docstring): ids, nodes, tasks, components."""

    TIME_LIMIT_SIGNAL = signal.SIGUSR1
    REQUEUE_SIGNAL = signal.SIGUSR2
    STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = env

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def _get(self, *names: str) -> str | None:
        """The first of the variables that is set and not empty."""
        env = self.env
        return next((env[n] for n in names if env.get(n)), None)

    def _int(self, *names: str) -> int | None:
        """The first of the variables that is set, as an integer (None: none is set); ConfigError naming it
        when it is not one."""
        env = self.env
        name = next((n for n in names if env.get(n)), None)
        if name is None:
            return None
        return parse_int(env[name], name, where="in the environment")

    # ---- the job ---------------------------------------------------------------------------------
    @property
    def job_id(self) -> str | None:
        """The job's id (a het job's leader id); None outside Slurm."""
        return self._get("SLURM_HET_JOB_ID", "SLURM_JOB_ID", "SLURM_JOBID")

    def is_job(self, job_id: object) -> bool:
        """``job_id`` names this process's job: the het job's leader id or this component's own id."""
        ids = {self.env.get(n) for n in ("SLURM_HET_JOB_ID", "SLURM_JOB_ID", "SLURM_JOBID")} - {None, ""}
        return str(job_id) in ids

    def local_job_id(self) -> str:
        """The job id, or ``local-<pid>`` outside Slurm (a run directory's or a lock's owner)."""
        return self.job_id or f"local-{os.getpid()}"

    @property
    def inside(self) -> bool:
        """This process runs in a Slurm allocation (a batch script, a step, salloc's shell)."""
        return self.job_id is not None or self.node_name is not None

    @property
    def interactive(self) -> bool:
        """An ``srun --pty`` step: a person at a terminal."""
        return "SLURM_PTY_PORT" in self.env

    @property
    def batch(self) -> bool:
        """Inside Slurm and not at an interactive terminal (nobody watches stdout)."""
        return self.inside and not self.interactive

    @property
    def step_id(self) -> str | None:
        """The step: a number, or ``batch`` / ``extern`` / ``interactive`` for Slurm's own steps."""
        return self._get("SLURM_STEP_ID", "SLURM_STEPID")

    @property
    def in_step(self) -> bool:
        """A task of an ``srun`` step (not the batch script, the extern step or salloc's interactive
        shell): it has a rank in the step."""
        return self.step_id not in (None, "batch", "extern", "interactive") and self.procid is not None

    @property
    def step_ntasks(self) -> int | None:
        """The tasks of this step (``SLURM_STEP_NUM_TASKS``), else of the job (``SLURM_NTASKS``)."""
        return self._int("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")

    @property
    def step_nodelist(self) -> str | None:
        return self._get("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")

    @property
    def restart_count(self) -> int:
        """How often Slurm requeued this job (0 on its first run)."""
        return self._int("SLURM_RESTART_COUNT") or 0

    @property
    def conf(self) -> str | None:
        """``SLURM_CONF``: the cluster's slurm.conf when it is not the default one."""
        return self._get(CONF)

    @staticmethod
    def job_variable(name: str) -> bool:
        """A variable Slurm set for the current job or command (a submission from inside a job must not
        inherit it); SLURM_CONF is the cluster's, not the job's."""
        return name != CONF and name.startswith(JOB_PREFIXES)

    # ---- this process ------------------------------------------------------------------------------
    @property
    def node_name(self) -> str | None:
        return self._get("SLURMD_NODENAME")

    @property
    def procid(self) -> int | None:
        """This task's rank in the step (global across a het step's components)."""
        return self._int("SLURM_PROCID")

    @property
    def ntasks(self) -> int | None:
        return self._int("SLURM_NTASKS")

    @property
    def localid(self) -> int | None:
        return self._int("SLURM_LOCALID")

    # ---- nodes, partitions, components --------------------------------------------------------------
    @property
    def nodelist(self) -> str | None:
        return self._get("SLURM_JOB_NODELIST", "SLURM_NODELIST")

    @property
    def partition(self) -> str | None:
        """``SLURM_JOB_PARTITION``: for a het job, not the rank's own component (see :meth:`rank_partition`)."""
        return self._get("SLURM_JOB_PARTITION")

    @property
    def het_size(self) -> int | None:
        """How many components a heterogeneous job has; None for a plain job."""
        return self._int("SLURM_HET_SIZE", "SLURM_PACK_SIZE")

    def het_groups(self) -> list[HetGroup]:
        """The components of a heterogeneous job ([] for a plain job)."""
        return [HetGroup(k, self._get(f"SLURM_JOB_NODELIST_HET_GROUP_{k}", f"SLURM_JOB_NODELIST_PACK_GROUP_{k}"),
                         self._get(f"SLURM_JOB_PARTITION_HET_GROUP_{k}", f"SLURM_JOB_PARTITION_PACK_GROUP_{k}"),
                         self._int(f"SLURM_NTASKS_HET_GROUP_{k}", f"SLURM_NTASKS_PACK_GROUP_{k}"))
                for k in range(self.het_size or 0)]

    @property
    def het_component(self) -> int | None:
        """The component this process runs in: the group whose node list holds its node (None: a plain
        job, or the node is in no group's list)."""
        node = self.node_name
        if not node:
            return None
        return next((g.index for g in self.het_groups() if g.nodelist and node in expand_hostlist(g.nodelist)),
                    None)

    def rank_partition(self) -> str | None:
        """The partition of this process's own component: its het group's, else ``SLURM_JOB_PARTITION``
        unless the job was submitted to several partitions (then the one it runs in is not named)."""
        k = self.het_component
        if k is not None:
            part = self.het_groups()[k].partition
            if part:
                return part
        part = self.partition
        return None if part is None or "," in part else part

    def node_lists(self) -> list[str]:
        """The job's node lists: one per het component (every group the environment lists), else the job's
        one ([] outside a job)."""
        het = ("SLURM_JOB_NODELIST_HET_GROUP_", "SLURM_JOB_NODELIST_PACK_GROUP_")
        lists = [v for k, v in self.env.items() if k.startswith(het)]
        return lists or ([self.nodelist] if self.nodelist else [])

    def nodes(self) -> list[str]:
        """Every node of the job (all components), sorted."""
        return sorted({n for nl in self.node_lists() for n in expand_hostlist(nl)})

    def mix(self) -> dict[str, int]:
        """partition -> tasks of the job (every component of a het job), partitions sorted; a component
        submitted to several partitions is left out."""
        pairs = [(g.partition, g.ntasks) for g in self.het_groups()]
        pairs = pairs or [(self.partition, self.ntasks)]
        out: dict[str, int] = {}
        for part, n in pairs:
            if part and n and "," not in part:
                out[part] = out.get(part, 0) + n
        return dict(sorted(out.items()))
