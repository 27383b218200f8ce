"""Paths the nodes can see (issue 36, finding 6): `hpc-jabas submit` refuses a chain directory or a task module in
a node-local directory, in one line and before Slurm, unless HPC_JABAS_SHARED_TMP declares it shared; a job that
fails before writing its log makes `hpc-jabas status` show Slurm's reason and its sbatch output's path;
`slurm/local/up.sh --check` says what it checked. The suite passes wherever the set-up cache lives (issue 59, item 7):
the local cluster declares the directories its nodes share with the host (only /tmp is private per node) in
``shared-paths`` beside the slurm.conf it generates, and the check reads that declaration, so a Python environment
under /var/tmp (``HPC_JABAS_CACHE=/var/tmp/...``) is accepted there and still refused where nothing declares it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.errors import ConfigError
from hpc_jabas.slurm.nodepaths import DECL_FILE, ENV, check_job_environment, cluster_declared, node_local_root

ROOT = Path(__file__).resolve().parents[1]
HPC_JABAS = str(ROOT / ".venv" / "bin" / "hpc-jabas")


NO_CLUSTER = {"SLURM_CONF": "/nonexistent"}          # no local cluster's slurm.conf declares anything here


def test_node_local_roots_and_the_shared_declaration(tmp_path):
    assert node_local_root("/tmp/a/b", NO_CLUSTER) == "/tmp" and node_local_root("/tmp", NO_CLUSTER) == "/tmp"
    assert node_local_root("/var/tmp/x", NO_CLUSTER) == "/var/tmp"
    assert node_local_root("/dev/shm/x", NO_CLUSTER) == "/dev/shm"
    assert node_local_root("/tmpfoo/x", NO_CLUSTER) is None and node_local_root("/home/u/chain", NO_CLUSTER) is None
    assert node_local_root("/var/tmp/x", {**NO_CLUSTER, ENV: "/scratch:/var/tmp"}) is None
    assert node_local_root("/var/tmp/x", {**NO_CLUSTER, ENV: "/var/tmp/y"}) == "/var/tmp"   # whole names only
    link = tmp_path / "link"                      # a link from elsewhere into /tmp is followed
    link.symlink_to(tmp_path)
    assert node_local_root(link / "c", NO_CLUSTER) == "/tmp"


def _job(d: Path, chain: Path) -> Path:
    (d / "hj_np_task.py").write_text("def build():\n    raise SystemExit('not called')\n")
    f = d / "job.toml"
    f.write_text(f'[job]\ntask = "hj_np_task:build"\nchain_dir = "{chain}"\npythonpath = ["{d}"]\n'
                 'method = "sbatch"\n[train]\nepochs = 1\n')
    return f


def declared(*shared: Path) -> str:
    """HPC_JABAS_SHARED_TMP naming ``shared`` plus this checkout and its python environment, wherever they lie (a
    clone under /tmp included): the refusals tested are of the test's own paths."""
    from hpc_jabas.slurm.nodepaths import python_paths
    return ":".join([*map(str, shared), str(ROOT), *(p for p, _ in python_paths())])


def test_submit_refuses_node_local_paths_in_one_line_before_slurm(tmp_path, monkeypatch, capsys):
    from hpc_jabas.cli.main import main
    monkeypatch.setenv("SLURM_CONF", "/nonexistent")        # nothing may reach Slurm before the refusal
    shared = tmp_path / "shared"                             # what this "site" shares: not tmp_path itself
    monkeypatch.setenv(ENV, declared(shared))

    def submit(job: Path) -> str:
        rc = main(["submit", str(job), "--mix", "rtx2060:1", "--no-dry-run"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, (rc, err)
        return err[0]
    line = submit(_job(tmp_path, tmp_path / "chain"))
    assert f"chain_dir '{tmp_path / 'chain'}' is under /tmp" in line and f"{ENV}=/tmp" in line, line
    chain = shared / f"np-{uuid.uuid4().hex[:8]}"            # not made: the checks make nothing
    line = submit(_job(tmp_path, chain))
    assert f"task module 'hj_np_task' of task 'hj_np_task:build', at '{tmp_path / 'hj_np_task.py'}' is under /tmp" \
        in line, line
    assert not chain.exists() and not (tmp_path / "chain").exists()
    monkeypatch.setenv(ENV, declared(tmp_path))              # the site shares it: the next check speaks (Slurm)
    line = submit(_job(tmp_path, tmp_path / "chain"))
    assert "SLURM_CONF=/nonexistent" in line and "is under" not in line, line


@pytest.mark.slurm
def test_status_of_a_job_that_failed_before_its_log_and_up_check_says_what_it_checked(slurm_cluster, tmp_path):
    """A chain directory under /tmp (private per node here) submitted around submit's check: Slurm fails the job
    (JobLaunchFailure) and nothing of ours is written; status names Slurm's reason and the output's path."""
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.slurm.executor import submit
    chain = tmp_path / "chain"
    spec = JobSpec(task="preempt_task:build", config={"epochs": 1}, chain_dir=str(chain), mix={"rtx2060": 1},
                   method="sbatch", pythonpath=[str(ROOT / "tests")])
    job = submit(spec).job_id
    try:
        assert slurm_cluster.wait_state(job, timeout=60) == "FAILED"
    finally:
        slurm_cluster.cancel(job)
    out = chain / "jobs" / f"1-{job}.out"
    r = subprocess.run([HPC_JABAS, "status", str(chain)], capture_output=True, text=True, env=slurm_cluster.env,
                       timeout=60)
    last = r.stdout.strip().splitlines()[-1]
    assert r.returncode == 0 and last == (
        f"current: stopped: job {job} is FAILED in Slurm before it started (Slurm's reason: JobLaunchFailure, exit "
        f"code 0:53); sbatch output: {out} (missing: the job's nodes may not see that directory)"), r.stdout
    # up.sh --check on the working cluster: what it checked, and the verdict; from a checkout under /tmp: why not
    r = subprocess.run(["bash", str(ROOT / "slurm" / "local" / "up.sh"), "--check"], capture_output=True, text=True,
                       env=slurm_cluster.env, timeout=60)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[-1].startswith("[slurm-local] check: UP: healthy and current"), r.stdout
    assert any("configuration current" in ln for ln in lines) and any("slurmctld answers" in ln for ln in lines)
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "slurm" / "local", clone / "slurm" / "local")
    r = subprocess.run(["bash", str(clone / "slurm" / "local" / "up.sh"), "--check"], capture_output=True, text=True,
                       env=slurm_cluster.env, timeout=60)
    # the clone's path is among what it wants (beside any /tmp path the running cluster already shares, which a
    # bring-up keeps: a machine that once ran a checkout under /tmp still has it)
    wants = re.search(r"this checkout wants '([^']*)'", r.stdout)
    assert r.returncode == 1 and wants and str(clone) in wants.group(1).split(), (r.stdout, r.stderr)
    assert r.stdout.splitlines()[-1].startswith("[slurm-local] check: NOT CURRENT")
    assert slurm_cluster.run("scontrol", "ping").stdout.count("UP") == 1          # --check started nothing


def _conf(where: Path, declare: bool) -> dict[str, str]:
    """An environment whose SLURM_CONF is a slurm.conf as slurm/local/up.sh writes it, the declaration beside it
    written by up.sh's own function (slurm/local/common.sh) when ``declare``."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "slurm.conf").write_text("# Generated by slurm/local/up.sh\n# shared-tmp: none\nClusterName=jabas\n")
    if declare:
        subprocess.run(["bash", "-c", f"source {ROOT}/slurm/local/common.sh && write_shared_decl {where}"],
                       check=True, env={**os.environ, "HPC_JABAS_SLURM_DIR": str(where / "state")})
    return {"SLURM_CONF": str(where / "slurm.conf")}


def test_the_local_clusters_declaration_is_read(tmp_path):
    env = _conf(tmp_path / "etc", declare=True)
    assert (tmp_path / "etc" / DECL_FILE).read_text().splitlines()[1:] == ["/var/tmp", "/dev/shm"]
    assert cluster_declared(env) == [Path("/var/tmp").resolve(), Path("/dev/shm").resolve()]
    assert node_local_root("/var/tmp/hpc-jabas/env-0123/bin/python", env) is None
    assert node_local_root("/dev/shm/x", env) is None
    assert node_local_root("/tmp/hpc-jabas/env-0123", env) == "/tmp"          # /tmp stays private per node
    bare = _conf(tmp_path / "site", declare=False)                             # a site's slurm.conf: nothing
    assert cluster_declared(bare) == [] and node_local_root("/var/tmp/x", bare) == "/var/tmp"
    os.chmod(tmp_path / "etc" / DECL_FILE, 0o666)                              # writable by anyone: not read
    assert cluster_declared(env) == [] and node_local_root("/var/tmp/x", env) == "/var/tmp"


@pytest.fixture
def var_tmp_env():
    """A Python environment under /var/tmp, as scripts/setup.sh makes one with HPC_JABAS_CACHE=/var/tmp/...: a venv
    whose .pth file puts this interpreter's site-packages on its path."""
    d = Path("/var/tmp") / f"hj-nodepaths-{uuid.uuid4().hex[:8]}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=True)


def test_an_environment_under_var_tmp_is_accepted_where_the_cluster_declares_it(tmp_path, var_tmp_env):
    spec = JobSpec(task="m:build", config={"epochs": 1}, chain_dir=str(ROOT / "runs" / "x"), mix={"v100": 1},
                   python=str(var_tmp_env / "bin" / "python"))
    check_job_environment(spec, _conf(tmp_path / "etc", declare=True))
    with pytest.raises(ConfigError) as e:
        check_job_environment(spec, _conf(tmp_path / "site", declare=False))
    said = str(e.value)
    assert "\n" not in said and "is under /var/tmp" in said and str(var_tmp_env) in said
