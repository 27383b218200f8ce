"""The local one-machine Slurm cluster of slurm/local (tests, demo, benchmarks), held by a lease.

``with LocalCluster() as c:`` brings the cluster up unless it is up already, writes a lease
(its pid) and points SLURM_CONF / HPC_JABAS_SLURM_DIR at it for the holder's lifetime; on exit
it removes the lease, and the last live holder (no other pytest session, xdist worker or benchmark
holds a lease) takes the cluster down when a holder started it: a marker file says so, so that the
worker that started it may exit first. A cluster that was up before any holder stays up. Job files
must live where every node sees them: /tmp is private per node; ``c.shared`` is a scratch directory
all nodes share.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from hpc_jabas.errors import SlurmError

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "slurm" / "local"


def _other_live_leases(leases: Path) -> bool:
    for f in leases.glob("*"):
        try:
            os.kill(int(f.name), 0)
            return True
        except (ValueError, ProcessLookupError):
            f.unlink(missing_ok=True)
        except PermissionError:
            return True
    return False


class LocalCluster:
    def __init__(self, state_dir: str | os.PathLike | None = None):
        if not (LOCAL / "up.sh").exists():
            raise SlurmError(f"no local cluster scripts at {LOCAL}; use a source checkout of hpc-jabas")
        self.state = Path(state_dir or os.environ.get("HPC_JABAS_SLURM_DIR", "/var/tmp/hpc-jabas-slurm"))
        self.conf = self.state / "etc" / "slurm.conf"
        self.shared = self.state / "shared"
        # every node sees shared/ although it lies under /var/tmp (hpc-jabas submit refuses node-local paths
        # unless HPC_JABAS_SHARED_TMP names them: hpc_jabas/slurm/nodepaths.py; env.sh says the same)
        tmp = ":".join(x for x in (os.environ.get("HPC_JABAS_SHARED_TMP"), str(self.shared)) if x)
        self.env = dict(os.environ, HPC_JABAS_SLURM_DIR=str(self.state), SLURM_CONF=str(self.conf),
                        HPC_JABAS_SHARED_TMP=tmp)
        self.started = False
        self._lease: Path | None = None
        self._saved: dict[str, str | None] = {}
        self._marker = self.state / "started-by-a-holder"

    def _script(self, name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(LOCAL / name), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def __enter__(self) -> LocalCluster:
        if self._script("up.sh", "--check").returncode != 0:
            r = self._script("up.sh")
            if r.returncode != 0:
                tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or [f"exit {r.returncode}"]
                raise SlurmError(f"slurm/local/up.sh failed: {tail[0]} (logs in {self.state}/log)")
            self.started = True
            self._marker.write_text(str(os.getpid()))
        leases = self.state / "leases"
        leases.mkdir(parents=True, exist_ok=True)
        self._lease = leases / str(os.getpid())
        self._lease.write_text(str(os.getpid()))
        self._saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "HPC_JABAS_SLURM_DIR", "HPC_JABAS_SHARED_TMP")}
        os.environ.update(SLURM_CONF=str(self.conf), HPC_JABAS_SLURM_DIR=str(self.state),
                          HPC_JABAS_SHARED_TMP=self.env["HPC_JABAS_SHARED_TMP"])
        self.shared.mkdir(mode=0o1777, exist_ok=True)
        # the /tmp paths the running cluster binds into every node's /tmp (its slurm.conf says which: the checkout
        # it was brought up from when that lies under /tmp): declared too, so that an environment that names another
        # SLURM_CONF still accepts them (hpc_jabas/slurm/nodepaths.py reads them from the cluster's slurm.conf)
        from hpc_jabas.slurm.nodepaths import cluster_shared
        have = self.env["HPC_JABAS_SHARED_TMP"].split(":")
        more = [str(p) for p in cluster_shared({"SLURM_CONF": str(self.conf)}) if str(p) not in have]
        if more:
            self.env["HPC_JABAS_SHARED_TMP"] = os.environ["HPC_JABAS_SHARED_TMP"] = ":".join([*have, *more])
        return self

    def __exit__(self, *exc) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self._lease is not None:
            self._lease.unlink(missing_ok=True)
            self._lease = None
        if (self.started or self._marker.exists()) and not _other_live_leases(self.state / "leases"):
            self._script("down.sh", timeout=120)
            self._marker.unlink(missing_ok=True)


def kill_rank(job_id: str, rank: int) -> int | None:
    """SIGKILL the training process of one rank of a job (by its SLURM_JOB_ID and SLURM_PROCID); its pid,
    None when no such process runs here."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            if not any(m in cmd for m in (b"hpc_jabas.runtime.job.launch", b"hpc_jabas.slurm.node_entry",
                                          b"submitit.core._submit")):
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        kv = dict(x.decode(errors="replace").split("=", 1) for x in env if b"=" in x)
        if kv.get("SLURM_JOB_ID") == str(job_id) and kv.get("SLURM_PROCID") == str(rank):
            os.kill(int(d.name), signal.SIGKILL)
            return int(d.name)
    return None
