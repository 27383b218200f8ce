"""scripts/gpu_check.sh cannot run here (no GPU); its logic can: the shell's plumbing and the two-rank
equivalence step through ``--cpu`` (torchrun, the torch backend on Gloo, against the independent one-big-batch
reference), and the other Python steps in this process (scripts/gpu_check.py: the same functions the script
calls, on the CPU)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kv(line: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in line.split() if "=" in w)


def test_the_script_parses_and_refuses_a_bad_flag_in_one_line(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    for bad, say in (("--bogus", "unknown flag --bogus"), ("--only=info,nope", "--only: unknown step nope")):
        r = subprocess.run(["bash", str(SCRIPT), bad, str(tmp_path)], capture_output=True, text=True, timeout=30)
        lines = r.stdout.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and say in lines[0], r.stdout + r.stderr


def test_cpu_run_of_the_shell_steps_ends_with_a_key_value_line(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), "--cpu", "--only=equiv", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and all(ln.startswith("gpu_check: ") for ln in lines[:-1]), r.stdout + r.stderr
    last = _kv(lines[-1])
    assert last["cuda"] == "0" and last["equiv_ok"] == "1", lines[-1]
    assert last["info"] == last["nccl"] == last["timing"] == last["amp"] == last["oom"] == "skipped" \
        and last["horovod"] == "skipped"
    assert float(last["equiv_max_rel_err"]) <= 1e-9 and last["equiv_backend"] == "torch/gloo", lines[-1]
    equiv = json.loads((tmp_path / "out" / "equiv.json").read_text())
    assert equiv["ranks"] == 2 and equiv["moved"] > 1e-3            # the comparison is not vacuous
    assert sum(ln.startswith("gpu_check: equiv ok=1") for ln in lines) == 1


PY_STEPS = ("info", "nccl", "timing", "amp", "oom")


@pytest.fixture(scope="module")
def py_steps(tmp_path_factory):
    """The Python steps in one fresh process, as the script runs them (the torch backend: a pytest process may
    already run Horovod from an earlier in-process test, and one process runs one backend)."""
    out = tmp_path_factory.mktemp("gpu-check")
    code = ("import sys, importlib.util as u; s = u.spec_from_file_location('gpu_check', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); from pathlib import Path; "
            "sys.exit(max(m.run(k, Path(sys.argv[2])) for k in sys.argv[3:]))")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts" / "gpu_check.py"), str(out), *PY_STEPS],
                       capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    return r, out


@pytest.mark.parametrize("step", PY_STEPS)
def test_the_python_steps_on_the_cpu(py_steps, step):
    r, out = py_steps
    gc = _module()
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith(f"gpu_check: {step} ")][-1]
    d = json.loads((out / f"{step}.json").read_text())
    assert line.startswith(f"gpu_check: {step} ok=1") and d["ok"] == 1, line
    if step == "info":
        assert d["devices"] == 0 and d["cuda"] == "none" and d["torch"].startswith("2.")
    if step == "nccl":
        assert d["max_rel_err"] <= 1e-9 and d["backend"] == "gloo"       # NCCL on CUDA; Gloo is what the CPU has
    if step == "timing":
        assert d["events"] == 0 and d["slow_wait_s"] >= 0.8 * gc.STEP_S > d["next_compute_s"]
    if step == "amp":
        assert "->" in d["bf16_loss"] and d["fp16_scale"] > 0
    if step == "oom":
        assert d["probe"] == "skipped (CUDA only)"


def test_a_failing_step_is_still_one_line_with_ok_0(tmp_path, capsys, monkeypatch):
    gc = _module()
    monkeypatch.setitem(gc.STEPS_BY_NAME, "timing", lambda out: 1 / 0)
    assert gc.run("timing", tmp_path) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gpu_check: ")]
    assert lines == ["gpu_check: timing ok=0 error=ZeroDivisionError:'division by zero'"], lines
