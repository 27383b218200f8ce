"""scripts/setup.sh's layout (docs/toolchain.md, README): the third-party packages live in a shared environment
under the cache, built once per dependency set, and the clone's .venv is a small venv on top of it."""
from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"


def test_the_clone_venv_stands_on_a_complete_shared_environment():
    base = Path((VENV / ".hpc-jabas-env").read_text().strip())
    assert base.name.startswith("env-") and (base / ".complete").is_file(), base
    site = Path(sysconfig.get_path("purelib", vars={"base": str(VENV), "platbase": str(VENV)}))
    (pth,) = site.glob("_hpc_jabas_env.pth")
    shared_site = Path(pth.read_text().strip())
    assert shared_site.is_relative_to(base), (shared_site, base)
    # torch and Horovod come from the shared environment, hpc_jabas from this clone (editable), through the
    # clone's own python; the shared environment's commands run on it too
    probe = ("import torch, horovod, hpc_jabas, sys; "
             "print(torch.__file__); print(horovod.__file__); print(hpc_jabas.__file__); print(sys.prefix)")
    out = subprocess.run([str(VENV / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert Path(out[0]).is_relative_to(shared_site) and Path(out[1]).is_relative_to(shared_site), out
    assert Path(out[2]).is_relative_to(ROOT) and Path(out[3]) == VENV, out
    first = (VENV / "bin" / "horovodrun").read_text().splitlines()[0]
    assert first == f"#!{VENV}/bin/python", first
