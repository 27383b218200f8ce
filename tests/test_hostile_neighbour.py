"""Two real users on one machine: a victim who trains, and a neighbour (another Unix user, made with useradd) who
prepared files where the victim is about to work. Nothing the neighbour planted is written through or run:

- the neighbour made the victim's run directory (mode 0777) and put a link in it where hpc-jabas writes its
  metrics, pointing at a file in the victim's home: the victim's run is one line (exit 2), the file in the
  victim's home keeps its bytes, and nothing lands in the planted directory;
- the neighbour left a job file (``python -m hpc_jabas.runtime.job.launch JOB.toml``) whose ``task`` names the
  neighbour's module: the launcher refuses it in one line before importing anything, so the module (which
  would leave a marker) never runs as the victim.

Both users run the system python with a read-only copy of the third-party packages (tests/support/package.py, the
one the first-hour test uses) and a world-readable copy of this checkout's package."""
from __future__ import annotations

import pwd
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest
from support.package import ROOT, site_packages_copy

VICTIM, NEIGHBOUR = "hjvictim", "hjneighbour"
SYSTEM_PY = "/usr/bin/python3"


def _user(name: str) -> Path:
    try:
        return Path(pwd.getpwnam(name).pw_dir)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", name], check=True)
        return Path(pwd.getpwnam(name).pw_dir)


@pytest.fixture(scope="module")
def world():
    if shutil.which("useradd") is None or shutil.which("runuser") is None or not Path(SYSTEM_PY).exists():
        pytest.fail("useradd/runuser or the system python missing (passwd, util-linux, python3)", pytrace=False)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    site = site_packages_copy([d.split("#")[0].strip() for d in deps])
    code = Path(tempfile.mkdtemp(prefix="hj-neighbour-code-", dir="/var/tmp"))
    shutil.copytree(ROOT / "hpc_jabas", code / "hpc_jabas", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "tests" / "workers" / "ckpt_user.py", code / "ckpt_user.py")
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(code)], check=True)
    homes = {u: _user(u) for u in (VICTIM, NEIGHBOUR)}
    meet = Path(tempfile.mkdtemp(prefix="hj-neighbour-", dir="/tmp"))
    meet.chmod(0o1777)                           # like /tmp: sticky, every user may make files
    yield {"site": site, "code": code, "homes": homes, "meet": meet}
    shutil.rmtree(meet, ignore_errors=True)
    shutil.rmtree(code, ignore_errors=True)


def _as(user: str, w: dict, *cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    home = w["homes"][user]
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{w['code']}:{w['site']}",
           "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "HPC_JABAS_ERROR_GRACE_S": "1"}
    return subprocess.run(["runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()], *cmd],
                          capture_output=True, text=True, timeout=180, cwd=str(cwd or home))


def _errors(p: subprocess.CompletedProcess) -> list[str]:
    """The error lines: a script's ``hpc-jabas: error: ...``, the launcher's logged ``hpc-jabas[0] ERROR: ...``."""
    return [ln for ln in p.stderr.splitlines() if "error:" in ln or " ERROR: " in ln]


def test_a_run_directory_the_neighbour_prepared_with_a_link_is_not_written_through(world):
    precious = world["homes"][VICTIM] / "precious.txt"
    assert _as(VICTIM, world, "sh", "-c", f"echo 'thesis draft' > {precious}").returncode == 0
    run = world["meet"] / "run-victim"
    planted = _as(NEIGHBOUR, world, "sh", "-c", f"mkdir {run} && chmod 777 {run} && "
                  f"ln -s {precious} {run}/metrics.jsonl && ln -s {precious} {run}/.hpc-jabas.lock")
    assert planted.returncode == 0, planted.stderr
    p = _as(VICTIM, world, SYSTEM_PY, str(world["code"] / "ckpt_user.py"), str(run), "1", "1", "sgd", "torch")
    lines = _errors(p)
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert "refusing to use run directory" in lines[0] and str(run) in lines[0], lines
    assert "Traceback" not in p.stderr
    assert precious.read_text() == "thesis draft\n"
    assert sorted(f.name for f in run.iterdir()) == [".hpc-jabas.lock", "metrics.jsonl"]   # nothing of the victim's
    # the control: the same run in a directory of the victim's own trains
    own = world["homes"][VICTIM] / "runs" / world["meet"].name         # new for each run of this test
    p = _as(VICTIM, world, SYSTEM_PY, str(world["code"] / "ckpt_user.py"), str(own), "1", "1", "sgd", "torch")
    assert p.returncode == 0 and "fit: iterations=4" in p.stdout, p.stderr[-3000:]
    shutil.rmtree(own, ignore_errors=True)


def test_a_job_file_the_neighbour_left_never_runs_their_code(world):
    d = world["meet"] / "neighbour-job"
    marker = world["meet"] / "ran-as-victim"
    mod = ("import os, pathlib\n"
           f"pathlib.Path({str(marker)!r}).write_text(str(os.getuid()))\n"
           "def task(config):\n    raise SystemExit(0)\n")
    made = _as(NEIGHBOUR, world, "sh", "-c", f"mkdir -p {d} && cat > {d}/evil_task.py <<'EOF'\n{mod}EOF\n"
               f"cat > {d}/job.toml <<'EOF'\n[job]\ntask = 'evil_task:task'\nchain_dir = '{d}/chain'\n"
               f"pythonpath = ['{d}']\nEOF\nchmod 644 {d}/job.toml {d}/evil_task.py")
    assert made.returncode == 0, made.stderr
    p = _as(VICTIM, world, SYSTEM_PY, "-m", "hpc_jabas.runtime.job.launch", str(d / "job.toml"))
    lines = _errors(p)
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert "job file" in lines[0] and "owned by uid" in lines[0], lines
    assert not marker.exists(), "the neighbour's module ran as the victim"
