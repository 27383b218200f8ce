"""Foundation: `hpc-jabas doctor` and one-line CLI misuse (the demo's training on digits: tests/test_demo.py)."""
import os
import subprocess
import sys
from pathlib import Path

from mpi_util import ROOT, mpi_env

HJ = str(Path(sys.executable).parent / "hpc-jabas")


def test_doctor_passes_on_this_machine():
    p = subprocess.run([HJ, "doctor"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for key in ("torch", "horovod", "mpi", "mpi4py", "submitit", "slurm", "lmod"):
        assert any(line.startswith(key) for line in p.stdout.splitlines()), key
    assert "controllers=['MPI', 'Gloo']" in p.stdout and "PyTorch" in p.stdout
    assert "status                 OK" in p.stdout


def test_doctor_reports_missing_sinfo(tmp_path):
    # a PATH that has everything of the real PATH except sinfo
    shadow = tmp_path / "bin"
    shadow.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            src = os.path.join(d, name)
            if name != "sinfo" and not (shadow / name).exists() and os.access(src, os.X_OK):
                (shadow / name).symlink_to(src)
    env = dict(os.environ, PATH=str(shadow))
    p = subprocess.run([HJ, "doctor"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 1, p.stdout
    missing = [ln for ln in p.stdout.splitlines() if ln.startswith("missing:")]
    assert len(missing) == 1 and "sinfo not on PATH" in missing[0] and "apt-get install" in missing[0]


def test_cli_misuse_is_one_line_exit_2():
    p = subprocess.run([HJ, "frobnicate"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "train_digits.py"), "--gpu-types", "v100,k80"],
                       capture_output=True, text=True, timeout=120, env=mpi_env())
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "'k80'" in err[0] and "known types" in err[0]
