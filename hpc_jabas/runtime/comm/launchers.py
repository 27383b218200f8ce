"""How this process was started: one class per launcher (Lightning's ClusterEnvironment, submitit's table of
scheduler variables), the one place that reads a launcher's variables.

Each class answers ``detect(env)`` (whether that launcher started this process) and, built on the
environment, gives ``rank``, ``local_rank``, ``world_size``, ``master_addr`` and ``master_port`` (None when
the launcher does not say where rank 0 listens). :func:`detect` returns the first class whose ``detect`` holds,
in the order of :data:`ORDER`:

1. :class:`Torchrun` (``TORCHELASTIC_RUN_ID``, or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT all set): torchrun
   runs inside an srun step or an mpirun rank as often as alone, and then the variables of the launcher
   around it (SLURM_PROCID, OMPI_COMM_WORLD_RANK) number the torchrun agents, not its workers: the innermost
   launcher goes first.
2. :class:`OpenMPI` (``OMPI_COMM_WORLD_RANK``): mpirun in a Slurm allocation inherits the allocation's
   SLURM_* variables (and starts its daemons with srun), so Open MPI's numbering goes before srun's; a
   horovodrun that runs on mpirun sets both Horovod's and Open MPI's, which agree.
3. :class:`Horovodrun` (``HOROVOD_RANK`` with ``HOROVOD_SIZE`` > 1: horovodrun --gloo): inside an allocation
   too, so before srun.
4. :class:`Srun` (a task of an srun step, through :class:`~hpc_jabas.slurm.env.SlurmEnv`): srun with an MPI
   plugin (``--mpi=pmi2``) sets PMI_RANK/PMI_SIZE as well, and srun's own variables say more (the step's
   node list gives rank 0's node without MPI), so srun goes before the bare PMI variables.
5. :class:`MpichPmi` (``PMI_RANK`` and ``PMI_SIZE``: MPICH's or Intel MPI's mpiexec).
6. :class:`Single`: none of them, a world of one rank.

A variable that should be an integer and is not is one line (:class:`~hpc_jabas.errors.ConfigError`). Reading
is lazy: a class is built on a mapping (``os.environ`` when None) and reads it when asked. No torch here: the
package's import stays light (hpc_jabas/exits.py asks for the rank while it reports an error).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

from hpc_jabas.core.config.validate import parse_int
from hpc_jabas.slurm.env import SlurmEnv

#: the first port an srun step's rank 0 may listen on (without MPI): the port is derived from the job and step ids
SRUN_PORT_BASE = 20000
SRUN_PORT_SPAN = 20000


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """``env[name]`` as an integer >= 0 (``default`` when unset or empty, if given); else one line."""
    v = (env.get(name) or "").strip()
    if not v and default is not None:
        return default
    return parse_int(v, name, lo=0, where="in the environment")


class Launcher:
    """One launcher's view of the environment (the base: a single process)."""

    #: the launcher's name, as the logs and errors say it
    name: ClassVar[str] = "single"

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env: Mapping[str, str] = os.environ if env is None else env

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        raise NotImplementedError

    @property
    def rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def master_addr(self) -> str | None:
        return None

    @property
    def master_port(self) -> int | None:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"


class _Numbered(Launcher):
    """A launcher that numbers its processes in three variables: the rank, the local rank (0 when unset) and
    the world size, named by the subclass."""

    RANK: ClassVar[str]
    LOCAL_RANK: ClassVar[str]
    SIZE: ClassVar[str]

    @property
    def rank(self) -> int:
        return _int(self.env, self.RANK)

    @property
    def local_rank(self) -> int:
        return _int(self.env, self.LOCAL_RANK, 0)

    @property
    def world_size(self) -> int:
        return _int(self.env, self.SIZE)


class Torchrun(_Numbered):
    """torchrun (torch.distributed.run) or any launcher that sets torch's env:// variables."""

    name = "torchrun"
    RANK, LOCAL_RANK, SIZE = "RANK", "LOCAL_RANK", "WORLD_SIZE"
    _ENV_INIT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "TORCHELASTIC_RUN_ID" in env or all(k in env for k in cls._ENV_INIT)

    @property
    def master_addr(self) -> str | None:
        return self.env.get("MASTER_ADDR") or None

    @property
    def master_port(self) -> int | None:
        return _int(self.env, "MASTER_PORT") if self.env.get("MASTER_PORT") else None

    @property
    def error_file(self) -> str | None:
        """Where torchrun reads a failed worker's error (``TORCHELASTIC_ERROR_FILE``)."""
        return self.env.get("TORCHELASTIC_ERROR_FILE") or None

    @property
    def max_restarts(self) -> int | None:
        """torchrun's ``--max-restarts`` (``TORCHELASTIC_MAX_RESTARTS``; None: not torchrun's agent)."""
        return _int(self.env, "TORCHELASTIC_MAX_RESTARTS") if self.env.get("TORCHELASTIC_MAX_RESTARTS") else None

    @property
    def run_id(self) -> str:
        """torchrun's run id (``TORCHELASTIC_RUN_ID``; "" when not torchrun's agent)."""
        return self.env.get("TORCHELASTIC_RUN_ID") or ""

    @property
    def agent_store(self) -> bool:
        """Whether the store the workers meet at is hosted by torchrun's agent (``TORCHELASTIC_USE_AGENT_STORE``),
        not by rank 0."""
        return (self.env.get("TORCHELASTIC_USE_AGENT_STORE") or "").lower() == "true"

    @property
    def restart_count(self) -> int:
        """How many times torchrun restarted the workers so far (``TORCHELASTIC_RESTART_COUNT``)."""
        return _int(self.env, "TORCHELASTIC_RESTART_COUNT", 0)


class OpenMPI(_Numbered):
    """Open MPI's mpirun (or mpiexec, prterun): rank 0's address is agreed over MPI, not in the environment."""

    name = "mpirun"
    RANK, LOCAL_RANK, SIZE = "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "OMPI_COMM_WORLD_RANK" in env


class Horovodrun(_Numbered):
    """horovodrun --gloo (Horovod's own launcher without MPI). Its rendezvous is an HTTP server of Horovod's
    (HOROVOD_GLOO_RENDEZVOUS_ADDR), not rank 0: ``master_addr``/``master_port`` are None."""

    name = "horovodrun"
    RANK, LOCAL_RANK, SIZE = "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "HOROVOD_RANK" in env and env.get("HOROVOD_SIZE", "1").strip() not in ("", "1")


class Srun(Launcher):
    """A task of a Slurm srun step (SlurmEnv reads Slurm's variables). Rank 0 runs on the step's first node
    (block distribution) and listens on a port derived from the job and step ids; a heterogeneous step's
    components are one world, whose rank 0's node the environment does not tell (``master_addr`` None)."""

    name = "srun"

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        super().__init__(env)
        self.slurm = SlurmEnv(self.env)

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return SlurmEnv(env).in_step

    @property
    def rank(self) -> int:
        return self.slurm.procid or 0

    @property
    def local_rank(self) -> int:
        return self.slurm.localid or 0

    @property
    def world_size(self) -> int:
        return self.slurm.step_ntasks or 0

    @property
    def heterogeneous(self) -> bool:
        return self.slurm.het_size is not None

    @property
    def mpi_plugin(self) -> bool:
        """srun set up MPI (``--mpi=pmix`` or ``pmi2``): mpi4py may start (without a plugin MPI_Init aborts)."""
        return any(k in self.env for k in ("PMIX_RANK", "PMI_FD"))

    @property
    def master_addr(self) -> str | None:
        nodes = self.slurm.step_nodelist or ""
        if not nodes or self.heterogeneous:
            return None
        from hpc_jabas.slurm.text import expand_hostlist
        first = expand_hostlist(nodes)
        return first[0] if first else None

    @property
    def master_port(self) -> int | None:
        job = int(self.slurm.job_id or 0)          # a het job's leader id: the same in every component
        sid = self.slurm.step_id or ""
        step = int(sid) if sid.isdigit() else 0
        return SRUN_PORT_BASE + (job * 31 + step) % SRUN_PORT_SPAN


class MpichPmi(_Numbered):
    """MPICH's or Intel MPI's mpiexec (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID): rank 0's address over MPI."""

    name = "mpirun"
    RANK, LOCAL_RANK, SIZE = "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return "PMI_RANK" in env and "PMI_SIZE" in env


class Single(Launcher):
    """No launcher: one process, a world of one rank."""

    name = "single"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return True


#: the detection order (the module docstring says why)
ORDER: tuple[type[Launcher], ...] = (Torchrun, OpenMPI, Horovodrun, Srun, MpichPmi, Single)


_in_chain = False


def set_in_chain(on: bool = True) -> None:
    """Said by the Slurm chain's job entry point (runtime/job/launch.py) before the backend starts: a job that fails
    is resubmitted by the chain."""
    global _in_chain
    _in_chain = bool(on)


def what_next(env: Mapping[str, str] | None = None) -> str:
    """What happens after this run fails (a rank gone or hung), as the error line's last words: the Slurm chain
    resubmits it, torchrun restarts its workers (``--max-restarts`` left), or nothing does here."""
    rerun = "rerun the same command to resume from the last checkpoint"
    if _in_chain:
        return "the Slurm chain resubmits the job, which resumes from the last checkpoint"
    ln = detect(env)
    if isinstance(ln, Torchrun) and ln.max_restarts is not None:
        left = ln.max_restarts - ln.restart_count
        if left > 0:
            return (f"torchrun restarts the workers ({left} of --max-restarts={ln.max_restarts} left), which "
                    "resume from the last checkpoint")
        if ln.max_restarts > 0:
            return f"torchrun's --max-restarts={ln.max_restarts} are used up: {rerun}"
        return f"nothing restarts it here (torchrun --max-restarts=0): {rerun}"
    return f"nothing restarts it here: {rerun}"


def detect(env: Mapping[str, str] | None = None) -> Launcher:
    """The launcher that started this process (the first of :data:`ORDER` that detects itself in ``env``)."""
    env = os.environ if env is None else env
    cls = next(c for c in ORDER if c.detect(env))
    return cls(env)
