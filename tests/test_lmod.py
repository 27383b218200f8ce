"""The Lmod modulefile (modulefiles/hpc-jabas/0.1.0.lua) loads in a plain (non-login, --noprofile --norc) bash after
Lmod's init script and puts hpc-jabas on PATH."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def _bash(script: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LMOD", "MODULE", "_ModuleTable", "__LMOD"))}
    env.pop("HPC_JABAS_ROOT", None)
    return subprocess.run(["bash", "--noprofile", "--norc", "-c", script], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.fixture(scope="module")
def lmod():
    if not LMOD_INIT.exists():   # scripts/setup.sh installs it: missing is a set-up failure
        pytest.fail(f"Lmod not installed ({LMOD_INIT}); apt-get install lmod", pytrace=False)
    return LMOD_INIT


def test_module_loads_and_puts_hpc_jabas_on_path(lmod):
    r = _bash(f"""set -e
source {lmod}
module use {ROOT}/modulefiles
module load hpc-jabas
module list 2>&1
echo "ROOT=$HPC_JABAS_ROOT"
echo "PYTHONPATH=$PYTHONPATH"
echo "WHICH=$(which hpc-jabas)"
hpc-jabas --help >/dev/null && echo HELP_OK || echo HELP_MISSING
""")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "hpc-jabas/0.1.0" in out
    assert f"ROOT={ROOT}" in out
    assert str(ROOT) in out.split("PYTHONPATH=", 1)[1].splitlines()[0].split(":")
    which = out.split("WHICH=", 1)[1].splitlines()[0].strip()
    assert which == str(ROOT / ".venv" / "bin" / "hpc-jabas"), out
    if (ROOT / "hpc_jabas" / "cli.py").exists():
        assert "HELP_OK" in out, out


def test_module_whatis_help_and_unload(lmod):
    r = _bash(f"""source {lmod}
module use {ROOT}/modulefiles
module whatis hpc-jabas 2>&1
module help hpc-jabas 2>&1
echo "BEFORE=$PATH"
module load hpc-jabas; module unload hpc-jabas
echo "AFTER=${{HPC_JABAS_ROOT:-unset}}"; echo "PATH=$PATH"
""")
    out = r.stdout + r.stderr
    assert "Description: adaptive batch size" in out and "Module Specific Help" in out
    assert "AFTER=unset" in out
    before = out.split("BEFORE=", 1)[1].splitlines()[0]
    after = out.split("\nPATH=", 1)[1].splitlines()[0]
    assert set(after.split(":")) == set(before.split(":"))   # Lmod may drop duplicate entries


def test_module_root_follows_the_clone(lmod, tmp_path):
    """Copied elsewhere, the modulefile points at the copy, not at this checkout."""
    clone = tmp_path / "elsewhere"
    shutil.copytree(ROOT / "modulefiles", clone / "modulefiles")
    r = _bash(f"source {lmod}; module use {clone}/modulefiles; module load hpc-jabas 2>&1; "
              "echo ROOT=$HPC_JABAS_ROOT")
    assert f"ROOT={clone}" in r.stdout, r.stdout + r.stderr


def test_non_login_shell_needs_lmod_init_first(lmod):
    """What the README shows: a plain (non-login) bash has no `module` until Lmod's init is sourced."""
    r = _bash(f"""type module >/dev/null 2>&1 && echo BEFORE=defined || echo BEFORE=missing
shopt -q login_shell && echo LOGIN=yes || echo LOGIN=no
source {lmod}
type module >/dev/null 2>&1 && echo AFTER=defined || echo AFTER=missing
module use {ROOT}/modulefiles && module load hpc-jabas && echo "ROOT=$HPC_JABAS_ROOT"
""")
    out = r.stdout + r.stderr
    assert "LOGIN=no" in out and "BEFORE=missing" in out and "AFTER=defined" in out, out
    assert f"ROOT={ROOT}" in out, out
    readme = (ROOT / "README.md").read_text()
    assert 0 <= readme.find(f"source {lmod}") < readme.find("module use modulefiles")
