"""Paths the nodes can see: what a job reads and writes must be on a file system that its nodes share.

A job's chain directory (its record, run directory, checkpoints and the sbatch output) and its task's module are
opened on the compute nodes. A directory that each node has its own copy of (``/tmp``, ``/var/tmp``, ``/dev/shm``
on most clusters, and on the local cluster of slurm/local a private ``/tmp`` per node) is refused by
``hpc-jabas submit`` before Slurm sees the job: on the nodes it is empty, so the job would fail before writing
its log (Slurm: FAILED, reason JobLaunchFailure).

``HPC_JABAS_SHARED_TMP`` (colon-separated paths) names what this site shares although it lies under one of those
directories: a path under one of its entries is accepted (``HPC_JABAS_SHARED_TMP=/var/tmp`` where /var/tmp is a
shared file system; the local cluster's env.sh names its shared scratch directory). slurm/local/up.sh also reads
it: its entries under /tmp are bound into every node's private /tmp.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hpc_jabas.errors import ConfigError

#: directories that are node-local on most clusters
NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm")
ENV = "HPC_JABAS_SHARED_TMP"


def _under(p: Path, root: Path) -> bool:
    return p == root or root in p.parents


def shared_entries(env: Mapping[str, str] | None = None) -> list[Path]:
    """The paths HPC_JABAS_SHARED_TMP declares shared (resolved; empty entries skipped)."""
    env = os.environ if env is None else env
    return [Path(x).resolve() for x in (env.get(ENV) or "").split(":") if x.strip()]


def node_local_root(path: str | os.PathLike, env: Mapping[str, str] | None = None) -> str | None:
    """The node-local directory ``path`` lies under (``"/tmp"``...), or None: not under one, or under a path that
    HPC_JABAS_SHARED_TMP declares shared. Symbolic links are followed (``/tmp`` may itself be a link)."""
    p = Path(path).resolve()
    if any(_under(p, s) for s in shared_entries(env)):
        return None
    for root in NODE_LOCAL:
        for r in {Path(root), Path(root).resolve()}:
            if _under(p, r):
                return root
    return None


def check_node_visible(path: str | os.PathLike, what: str, env: Mapping[str, str] | None = None) -> None:
    """ConfigError (one line) when ``path`` (``what``: "chain_dir", "task module ...") is in a node-local directory."""
    root = node_local_root(path, env)
    if root is None:
        return
    raise ConfigError(f"{what} {str(path)!r} is under {root}, which every node of a cluster has its own copy of: "
                      f"the job's nodes would not see it and the job would fail before writing its log; use a "
                      f"directory on a shared file system (home, project, scratch), or, if this site shares {root}, "
                      f"set {ENV}={root}")
