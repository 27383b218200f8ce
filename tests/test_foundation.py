"""Foundation: `hpc-jabas doctor` and the demo's training on real data (digits)."""
import json
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


def test_demo_training_reaches_90_percent(tmp_path):
    summary = tmp_path / "summary.json"
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "3", sys.executable,
           str(ROOT / "examples" / "train_digits.py"), "--emulate", "--gpu-types", "v100,p100,rtx2060",
           "--batch", "128", "--epochs", "8", "--run-dir", str(tmp_path / "run"), "--summary", str(summary)]
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(summary.read_text())
    assert res["test_acc"] >= 0.90, res
    # per-rank throughput lines, one per rank, all ranks did work
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("rank ")]
    assert len(lines) == 3 and all("samples_per_s=" in ln for ln in lines)
    samples = [int(ln.split("samples=")[1].split()[0]) for ln in lines]
    assert min(samples) > 0 and samples[0] > samples[2]     # the emulated V100 did more than the RTX 2060
    metrics = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    its = [m for m in metrics if m["type"] == "iteration"]
    assert len(its) == res["iterations"] and all(len(m["compute_s"]) == 3 for m in its)


def test_cli_misuse_is_one_line_exit_2():
    p = subprocess.run([HJ, "frobnicate"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "train_digits.py"), "--gpu-types", "v100,k80"],
                       capture_output=True, text=True, timeout=120, env=mpi_env())
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "'k80'" in err[0] and "known types" in err[0]
