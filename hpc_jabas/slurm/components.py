"""The components of a job on a mix of partitions: one per partition, in sorted partition order.

A mix of one partition is a plain Slurm job; a mix of several is ONE heterogeneous job, component
k holding the k-th partition in sorted order (the rank order ``hpc_jabas.runtime.job.lifecycle.expand_mix``
assumes), started with ``srun --het-group=0,..,k`` so that one world of ranks spans them.

Per component: ``--partition``, ``--ntasks`` = GPUs (one rank per GPU), the partition's typed GPUs
(``--gres=gpu:<type>:<n>`` on one node; ``--nodes=N --gpus-per-task=<type>:1`` when the count needs
more GPUs than one node of the partition holds), ``--mem`` (so that jobs share nodes). The Slurm options a
spec gives (``spec.slurm``, a :class:`hpc_jabas.core.config.jobspec.SlurmRequest`) are resolved and checked here, once:
:class:`SlurmOptions` (``account``, ``qos``, ``sbatch_args``, ``job_name``, ``mem_per_task_mb`` and the [slurm]
keys ``time_min``, ``signal_lead_s``, ``max_timeouts``, ``max_failures``: given, else the job's config, else
the default), with one error line for a bad value.
"""
from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.core.config.schema import convert
from hpc_jabas.core.config.sections import JobConfig, flatten, section_fields
from hpc_jabas.core.config.validate import integer, parse_int, passes
from hpc_jabas.errors import ConfigError
from hpc_jabas.slurm.cluster import ClusterView, read_cluster

DEFAULT_MEM_PER_TASK_MB = 512
DEFAULT_TIME_MIN = 60


@dataclass(frozen=True)
class Component:
    """One partition of a mix: ntasks ranks, one GPU each, on `nodes` nodes."""
    partition: str
    ntasks: int
    nodes: int = 1
    gres_type: str | None = None      # the typed-GRES name on the partition's nodes ("a100"); None: untyped
    mem_mb: int = DEFAULT_MEM_PER_TASK_MB

    @property
    def gpu_spec(self) -> str:
        return f"{self.gres_type}:" if self.gres_type else ""

    def sbatch_options(self) -> dict[str, str]:
        """sbatch long options (name -> value) for this component."""
        o = {"partition": self.partition, "nodes": str(self.nodes), "ntasks": str(self.ntasks),
             "mem": f"{self.mem_mb}M"}
        if self.nodes == 1:
            o["gres"] = f"gpu:{self.gpu_spec}{self.ntasks}"
        else:
            o["gpus-per-task"] = f"{self.gpu_spec}1"
        return o

    def sbatch_line(self, more: Mapping[str, str] | None = None) -> str:
        """One ``#SBATCH`` line; ``more``: options every component repeats (time, account, qos)."""
        o = {**self.sbatch_options(), **dict(more or {})}
        return "#SBATCH " + " ".join(f"--{k}={shlex.quote(v)}" for k, v in o.items())


def partition_view(partition_types: Mapping[str, str] | None = None) -> ClusterView:
    """The cluster as Slurm shows it now (the partitions a mix may name)."""
    return read_cluster(partition_types)


def components(mix: Mapping[str, int], view: ClusterView | None = None, *,
               partition_types: Mapping[str, str] | None = None,
               mem_per_task_mb: int = DEFAULT_MEM_PER_TASK_MB) -> list[Component]:
    """One component per partition of the mix, sorted by partition name.

    ``view``: a :class:`hpc_jabas.slurm.cluster.ClusterView` (read from Slurm when None). Each component
    gets the partition's typed GPUs and the fewest nodes that hold its GPUs (largest node first).
    Unknown partitions, partitions without GPUs or counts above the partition's GPUs: ConfigError.
    """
    if not mix:
        raise ConfigError("empty mix; give partition -> GPU count, e.g. {'v100': 2}")
    if view is None:
        view = partition_view(partition_types)
    out = []
    for part in sorted(mix):
        n = mix[part]
        if not passes(integer, n, lo=1, whole_float=False):
            raise ConfigError(f"mix {dict(mix)!r}: count {n!r} for {part!r} must be an integer >= 1")
        pv = view.partitions.get(part)
        if pv is None:
            raise ConfigError(f"unknown partition {part!r} in mix {dict(mix)!r}; partitions here: "
                              f"{', '.join(sorted(view.partitions)) or 'none'}")
        if not pv.gpus_total:
            raise ConfigError(f"partition {part!r} has no GPUs; GPU partitions here: "
                              f"{', '.join(sorted(p for p, v in view.partitions.items() if v.gpus_total)) or 'none'}")
        if n > pv.gpus_total:
            raise ConfigError(f"mix asks {n} GPUs of partition {part!r}, which has {pv.gpus_total} in all")
        per_node = sorted((view.nodes[nd].gpus_total for nd in pv.nodes if nd in view.nodes), reverse=True)
        nodes, held = 0, 0
        for g in per_node:
            if held >= n:
                break
            nodes += 1
            held += g
        nodes = max(1, nodes)
        gtype = pv.gres_types[0] if len(pv.gres_types) == 1 else None
        tasks_per_node = math.ceil(n / nodes)
        out.append(Component(part, n, nodes, gtype, int(mem_per_task_mb) * tasks_per_node))
    return out


def het_groups(comps: list[Component]) -> str:
    """srun's --het-group value for every component: '0,1,..,k'."""
    return ",".join(str(k) for k in range(len(comps)))


# ---- the Slurm options of a spec ----------------------------------------------------------------
@dataclass(frozen=True)
class SlurmOptions:
    """What a job's Slurm submissions use, typed and checked once: the [slurm] keys (core/config/sections.py
    ``JobConfig``'s [slurm] keys: their bounds and defaults), the memory per rank, the job name, account, qos and the
    user's own sbatch arguments. ``of(spec)`` is the one reader of ``spec.slurm`` (the options given)."""
    time_min: int
    signal_lead_s: int
    max_timeouts: int
    max_failures: int
    mem_per_task_mb: int = DEFAULT_MEM_PER_TASK_MB
    job_name: str = "hpc-jabas"
    account: str | None = None
    qos: str | None = None
    sbatch_args: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: JobSpec) -> SlurmOptions:
        """From ``spec.slurm`` (the submit command's flags, ``JobSpec(slurm=...)``) first, then the job's config
        (any table), then the defaults. A bad value is one ConfigError line naming the key and the value."""
        flat, _ = flatten(spec.config or {})
        out: dict[str, Any] = {}
        defaults = JobConfig()
        for f in section_fields("slurm"):
            v = getattr(spec.slurm, f.name)
            if v is None:
                v = flat.get(f.name)
            out[f.name] = convert(f.name, _whole(getattr(defaults, f.name) if v is None else v), int, f.metadata)
        mem = spec.slurm.mem_per_task_mb
        out["mem_per_task_mb"] = convert("mem_per_task_mb", _whole(DEFAULT_MEM_PER_TASK_MB if mem is None else mem),
                                         int, MEM_KEY)
        name = spec.slurm.job_name
        return cls(**out, job_name="hpc-jabas" if name is None else str(name), account=_name(spec, "account"),
                   qos=_name(spec, "qos"), sbatch_args=_sbatch_args(spec))


#: mem_per_task_mb's check (the [slurm] keys' are their JobConfig fields')
MEM_KEY: dict[str, Any] = {"lo": 1, "hi": None, "lo_open": False, "hi_open": False, "choices": None, "canon": None}


def _whole(v: Any) -> Any:
    """The flag and keyword forms of a whole number as an int ("60", 60.0); anything else as given (the
    schema's check names it)."""
    if isinstance(v, str) and passes(parse_int, v):
        return parse_int(v, "value")
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def slurm_option(spec: JobSpec, key: str) -> int:
    """One number of :class:`SlurmOptions` (time_min, signal_lead_s, max_timeouts, max_failures, mem_per_task_mb)."""
    return int(getattr(SlurmOptions.of(spec), key))


#: What account and qos may be: Slurm's own names (letters, digits and _ . + -), so nothing else reaches a
#: ``#SBATCH`` line or sbatch's argument list.
_SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
#: The options hpc-jabas sets itself from the mix and the [slurm] keys: given again in sbatch_args they would
#: override the plan (a partition the ranks are not planned for, a time limit the signal lead does not fit) or
#: the job's own files, so they are refused with the key that sets them instead. (Only long forms are checked:
#: a short one such as -p is refused before, as every sbatch_args item must be --flag or --flag=value.)
MANAGED_OPTIONS = {
    "partition": "the mix", "ntasks": "the mix", "nodes": "the mix", "gres": "the mix", "gpus": "the mix",
    "gpus-per-task": "the mix", "hetjob": "the mix", "het-job": "the mix", "mem": "mem_per_task_mb",
    "time": "time_min", "signal": "signal_lead_s", "chdir": "the chain directory", "output": "the chain directory",
    "error": "the chain directory", "array": "nothing (one job per chain step)",
    "parsable": "nothing (hpc-jabas reads the job id itself)", "wrap": "nothing (hpc-jabas writes the job script)",
    "job-name": "job_name",
}


def _name(spec: JobSpec, key: str) -> str | None:
    v = getattr(spec.slurm, key)
    if v is None or v == "":
        return None
    if not isinstance(v, str) or not _SLURM_NAME.fullmatch(v):
        raise ConfigError(f"{key}={v!r} is invalid; it must be a Slurm {key} name (letters, digits, _ . + -)")
    return v


def _sbatch_args(spec: JobSpec) -> tuple[str, ...]:
    a: Any = spec.slurm.sbatch_args or []
    if isinstance(a, str):
        try:
            a = shlex.split(a)
        except ValueError as e:
            raise ConfigError(f"sbatch_args={a!r} is invalid ({e}); give --flag or --flag=value items") from e
    if not isinstance(a, (list, tuple)):
        raise ConfigError(f"sbatch_args={a!r} is invalid; give a list of --flag or --flag=value strings")
    out = []
    for x in a:
        if not isinstance(x, str) or not x.startswith("--") or len(x) < 3 or any(c.isspace() for c in x) \
                or any(ord(c) < 32 for c in x):
            raise ConfigError(f"sbatch_args item {x!r} is invalid; each must be --flag or --flag=value, long form, "
                              "without spaces or control characters (it goes on an #SBATCH line)")
        flag = x[2:].partition("=")[0]
        if flag in MANAGED_OPTIONS:
            raise ConfigError(f"sbatch_args item {x!r} is refused: hpc-jabas sets --{flag} itself, from "
                              f"{MANAGED_OPTIONS[flag]}")
        out.append(x)
    return tuple(out)


def per_component_options(spec: JobSpec) -> dict[str, str]:
    """Options each component of a heterogeneous job needs for itself (time, account, qos)."""
    o = {"time": str(slurm_option(spec, "time_min"))}
    for k in ("account", "qos"):
        name = _name(spec, k)
        if name:
            o[k] = name
    return o


def extra_args(spec: JobSpec) -> list[str]:
    """``spec.slurm.sbatch_args`` (a list, or one shell-quoted string) as a checked list of ``--flag[=value]``."""
    return list(_sbatch_args(spec))


def check_extra(spec: JobSpec) -> None:
    """Every option of ``spec.slurm`` (and the config's [slurm] keys), checked at once: what submit calls before
    Slurm."""
    SlurmOptions.of(spec)


def parse_mix(text: str) -> dict[str, int]:
    """'a100:1,v100:2' -> {'a100': 1, 'v100': 2}."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        part, sep, n = item.partition(":")
        part = part.strip()
        if not sep or not part or not passes(parse_int, n, lo=1):
            raise ConfigError(f"mix {text!r} is invalid: {item!r} must be PARTITION:COUNT with COUNT >= 1, "
                              "e.g. a100:1,v100:2")
        if part in out:
            raise ConfigError(f"mix {text!r} names partition {part!r} twice")
        out[part] = parse_int(n, "count")
    if not out:
        raise ConfigError(f"mix {text!r} is empty; give PARTITION:COUNT[,...], e.g. a100:1,v100:2")
    return dict(sorted(out.items()))
