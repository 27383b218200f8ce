"""A new user's first hour on a Slurm cluster it did not start: docs/cluster.md, run as a user who is not root.

The test makes an unprivileged user (useradd), gives it the wheel built from the checkout in ``~/dist/`` and a
site module ``pytorch`` (Lmod; a read-only, root-owned copy of exactly the packages the wheel declares, made once
from the shared environment: tests/support/package.py), and runs every bash block of docs/cluster.md in order, in
one shell, as that user: no root, no apt, no Horovod, no index (PIP_NO_INDEX=1: nothing is downloaded). So
backend ``auto`` picks torch.distributed. The blocks install the package into the user's own venv, run
``hpc-jabas doctor``, a 2-rank mpirun job, an sbatch job (srun --mpi=pmix), and a submitit chain followed with
``hpc-jabas status``. Meanwhile the test, as the site's scheduler would, stops the chain's job once
(``scancel --signal=USR2``, submitit's signal) after its first checkpoint.

Checked: every block ran (exit 0); the package and torch came from where they should; doctor said OK with
backend torch; the mpirun run trained; the chain stopped once at a safe point with no iteration lost, was
requeued under the same job id by the user's own ``scontrol requeue``, resumed at the stop, ran every iteration
exactly once and finished; and its final parameters equal those of the uninterrupted sbatch job (the same task
and config on the same partition, a different launch path).
"""
from __future__ import annotations

import json
import pwd
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.package import ROOT, build_wheel, site_packages_copy, wheel_requirements

USER = "hjfirst"
DOC = ROOT / "docs/cluster.md"
#: run as the user: (iteration of the sbatch run, of the chain, largest relative parameter difference)
COMPARE = """
import json, sys
from hpc_jabas.runtime.persist.checkpoint import load_latest
ref, got = load_latest(sys.argv[1])[0], load_latest(sys.argv[2])[0]
worst = max(float((got["model"][k] - w).abs().max() / (w.abs().max() + 1e-12)) for k, w in ref["model"].items())
print(json.dumps([ref["iteration"], got["iteration"], worst]))
"""
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")


def bash_blocks(doc: Path) -> list[tuple[int, str]]:
    """(line, text) of every ```bash block of ``doc``, in order."""
    lines = doc.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group(1):
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if m.group(1) in ("bash", "sh"):
                out.append((start, "\n".join(body)))
        i += 1
    return out


def _sh(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=timeout)


def _drop_user(cluster) -> None:
    try:
        pwd.getpwnam(USER)
    except KeyError:
        return
    cluster.run("scancel", "-u", USER, check=False)
    end = time.time() + 30
    while time.time() < end and cluster.run("squeue", "-h", "-u", USER, check=False).stdout.strip():
        time.sleep(0.5)
    _sh("userdel", "--remove", USER, check=False)           # refused while the user still runs something


def _events(chain: Path) -> list[dict]:
    p = chain / "chain.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []


def _preempt_once(cluster, chain: Path, done: threading.Event, log: dict) -> None:
    """As the site's scheduler: once the chain's first job wrote its first checkpoint, USR2 to its ranks."""
    end = time.time() + 400
    while time.time() < end and not done.is_set():
        sub = [e for e in _events(chain) if e.get("event") == "submit"]
        ckpts = list((chain / "run" / "checkpoints").glob("ckpt-*.pt")) if (chain / "run").exists() else []
        if sub and ckpts:
            log["job"] = str(sub[0]["job_id"])
            log["rc"] = cluster.run("scancel", "--signal=USR2", log["job"], check=False).returncode
            log["at"] = time.time()
            return
        time.sleep(0.1)


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_first_hour_of_a_user_without_root(slurm_cluster, tmp_path):
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.fail("useradd/runuser missing (package passwd, util-linux)", pytrace=False)
    whl = build_wheel(tmp_path / "build")
    site = site_packages_copy(wheel_requirements(whl))
    assert not (site / "horovod").exists()
    _drop_user(slurm_cluster)
    try:
        pwd.getpwnam(USER)
        pytest.fail(f"user {USER} is left from an earlier run and could not be removed (jobs or processes of it "
                    f"still running?): userdel --remove {USER}", pytrace=False)
    except KeyError:
        pass
    stale = Path("/home") / USER                     # a home an interrupted userdel left behind
    if stale.is_dir() and not stale.is_symlink():
        shutil.rmtree(stale)
    _sh("useradd", "--create-home", "--shell", "/bin/bash", "--user-group", USER)
    try:
        pw = pwd.getpwnam(USER)
        home = Path(pw.pw_dir)
        assert pw.pw_uid != 0
        (home / "dist").mkdir()
        shutil.copy2(whl, home / "dist" / whl.name)
        _sh("chown", "-R", f"{USER}:{USER}", str(home / "dist"))

        blocks = bash_blocks(DOC)
        assert len(blocks) >= 4, blocks
        script = ["cd ~"]
        for line, text in blocks:
            script += [f"echo \"@@ block docs/cluster.md:{line} $(date +%s.%N)\" >&2", text]
        script.append("echo \"@@ all blocks done $(date +%s.%N)\" >&2")
        env = {"HOME": str(home), "USER": USER, "LOGNAME": USER, "SHELL": "/bin/bash", "LANG": "C.UTF-8",
               "PATH": "/usr/local/bin:/usr/bin:/bin", "SLURM_CONF": slurm_cluster.env["SLURM_CONF"],
               "MODULEPATH": str(site.parent / "modulefiles"),       # the site's modules, as its profile sets
               "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        # a file, not stdin: mpirun passes its stdin on to rank 0, which would swallow the rest of the script
        sh = home / "first-hour.sh"
        sh.write_text("\n".join(script) + "\n")
        _sh("chown", f"{USER}:{USER}", str(sh))
        cmd = ["runuser", "-u", USER, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()],
               "bash", "--noprofile", "--norc", "-eo", "pipefail", str(sh)]
        chain = home / "first" / "runs" / "chain"
        done, log = threading.Event(), {}
        watcher = threading.Thread(target=_preempt_once, args=(slurm_cluster, chain, done, log), daemon=True)
        watcher.start()
        t0 = time.time()
        try:
            p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=540, cwd=home)
        finally:
            done.set()
            watcher.join(5)
        wall = time.time() - t0
        out = p.stdout + p.stderr
        marks = [ln[3:].rsplit(" ", 1) for ln in p.stderr.splitlines() if ln.startswith("@@ ")]
        assert p.returncode == 0 and marks and marks[-1][0] == "all blocks done", \
            f"as {USER}: exit {p.returncode} in {marks[-1:]}\n{out[-6000:]}\n{_job_logs(home)}"
        took = {a[0].split(":")[-1]: round(float(b[1]) - float(a[1]), 1) for a, b in zip(marks, marks[1:])}

        # installed as the user, from the wheel; torch from the site module; no Horovod anywhere
        venv = home / "venvs" / "hpc-jabas"
        assert (venv / "bin" / "hpc-jabas").stat().st_uid == pw.pw_uid
        assert not list(venv.glob("lib/python3*/site-packages/__editable__*"))
        assert list(venv.glob("lib/python3*/site-packages/hpc_jabas/core/planning/__init__.py"))
        assert "Successfully installed hpc-jabas-" in out, out[-3000:]
        assert re.search(r"Requirement already satisfied: torch\S* in " + re.escape(str(site)), out), out[-3000:]
        assert not list(venv.glob("lib/python3*/site-packages/torch")), "pip installed a second torch"
        doctor = out[out.index("torch   "):]
        assert re.search(r"^backend\s+.*torch", doctor, re.M), doctor[:1500]
        assert re.search(r"^status\s+OK$", doctor, re.M), doctor[:1500]
        assert re.search(r"^horovod\s+not installed", doctor, re.M), doctor[:1500]
        assert re.search(r"^slurm gpu types\s+.*v100=v100", doctor, re.M), doctor[:1500]
        assert re.search(r"^srun mpi plugins\s+.*\bpmix\b", doctor, re.M), doctor[:1500]

        # the first mpirun run: two ranks, one line each
        ranks = re.findall(r"^rank (\d) gpu=(\w+)", out, re.M)
        assert sorted(ranks) == [("0", "v100"), ("1", "rtx2060")], out[-3000:]

        # the chain: one stop (USR2, at a safe point, nothing lost), requeued in place, resumed, finished
        assert log.get("rc") == 0, (log, _events(chain))
        owner = slurm_cluster.run("sacct", "-j", log["job"], "-X", "-n", "-P", "-o", "User").stdout.split()
        assert owner and set(owner) == {USER}, owner                      # Slurm ran it as the user
        ev = _events(chain)
        stops = [e for e in ev if e["event"] == "end" and e.get("state") == "stopped"]
        assert len(stops) == 1 and stops[0]["signal"] == "USR2" and stops[0]["lost_iterations"] == 0, ev
        stop_it = stops[0]["iteration"]
        req = [e for e in ev if e["event"] == "requeue"]
        assert len(req) == 1 and req[0]["reason"] == "preempted" and str(req[0]["to_job"]) == log["job"], ev
        starts = [e for e in ev if e["event"] == "start"]
        assert len(starts) == 2 and starts[1]["resumed"] and starts[1]["iteration"] == stop_it, starts
        assert [e["state"] for e in ev if e["event"] == "end"] == ["stopped", "finished"], ev
        recs = [json.loads(ln) for ln in (chain / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        its = sorted(r["it"] for r in recs if r.get("type") == "iteration")
        assert its == list(range(32)), its                  # 2 epochs of 512 samples at B=32: each iteration once
        assert 0 < stop_it < 32
        assert "finished" in out[out.index("submitted job"):], out[-3000:]        # hpc-jabas status's account

        # the same run, uninterrupted, by sbatch + srun: the same parameters. Read as the user: hpc-jabas
        # refuses to load checkpoints that another user (here root) does not own
        sb = sorted((home / "first" / "runs").glob("sbatch-*/checkpoints"))
        assert len(sb) == 1, sb
        sb_out = (sb[0].parent.parent / f"{sb[0].parent.name}.out").read_text()
        assert sorted(re.findall(r"^rank (\d) gpu=(\w+)", sb_out, re.M)) == [("0", "v100"), ("1", "v100")], sb_out
        cmp = subprocess.run(["runuser", "-u", USER, "--", "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin",
                              f"PYTHONPATH={site}", str(venv / "bin" / "python"), "-c", COMPARE, str(sb[0]),
                              str(chain / "run" / "checkpoints")], capture_output=True, text=True, timeout=120)
        assert cmp.returncode == 0, cmp.stderr[-3000:]
        its_ref, its_got, worst = json.loads(cmp.stdout)
        assert its_ref == its_got == 32, (its_ref, its_got)
        assert worst <= 1e-6, f"the resumed chain's parameters differ from the uninterrupted sbatch run's: {worst:.2e}"
        print(f"as {USER} (uid {pw.pw_uid}): {len(blocks)} blocks of docs/cluster.md in {wall:.0f} s; "
              f"chain job {log['job']} stopped at iteration {stop_it}, requeued, finished 32 iterations; "
              f"parameters vs the sbatch run: {worst:.1e}; seconds per block (by its line): {took}")
        print(p.stdout[p.stdout.index("submitted job"):])
    finally:
        _drop_user(slurm_cluster)


def _job_logs(home: Path) -> str:
    files = sorted(p for p in (home / "first" / "runs").rglob("*") if p.is_file() and p.suffix in (".out", ".err")) \
        if (home / "first" / "runs").exists() else []
    return "\n".join(f"--- {q}\n{q.read_text(errors='replace')[-1500:]}" for q in files)[-8000:]
