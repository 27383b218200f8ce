"""pytest fixtures for the real local Slurm cluster of slurm/local/up.sh.

    from slurm_env import slurm_cluster  # noqa   (and slurm_tmp, submit_and_wait if wanted)

``slurm_cluster`` (session scope) brings the cluster up if it is not up already, exports
SLURM_CONF / HPC_JABAS_SLURM_DIR into os.environ for the session (so every subprocess, submitit
included, reaches it), yields a :class:`SlurmCluster`, and takes the cluster down at session end
only if it started it and no other live session holds a lease on it (localcluster).
Without root or the Debian packages it fails with the reason (never skips): `make test` sets up
everything these tests need, so a missing piece is a set-up failure.

The Slurm tests run on every xdist worker at once, beside each other and the multi-rank tests: a test
holds the cluster's test lock shared for its duration (conftest's autouse fixture), and one that changes
what the others see (drains a node, fills or preempts a partition, counts free GPUs) is marked
``slurm_exclusive`` and holds it exclusively (:func:`cluster_lock`).

Job files must live on a path every node sees: /tmp is private per node (pytest's tmp_path is
under /tmp!). Use ``slurm_tmp`` (a fresh directory under the cluster's shared/ dir) or the repo.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from localcluster import LocalCluster

from hpc_jabas.errors import SlurmError
from hpc_jabas.slurm.text import parse_sacct
from hpc_jabas.slurm.watch import TERMINAL, fold_rows

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("munged", "slurmctld", "slurmd", "slurmdbd", "sinfo", "sbatch", "sacct", "mariadbd", "ip",
          "nsenter", "unshare")
#: what up.sh builds (slurm/local/common.sh): partition -> (GPU type, nodes, GPUs per node, billing/GPU)
LAYOUT = {
    "a100": ("a100", ("gpua1",), 2, 4.0),
    "v100": ("v100", ("gpuv1", "gpuv2"), 2, 2.0),
    "rtx2060": ("rtx2060", ("gpur1",), 4, 1.0),
}


@dataclass
class SlurmCluster:
    state_dir: Path
    slurm_conf: Path
    shared: Path                    # seen by every node: put job scripts and outputs here
    env: dict = field(default_factory=dict)
    started_here: bool = False
    layout: dict = field(default_factory=lambda: dict(LAYOUT))
    python: str = str(ROOT / ".venv" / "bin" / "python")

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=check)

    def sbatch(self, *args: str) -> str:
        r = self.run("sbatch", "--parsable", *args)
        return r.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """State of a job from sacct -X (a hetjob's components folded into one, as everywhere:
        hpc_jabas.slurm.watch.fold_rows); UNKNOWN while sacct does not list it."""
        r = self.run("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State", check=False)
        return fold_rows(parse_sacct(r.stdout, ("JobID", "State"))).get(job_id, {}).get("State", "UNKNOWN")

    def wait_state(self, job_id: str, states=TERMINAL, timeout: float = 120) -> str:
        end = time.time() + timeout
        st = "UNKNOWN"
        while time.time() < end:
            st = self.job_state(job_id)
            if st in states:
                return st
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} still {st} after {timeout:g} s (wanted {states})")

    def squeue_state(self, job_id: str) -> str:
        r = self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
        return (r.stdout.split() or [""])[0]

    def wait_running(self, job_id: str, timeout: float = 60) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if self.squeue_state(job_id) == "RUNNING":
                return
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} not RUNNING after {timeout:g} s: {self.squeue_state(job_id)!r}")

    def cancel(self, *job_ids: str) -> None:
        if job_ids:
            self.run("scancel", *job_ids, check=False)


def _unavailable(reason: str):
    # `make test` installs and starts everything these tests need, so a missing piece is a
    # set-up failure, never a skip.
    pytest.fail(f"local Slurm cluster unavailable: {reason}", pytrace=False)


def _quiesce(cluster: SlurmCluster, timeout: float = 90) -> None:
    """With the lock held exclusively no other test runs, but the jobs of finished ones may still be ending
    (a chain's last job exits after its end record): let them end, then cancel what is left."""
    end = time.time() + timeout
    while time.time() < end:
        left = cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if not left:
            return
        time.sleep(1.0)
    cluster.cancel(*left)
    end = time.time() + 30
    while time.time() < end and cluster.run("squeue", "-h", "-o", "%i", check=False).stdout.split():
        time.sleep(0.5)


@contextmanager
def cluster_lock(cluster: SlurmCluster, exclusive: bool):
    """The readers-writer lock of the tests on this cluster (flock on a file in its state directory; released
    when the holder exits, so a killed test session never leaves it held)."""
    fd = os.open(cluster.state_dir / ".test-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if exclusive:
            _quiesce(cluster)
        yield
    finally:
        os.close(fd)


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.name != "posix" or os.geteuid() != 0:
        _unavailable("needs root (network namespaces, daemons)")
    missing = [c for c in NEEDED if shutil.which(c) is None]
    if missing:
        _unavailable(f"missing {', '.join(missing)}; run scripts/setup.sh "
                     "(apt-get install munge slurmctld slurmd slurm-client slurmdbd mariadb-server)")
    lc = LocalCluster()
    try:
        lc.__enter__()
    except SlurmError as e:
        _unavailable(str(e))
    try:
        yield SlurmCluster(lc.state, lc.conf, lc.shared, lc.env, started_here=lc.started)
    finally:
        lc.__exit__(None, None, None)


@pytest.fixture
def slurm_tmp(slurm_cluster):
    """A fresh directory that every node of the local cluster sees (unlike tmp_path under /tmp)."""
    d = slurm_cluster.shared / f"t-{uuid.uuid4().hex[:10]}"
    d.mkdir(mode=0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)
