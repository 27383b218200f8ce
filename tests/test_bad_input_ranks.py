"""When rank 0 has said why a multi-rank run stops (every checkpoint bad), the other ranks stay
quiet: one error line, no Horovod tracebacks; and Horovod's stall check/shutdown have defaults for a hung rank
in every launch path (the job scripts export them; comm.init sets them unless the environment has its own)."""
from __future__ import annotations

import os
import subprocess

import pytest
from mpi_util import PY, ROOT, mpi_env

from hpc_jabas.slurm.sbatch import setup_lines


@pytest.mark.mpi
def test_all_checkpoints_bad_one_line_from_rank_0_only(tmp_path):
    ck = tmp_path / "run" / "checkpoints"
    ck.mkdir(parents=True)
    for name in ("ckpt-000000-000000002.pt", "ckpt-000000-000000004.pt", "ckpt-000001-000000006.pt"):
        (ck / name).write_bytes(b"not a checkpoint " * 64)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "3", PY, str(ROOT / "examples" / "train_digits.py"),
           "--run-dir", str(tmp_path / "run"), "--epochs", "2", "-q"]
    r = subprocess.run(cmd, env=mpi_env(), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    errors = [ln for ln in out.splitlines() if "error" in ln.lower() and "hpc-jabas" in ln]
    assert r.returncode == 2, out
    assert len(errors) == 1 and "no usable checkpoint" in errors[0] and "all 3" in errors[0], out
    assert "Traceback" not in out and "HorovodInternalError" not in out and "horovod" not in out.lower(), out
    assert sorted(os.listdir(ck)) == ["ckpt-000000-000000002.pt", "ckpt-000000-000000004.pt",
                                      "ckpt-000001-000000006.pt"]          # kept, as they were


def test_horovod_stall_defaults_in_every_launch_path():
    code = ("import os; from hpc_jabas.runtime.comm import seam as comm; comm.init(); "
            "print(os.environ['HOROVOD_STALL_CHECK_TIME_SECONDS'], os.environ['HOROVOD_STALL_SHUTDOWN_TIME_SECONDS'])")
    env = {k: v for k, v in mpi_env().items() if not k.startswith("HOROVOD_STALL")}
    r = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.stdout.split() == ["60", "300"], r.stderr
    r = subprocess.run([PY, "-c", code], env={**env, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30"},
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.stdout.split() == ["60", "30"], r.stderr                  # the user's own value wins
    from hpc_jabas.core.config.jobspec import JobSpec
    lines = "\n".join(setup_lines(JobSpec(task="m:f", config={}, chain_dir="/x", mix={"a100": 1})))
    assert 'HOROVOD_STALL_CHECK_TIME_SECONDS="${HOROVOD_STALL_CHECK_TIME_SECONDS:-60}"' in lines
    assert 'HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="${HOROVOD_STALL_SHUTDOWN_TIME_SECONDS:-300}"' in lines
