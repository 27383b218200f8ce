"""Where the job runs: ranks, this rank's device, the GPU type of every rank, and where the types came from.

``World`` is a plain frozen value: a test builds one with its constructor, no collective needed.
``World.detect()`` builds the real one on the job's world, whichever backend runs it: the rank facts from
``runtime/comm/seam.py`` (the one seam of every collective: Horovod or torch.distributed, docs/backends.md) and one
allgather of each rank's GPU type, node and device.

A rank's GPU type, in this order (docs/design.md, section 1):

1. ``"flag"``: the ``gpu_types`` key or flag (or the Trainer's ``gpu_types=`` argument), one per rank;
2. ``"slurm"``: under Slurm, the rank's partition or its node's typed GRES (``slurm/cluster.rank_gpu_type``);
3. ``"cuda"``: the name of the rank's CUDA device, when the catalog knows it;
4. ``"emulation"`` (``--emulate``) or ``"default"``: a V100, the catalog's reference type.

``source`` is the ranks' common source, or ``"mixed"`` when they differ. Everything here but
``detect`` is pure: no torch, no Horovod, no Slurm command.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from hpc_jabas.core.config import gpus
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.slurm.env import SlurmEnv

log = get_logger(__name__)

GpuSource = Literal["flag", "slurm", "cuda", "emulation", "default", "mixed"]
SOURCES: tuple[str, ...] = get_args(GpuSource)
DEFAULT_TYPE = gpus.REFERENCE


@dataclass(frozen=True)
class World:
    """rank of size ranks; ``gpu_types[i]``: rank i's GPU type; ``nodes``/``devices``: per rank, when known."""

    rank: int
    size: int
    gpu_types: tuple[str, ...]
    source: GpuSource = "flag"
    local_rank: int = 0
    device: str = "cpu"
    nodes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    emulated: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_types", tuple(self.gpu_types))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "devices", tuple(self.devices))
        if not (isinstance(self.size, int) and self.size >= 1):
            raise ConfigError(f"world size {self.size!r} is invalid; it must be an integer >= 1")
        if not (isinstance(self.rank, int) and 0 <= self.rank < self.size):
            raise ConfigError(f"rank {self.rank!r} is invalid for {self.size} ranks; valid: 0..{self.size - 1}")
        if len(self.gpu_types) != self.size:
            raise ConfigError(f"gpu_types lists {len(self.gpu_types)} types but the job has {self.size} ranks; "
                              "give one type per rank")
        for name, per_rank in (("nodes", self.nodes), ("devices", self.devices)):
            if per_rank and len(per_rank) != self.size:
                raise ConfigError(f"{name} lists {len(per_rank)} entries for {self.size} ranks")
        if self.source not in SOURCES:
            raise ConfigError(f"gpu type source {self.source!r} is unknown; valid: {', '.join(SOURCES)}")

    @property
    def gpu_type(self) -> str:
        """This rank's GPU type."""
        return self.gpu_types[self.rank]

    @property
    def node(self) -> str:
        return self.nodes[self.rank] if self.nodes else node_name()

    def describe(self, rank: int | None = None) -> str:
        """One line for a rank (default: this one), e.g. ``rank 2/3 node=n1 gpu=v100 device=cpu(emulated v100)``;
        a CPU rank whose type nothing named (no flag, no Slurm, no ``--emulate``) names no GPU type."""
        r = self.rank if rank is None else rank
        node = self.nodes[r] if self.nodes else (self.node if r == self.rank else "?")
        dev = self.devices[r] if self.devices else (self.device if r == self.rank else "?")
        if self.emulated:
            dev = f"{dev}(emulated {self.gpu_types[r]})"
        elif self.source == "default" and str(dev).startswith("cpu"):      # no GPU, none named: none said
            return f"rank {r}/{self.size} node={node} device={dev}"
        return f"rank {r}/{self.size} node={node} gpu={self.gpu_types[r]} device={dev}"

    def ranks(self) -> list[dict[str, Any]]:
        """Per rank: rank, node, gpu, device (the start record of metrics.jsonl)."""
        return [{"rank": r, "node": self.nodes[r] if self.nodes else None, "gpu": self.gpu_types[r],
                 "device": self.describe(r).rsplit("device=", 1)[1]} for r in range(self.size)]

    @classmethod
    def detect(cls, gpu_types: Sequence[str] | None = None, *, emulate: bool = False,
               env: Mapping[str, str] | None = None) -> World:
        """The world of this job (collective: every rank calls it). ``gpu_types``: the flag's types."""
        import torch

        from hpc_jabas.runtime.comm import seam as comm
        comm.init()
        env = os.environ if env is None else env
        rank, size = comm.rank(), comm.size()
        flag = check_gpu_types(gpu_types, size) if gpu_types else None
        dev = comm.device()
        if flag is not None:
            mine, src = flag[rank], "flag"
        else:
            cuda = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
            mine, src = local_gpu_type(env, cuda_name=cuda, emulate=emulate, rank=rank)
        rows = comm.allgather_object({"gpu": mine, "source": src, "node": node_name(env), "device": str(dev)},
                                     name="hj.types")
        return cls(rank=rank, size=size, gpu_types=tuple(r["gpu"] for r in rows),
                   source=combine_sources(r["source"] for r in rows), local_rank=comm.local_rank(),
                   device=str(dev), nodes=tuple(r["node"] for r in rows), devices=tuple(r["device"] for r in rows),
                   emulated=bool(emulate))


# ---- the pure parts ------------------------------------------------------------------------------------
def check_gpu_types(types: Sequence[str], size: int) -> list[str]:
    """Catalog keys of the flag's types, one per rank (ConfigError naming the count or the unknown type)."""
    out = [gpus.normalize(g) for g in types]
    if len(out) != size:
        raise ConfigError(f"gpu_types lists {len(out)} types but the job has {size} ranks; give one type per rank")
    return out


def gpu_type_of_device_name(name: str) -> str | None:
    """Catalog key of a CUDA device name ("NVIDIA A100-SXM4-40GB" -> "a100"); None when no part of it is one.

    The whole name, then pairs of adjacent words ("RTX 3090", "TITAN RTX", "RTX A6000"), then single words:
    a pair is tried first so that the "rtx" alias (an RTX 2060) does not take an RTX 3090 or a TITAN RTX."""
    words = name.replace("-", " ").split()
    for cand in [name] + [" ".join(words[i:i + 2]) for i in range(len(words) - 1)] + words:
        try:
            return gpus.normalize(cand)
        except ConfigError:
            continue
    return None


def node_name(env: Mapping[str, str] | None = None) -> str:
    """Slurm's name of this node (``SLURMD_NODENAME``), else the host name."""
    return SlurmEnv(env).node_name or socket.gethostname()


def local_gpu_type(env: Mapping[str, str], cuda_name: str | None = None, emulate: bool = False, rank: int = 0,
                   slurm_type: Callable[[Mapping[str, str]], str | None] | None = None) -> tuple[str, GpuSource]:
    """(type, source) of this rank without the flag: Slurm, then the CUDA device name, then a V100.

    ``slurm_type``: how Slurm's environment names the type (default ``slurm.cluster.rank_gpu_type``, which
    asks scontrol for the node's GRES; ConfigError inside Slurm when nothing names a type)."""
    if slurm_type is None:
        from hpc_jabas.slurm.cluster import rank_gpu_type
        slurm_type = rank_gpu_type
    mine = slurm_type(env)
    if mine is not None:
        return mine, "slurm"
    if cuda_name:
        t = gpu_type_of_device_name(cuda_name)
        if t is not None:
            return t, "cuda"
        log.warning("rank %d: GPU %r is not in the catalog; planning it as a %s "
                    "(set gpu_types or add it to the catalog)", rank, cuda_name, DEFAULT_TYPE)
        return DEFAULT_TYPE, "default"
    return DEFAULT_TYPE, "emulation" if emulate else "default"


def combine_sources(sources: Any) -> GpuSource:
    """The ranks' common source, or "mixed"."""
    found = set(sources)
    if len(found) == 1:
        only = found.pop()
        if only in SOURCES:
            return cast(GpuSource, only)
    return "mixed"
