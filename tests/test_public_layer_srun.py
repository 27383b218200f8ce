"""The keep-your-loop API (``hpc_jabas.Jabas``, over the public layer) from the installed wheel under srun on the
local Slurm cluster: tests/workers/jabas_loop_user.py, a user's script that imports only ``hpc_jabas`` and torch,
copied into a directory every node sees and started by srun on 3 ranks over 2 nodes with the interpreter of a new
environment that holds the wheel (not the checkout). Two steps side by side: Horovod with the script's own
hvd.init() (srun's PMIx plugin), and torch with no init of the script's own (``hpc_jabas.init()`` inside Jabas
reads the ranks and the rendezvous from Slurm's variables). Each must be exact against the one-process big-batch
reference (<= 1e-12 relative, float64) with B changes, a rank with zero micro-batches, a mid-epoch resume and
adaptive B: the checks of tests/test_public_layer_loop.py."""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.package import build_wheel
from test_public_layer_loop import USER, check_user_run


def _wheel_env(where: Path) -> Path:
    """A new environment under ``where`` with the checkout's wheel installed (not editable) and the shared
    third-party environment on its path (as tests/test_wheel.py builds it); its interpreter."""
    whl = build_wheel(where / "build")
    venv = where / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(site) / "_shared_env.pth").write_text(f"{Path(str(md.distribution('torch').locate_file(''))).resolve()}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-index", str(whl)],
                       env={**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return vpy


@pytest.mark.slurm
def test_jabas_from_the_wheel_under_srun_is_exact_on_both_backends(slurm_cluster, slurm_tmp):
    vpy = _wheel_env(slurm_tmp)
    env = {k: v for k, v in slurm_cluster.env.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV",
                                                                              "HPC_JABAS_BACKEND"))}
    runs = {}
    for backend, init, mpi in (("horovod", "hvd", "pmix"), ("torch", "none", "none")):
        d = slurm_tmp / backend
        d.mkdir()
        shutil.copy(USER, d / USER.name)
        cmd = ["srun", "-p", "v100", "-N", "2", "-n", "3", f"--mpi={mpi}", "--kill-on-bad-exit=1", "-t", "4",
               f"--chdir={d}", f"--export=ALL,OMP_NUM_THREADS=1,HPC_JABAS_BACKEND={backend}", str(vpy), USER.name,
               init, str(d)]
        runs[backend] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for backend, p in runs.items():
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0 and "Traceback" not in out, f"{backend}: {out[-5000:]}"
        d = slurm_tmp / backend
        check_user_run(json.loads((d / "out.json").read_text()), backend)
        got = subprocess.run([str(vpy), "-c", "import hpc_jabas; print(hpc_jabas.__file__)"], cwd=d, env=env,
                             capture_output=True, text=True, timeout=60).stdout.strip()
        assert str(vpy.parent.parent) in got and not got.startswith(str(Path(__file__).resolve().parents[1])), got
