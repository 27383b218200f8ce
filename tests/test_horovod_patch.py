"""scripts/horovod_cycle_patch.py (docs/toolchain.md): the one-line edit of Horovod's background loop that keeps
the ranks' cycles in phase on CPU builds, and that the Horovod this suite runs was built with it."""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import horovod_cycle_patch as hcp  # noqa: E402

LOOP = """bool RunLoopOnce(HorovodGlobalState& state) {
  auto start_time = std::chrono::steady_clock::now();
  auto sleep_duration = state.last_cycle_start +
                        std::chrono::microseconds(long(
                            state.parameter_manager.CycleTimeMs() * 1000.)) -
                        start_time;
"""


def _tree(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "horovod" / "common" / "operations.cc"
    f.parent.mkdir(parents=True)
    f.write_text(text)
    return f


def test_the_edit_sleeps_from_the_end_of_the_last_cycle_once(tmp_path):
    f = _tree(tmp_path, LOOP)
    hcp.patch(tmp_path)
    once = f.read_text()
    assert "state.last_cycle_start +" not in once and "auto sleep_duration = start_time +" in once
    assert once.count("start_time") == 3        # taken, then used twice: the sleep is one cycle from now
    hcp.patch(tmp_path)                          # a second run changes nothing
    assert f.read_text() == once


@pytest.mark.parametrize("text", ["", LOOP + LOOP], ids=["absent", "twice"])
def test_unexpected_code_is_refused_and_left_alone(tmp_path, text):
    f = _tree(tmp_path, text)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "horovod_cycle_patch.py"), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Horovod 0.28.1" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert f.read_text() == text


def test_the_installed_horovod_is_the_build_setup_chose():
    """scripts/setup.sh installs Horovod from the wheel folder named after its build: on a CPU build the edited
    one (this script's hash in the name), with CUDA torch and NCCL the NCCL one, unedited; pip records the wheel
    it installed from (direct_url.json). No skip: both branches are checked."""
    import torch
    url = json.loads(md.distribution("horovod").read_text("direct_url.json") or "{}").get("url", "")
    digest = hashlib.sha256((ROOT / "scripts" / "horovod_cycle_patch.py").read_bytes()).hexdigest()[:8]
    if "-nccl/horovod-0.28.1-" in url:          # setup.sh's GPU build: only where torch sees CUDA
        assert torch.cuda.is_available() and "inphase" not in url, url
    else:
        assert f"-cpu-inphase-{digest}/horovod-0.28.1-" in url, url
