"""Slurm view: partitions, their GPU type, total and free GPUs, node states, GPU billing weights.

A thin adapter over Slurm's client commands (``scontrol show node -o``, ``scontrol show
partition -o``, ``sinfo -O ...GresUsed``), run through :mod:`hpc_jabas.slurm.proc`. Parsing is split
from running: the record parsers live in :mod:`hpc_jabas.slurm.text` and :func:`build_view` is pure,
so both are tested on text as well as against the real local cluster (slurm/local/up.sh).

GPU type of a partition: the typed GRES of its nodes (``Gres=gpu:a100:2``) when that names a GPU
type of the catalog (:mod:`hpc_jabas.core.config.gpus`); else the user's ``partition_types`` mapping; else the
partition's own name if it is a catalog type. Free GPUs count only nodes that can take a job now:
down, drained/draining, failing, not responding, in maintenance or reserved nodes give none.

``rank_gpu_type`` tells a training rank which GPU type it stands for, from its Slurm environment.
In a heterogeneous job step (``srun --het-group=0,1``) every rank sees the *last* component's
``SLURM_JOB_PARTITION`` (verified on Slurm 22.05), so the rank's own component is found by its
node: ``SLURMD_NODENAME`` in ``SLURM_JOB_NODELIST_HET_GROUP_<k>``.
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpc_jabas.core.config import gpus
from hpc_jabas.errors import ConfigError, SlurmError
from hpc_jabas.slurm import proc
from hpc_jabas.slurm.env import SlurmEnv
from hpc_jabas.slurm.text import (
    expand_hostlist,
    gpu_type_of,
    node_usable,
    parse_alloc_gpus,
    parse_billing,
    parse_gres,
    parse_oneliner,
)

TIMEOUT_S = proc.TIMEOUT_S


# ---- data ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeView:
    name: str
    state: str                      # lower case as scontrol prints it, e.g. "idle", "mixed+drain", "down*"
    partitions: tuple[str, ...]
    gres: dict[str | None, int]     # GRES gpu type (None: untyped) -> configured count
    gpus_used: int

    @property
    def gpus_total(self) -> int:
        return sum(self.gres.values())

    @property
    def usable(self) -> bool:
        """The node can take a new job now (not down, drained, draining, failing, ...)."""
        return node_usable(self.state)

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus_total - self.gpus_used) if self.usable else 0


@dataclass(frozen=True)
class PartitionView:
    name: str
    gpu_type: str | None            # catalog key, None when no GPUs or the type is not known
    gres_types: tuple[str, ...]     # raw typed-GRES names on its nodes ("a100"); empty if untyped
    nodes: tuple[str, ...]
    node_states: dict[str, str]
    gpus_total: int                 # configured GPUs on all its nodes (down ones included)
    gpus_free: int                  # GPUs a new job could get now
    billing_per_gpu: float | None   # TRESBillingWeights GRES/gpu[:type]=w; None when not set
    default: bool = False
    state: str = "up"
    raw_billing: str = ""

    @property
    def has_gpus(self) -> bool:
        return self.gpus_total > 0

    @property
    def gpus_used(self) -> int:
        return self.gpus_total - self.gpus_free


@dataclass(frozen=True)
class ClusterView:
    partitions: dict[str, PartitionView]
    nodes: dict[str, NodeView] = field(default_factory=dict)

    # -- look-ups that fail with one clear line --
    def partition(self, name: str) -> PartitionView:
        if name not in self.partitions:
            here = ", ".join(sorted(self.partitions)) or "none"
            raise ConfigError(f"unknown partition {name!r}; partitions here: {here}")
        return self.partitions[name]

    def gpu_partition(self, name: str) -> PartitionView:
        """The partition, checked to hold GPUs of one catalog type (what a training mix needs)."""
        p = self.partition(name)
        if not p.has_gpus:
            with_gpus = sorted(q.name for q in self.partitions.values() if q.has_gpus)
            raise ConfigError(f"partition {name!r} has no GPUs (no gres/gpu on its nodes); "
                              f"partitions with GPUs: {', '.join(with_gpus) or 'none'}")
        if p.gpu_type is None:
            if len(p.gres_types) > 1:
                what = f"mixes GPU types {', '.join(p.gres_types)}"
            elif p.gres_types:
                what = f"has GPUs of type {p.gres_types[0]!r}, which is not in the GPU catalog"
            else:
                what = "has untyped GPUs (gres gpu without a type) and its name is no GPU type"
            raise ConfigError(f"partition {name!r} {what}; name its type with partition_types="
                              f"{{{name!r}: '<type>'}}; known types: {', '.join(gpus.known())}")
        return p

    # -- the shapes the auto-scaler takes --
    @property
    def types(self) -> dict[str, str]:
        """partition -> GPU type, for GPU partitions of a known type."""
        return {n: p.gpu_type for n, p in sorted(self.partitions.items()) if p.has_gpus and p.gpu_type}

    @property
    def free(self) -> dict[str, int]:
        """partition -> free GPUs, for GPU partitions of a known type."""
        return {n: self.partitions[n].gpus_free for n in self.types}

    @property
    def total(self) -> dict[str, int]:
        return {n: self.partitions[n].gpus_total for n in self.types}

    @property
    def billing(self) -> dict[str, float]:
        """partition -> billing weight of one GPU, where the partition sets one."""
        out: dict[str, float] = {}
        for n in self.types:
            w = self.partitions[n].billing_per_gpu
            if w is not None:
                out[n] = w
        return out

    def free_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n, t in self.types.items():
            out[t] = out.get(t, 0) + self.partitions[n].gpus_free
        return out

    def summary(self) -> str:
        lines = []
        for n, p in sorted(self.partitions.items()):
            w = "-" if p.billing_per_gpu is None else f"{p.billing_per_gpu:g}"
            lines.append(f"{n:<14} type={p.gpu_type or '-':<10} gpus={p.gpus_free}/{p.gpus_total} free "
                         f"billing/gpu={w} nodes=" + ",".join(f"{k}:{v}" for k, v in p.node_states.items()))
        return "\n".join(lines)


# ---- the view from scontrol's records (pure) -------------------------------------------------
def build_view(node_lines: Iterable[str], part_lines: Iterable[str], gres_used: Mapping[str, str] | None = None,
               partition_types: Mapping[str, str] | None = None) -> ClusterView:
    """Pure: ``scontrol show node -o`` and ``scontrol show partition -o`` lines (+ sinfo GresUsed per node)
    -> ClusterView. ``partition_types`` maps partition -> GPU type where GRES are untyped or unknown."""
    gres_used = dict(gres_used or {})
    nodes: dict[str, NodeView] = {}
    for line in node_lines:
        if not line.strip():
            continue
        d = parse_oneliner(line)
        name = d.get("NodeName")
        if not name:
            continue
        gres = parse_gres(d.get("Gres"))
        if name in gres_used:
            used = sum(parse_gres(gres_used[name]).values())
        else:
            used = parse_alloc_gpus(d.get("AllocTRES")) or 0
        parts = tuple(p for p in (d.get("Partitions") or "").split(",") if p and p != "(null)")
        nodes[name] = NodeView(name, (d.get("State") or "unknown").lower(), parts, gres, used)

    pdefs: dict[str, dict[str, str]] = {}
    for line in part_lines:
        if not line.strip():
            continue
        d = parse_oneliner(line)
        # a Hidden partition (root sees it anyway) is the site's, not the job's: never offered to the auto-scaler
        if d.get("PartitionName") and (d.get("Hidden") or "NO").upper() != "YES":
            pdefs[d["PartitionName"]] = d

    mapping: dict[str, str] = {}
    for p, t in (partition_types or {}).items():
        if p not in pdefs:
            raise ConfigError(f"unknown partition {p!r} in partition_types; partitions here: "
                              f"{', '.join(sorted(pdefs)) or 'none'}")
        mapping[p] = gpus.normalize(t)

    partitions: dict[str, PartitionView] = {}
    for pname, d in pdefs.items():
        members = [n for n in nodes.values() if pname in n.partitions]
        if not members and d.get("Nodes") not in (None, "", "(null)"):
            members = [nodes[n] for n in expand_hostlist(d["Nodes"]) if n in nodes]
        raw_types = sorted({t for n in members for t, c in n.gres.items() if t is not None and c > 0})
        total = sum(n.gpus_total for n in members)
        gtype: str | None = None
        if total:
            known = sorted({k for k in (gpu_type_of(t) for t in raw_types) if k is not None})
            untyped = any(None in n.gres for n in members)
            if len(known) == 1 and len(known) == len(raw_types) and not untyped:
                gtype = known[0]
                if pname in mapping and mapping[pname] != gtype:
                    raise ConfigError(f"partition {pname!r} holds {gtype} GPUs (typed GRES) but partition_types "
                                      f"says {mapping[pname]!r}; drop it from partition_types or fix it")
            elif pname in mapping:
                gtype = mapping[pname]
            elif not raw_types:
                gtype = gpu_type_of(pname)
        weights = d.get("TRESBillingWeights", "")
        pstate = (d.get("State") or "UP").lower()
        free = sum(n.gpus_free for n in members) if pstate == "up" else 0
        partitions[pname] = PartitionView(
            name=pname, gpu_type=gtype, gres_types=tuple(raw_types), nodes=tuple(n.name for n in members),
            node_states={n.name: n.state for n in members}, gpus_total=total, gpus_free=free,
            billing_per_gpu=parse_billing(weights, gtype) if total else None,
            default=(d.get("Default", "NO").upper() == "YES"), state=pstate, raw_billing=weights)
    return ClusterView(partitions, nodes)


# ---- running Slurm ---------------------------------------------------------------------------
def read_cluster(partition_types: Mapping[str, str] | None = None,
                 env: Mapping[str, str] | None = None) -> ClusterView:
    """Read partitions, GPU types, totals, free GPUs, node states and GPU billing weights from Slurm.

    ``partition_types``: partition -> GPU type, for partitions whose GRES are untyped or carry a type
    name outside the catalog. ``env``: environment for the Slurm commands (default os.environ).
    Raises SlurmError (no Slurm, controller unreachable) or ConfigError (bad partition_types).
    """
    proc.require(("sinfo", "scontrol"), env)
    node_text = proc.run(["scontrol", "show", "node", "-o"], env)
    part_text = proc.run(["scontrol", "show", "partition", "-o"], env)
    used: dict[str, str] = {}
    try:
        for line in proc.run(["sinfo", "-N", "-h", "-O", "NodeList:|,GresUsed:|"], env).splitlines():
            cols = line.split("|")
            if len(cols) >= 2 and cols[0].strip():
                used[cols[0].strip()] = cols[1].strip()
    except SlurmError:
        used = {}   # AllocTRES in scontrol's node records is the fallback
    return build_view(node_text.splitlines(), part_text.splitlines(), used, partition_types)


# ---- the GPU type of one rank ----------------------------------------------------------------
def rank_partition(env: Mapping[str, str]) -> str | None:
    """The partition of this rank's own job component (heterogeneous jobs: found by the node)."""
    return SlurmEnv(env).rank_partition()


def _node_gres_type(node: str, env: Mapping[str, str]) -> str | None:
    """Catalog type of the node's GPUs from `scontrol show node` (None when unknown or mixed)."""
    run_env = dict(os.environ)
    conf = SlurmEnv(env).conf
    if conf:
        run_env["SLURM_CONF"] = conf
    try:
        proc.require(("scontrol",), run_env)
        text = proc.run(["scontrol", "show", "node", "-o", node], run_env, timeout=10)
    except SlurmError:
        return None
    for line in text.splitlines():
        d = parse_oneliner(line)
        if d.get("NodeName") == node:
            types = {t for t, c in parse_gres(d.get("Gres")).items() if c > 0}
            known = {gpu_type_of(t) for t in types}
            if len(types) == 1 and None not in known:
                return known.pop()
    return None


def rank_gpu_type(env: Mapping[str, str] | None = None,
                  partition_types: Mapping[str, str] | None = None) -> str | None:
    """GPU type (catalog key) this rank stands for, from its Slurm environment; None outside Slurm.

    Order: ``partition_types[<the rank's partition>]``; the typed GRES of the rank's node
    (``SLURMD_NODENAME``, asked of scontrol) when it holds GPUs of one catalog type; the partition's
    own name if it is a catalog type. ConfigError when inside Slurm none of these gives a type.
    """
    env = os.environ if env is None else env
    senv = SlurmEnv(env)
    if not senv.inside:
        return None
    part = senv.rank_partition()
    if partition_types and part is not None and part in partition_types:
        return gpus.normalize(partition_types[part])
    node = senv.node_name
    if node:
        t = _node_gres_type(node, env)
        if t:
            return t
    if part:
        t = gpu_type_of(part)
        if t:
            return t
    raise ConfigError(f"cannot tell the GPU type of this rank: partition {part!r} on node {node!r} is no GPU type "
                      f"and the node shows no typed GPU of the catalog; pass partition_types="
                      f"{{{part or '<partition>'!r}: '<type>'}}; known types: {', '.join(gpus.known())}")


# ---- GPUs a job could move onto; this job's own allocation and clock -----------------------------
def available_gpus(view: ClusterView, held: Mapping[str, int],
                   job_nodes: Iterable[str] | None = None) -> dict[str, int]:
    """partition -> GPUs a next job could get: the free ones plus those this job holds (``held``: partition ->
    GPUs), counted only on nodes that can take a job (not drained, draining, down, ...) of partitions that
    are up. ``job_nodes``: this job's nodes (:func:`job_nodes`); without them, at most the GPUs in use on the
    partition's usable nodes. A stand-in view without partitions (tests) adds ``held`` as it is."""
    out = dict(view.free)
    parts = getattr(view, "partitions", None)
    mine = set(job_nodes or ())
    for part, n in held.items():
        if parts is None:
            out[part] = out.get(part, 0) + int(n)
            continue
        pv = parts.get(part)
        if pv is None or part not in out or pv.state != "up":
            continue
        usable = [view.nodes[x] for x in pv.nodes if x in view.nodes and view.nodes[x].usable]
        cap = sum(nd.gpus_total for nd in usable if nd.name in mine) if mine else sum(nd.gpus_used for nd in usable)
        out[part] += min(int(n), cap)
    return out


def job_nodes(env: Mapping[str, str] | None = None) -> list[str]:
    """The nodes of the current job (every component of a heterogeneous job), from its environment."""
    return SlurmEnv(env).nodes()


def parse_duration(text: str) -> float | None:
    """squeue's time format ('[D-]HH:MM:SS', 'MM:SS', 'SS') -> seconds; None for UNLIMITED, NOT_SET, INVALID."""
    t = (text or "").strip()
    days = 0
    if "-" in t:
        d, _, t = t.partition("-")
        if not d.isdigit():
            return None
        days = int(d)
    parts = t.split(":")
    if not t or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    secs = 0
    for p in parts:
        secs = secs * 60 + int(p)
    return float(days * 86400 + secs)


def job_clock(job_id: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """{"time_left_s", "start", "state"} of a job from squeue (start: epoch seconds of its current run); Nones
    when Slurm does not say."""
    out: dict[str, Any] = {"time_left_s": None, "start": None, "state": None}
    try:
        text = proc.run(["squeue", "-h", "-j", str(job_id), "-o", "%L|%S|%T"], env, timeout=15)
    except SlurmError:
        return out
    line = (text.strip().splitlines() or [""])[0]
    left, _, rest = line.partition("|")
    start, _, state = rest.partition("|")
    out["time_left_s"] = parse_duration(left)
    out["state"] = state.strip() or None
    try:
        out["start"] = time.mktime(time.strptime(start.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        pass
    return out


def mix_from_env(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """partition -> tasks of the current job (every component of a heterogeneous job), from its environment."""
    return SlurmEnv(env).mix()
