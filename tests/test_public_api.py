"""The public surface: ``import hpc_jabas`` gives a user every name they need, is cheap, and the examples
and the Python blocks of the README and the documents run with it import nothing deeper."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hpc_jabas

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ["Trainer", "JobConfig", "Task", "World", "submit", "wait_chain", "JobSpec", "DistributedEval",
          "configure_logging", "add_arguments", "config_from_args", "run_main", "JabasError", "ConfigError",
          "SlurmError", "CheckpointError", "InfeasibleError", "Callback", "Controller", "EpochEndHook", "Decision",
          "MoveDecision"]


def deep_imports(source: str) -> list[str]:
    """Modules under hpc_jabas.* that ``source`` imports (anywhere, lazy imports included)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("hpc_jabas.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpc_jabas."):
            out.append(node.module or "")
    return out


def readme_python_blocks() -> list[str]:
    """The python blocks of the README and of the documents whose blocks run with it (tests/support/documents.py)."""
    from support.documents import all_blocks
    return [b.text for b in all_blocks() if b.lang == "python"]


def test_every_public_name_resolves_and_the_needed_ones_are_there():
    assert set(NEEDED) <= set(hpc_jabas.__all__), sorted(set(NEEDED) - set(hpc_jabas.__all__))
    for name in hpc_jabas.__all__:
        assert getattr(hpc_jabas, name) is not None, name
    assert set(hpc_jabas.__all__) <= set(dir(hpc_jabas))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        hpc_jabas.Nope      # noqa: B018


def test_importing_the_package_loads_no_torch_horovod_or_submitit():
    code = ("import sys, hpc_jabas; "
            "print(sorted(m for m in ('torch', 'horovod', 'submitit', 'mpi4py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_examples_import_nothing_deeper_than_hpc_jabas(path):
    assert deep_imports(path.read_text()) == []


def test_readme_python_blocks_import_nothing_deeper_than_hpc_jabas():
    blocks = readme_python_blocks()
    assert blocks, "no python block found in the README"
    bad = [m for b in blocks for m in deep_imports(b)]
    assert bad == []


def test_the_check_sees_a_deep_import():
    src = "import hpc_jabas\nfrom hpc_jabas import Trainer\ndef f():\n    from hpc_jabas.log import configure\n"
    assert deep_imports(src) == ["hpc_jabas.log"]
    assert deep_imports("import hpc_jabas.runtime.comm.seam as c\n") == ["hpc_jabas.runtime.comm.seam"]


def test_errors_quiet_is_a_declared_field_and_one_formatter_prints_them():
    from hpc_jabas.errors import ConfigError, StateError, error_line
    assert error_line(ConfigError("batch=0 is invalid")) == "hpc-jabas: error: batch=0 is invalid"
    assert error_line(ConfigError("said on rank 0", quiet=True)) is None
    assert ConfigError("x").quiet is False and ConfigError("x", quiet=True).quiet is True
    assert issubclass(StateError, hpc_jabas.JabasError) and not issubclass(StateError, ConfigError)


#: public names that only a Slurm cluster exercises as a user would (the README test submits through them)
SLURM_ONLY = {"submit", "Submission", "wait_chain"}
#: the user scripts that run from a clean directory, each started by the test named beside it
USER_SCRIPTS = {"public_names_user.py": "test_public_api.py", "public_layer_user.py": "test_public_layer.py",
                "jabas_loop_user.py": "test_public_layer_loop.py"}


def public_names_used(source: str) -> set[str]:
    """The names of ``hpc_jabas`` a script uses: ``from hpc_jabas import X`` and ``hpc_jabas.X``."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "hpc_jabas":
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "hpc_jabas":
            out.add(node.attr)
    return out


def test_every_public_name_is_used_by_a_user_script_that_a_test_runs():
    used = set()
    for script, test in USER_SCRIPTS.items():
        src = (ROOT / "tests" / "workers" / script).read_text()
        assert deep_imports(src) == [] and script in (ROOT / "tests" / test).read_text()
        used |= public_names_used(src)
    assert set(hpc_jabas.__all__) - used - SLURM_ONLY == set()
    assert used <= set(hpc_jabas.__all__), used - set(hpc_jabas.__all__)


def test_every_public_name_runs_from_a_clean_directory_as_a_user_script(tmp_path):
    """tests/workers/public_names_user.py, one process: its own command line, a user-written Controller (B
    doubles at iteration 3), EpochEndHook (stays) and Callback handed to the Trainer."""
    import json
    import os
    import shutil
    script = ROOT / "tests" / "workers" / "public_names_user.py"
    shutil.copy(script, tmp_path / script.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_JABAS_", "PYTHONPATH", "OMPI_", "PMIX_"))}
    p = subprocess.run([sys.executable, script.name, "--batch", "16", "--micro-batch", "8", "--epochs", "2",
                        "--run-dir", "run", "-q"], cwd=tmp_path, env=dict(env, OMP_NUM_THREADS="1"),
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout[-2000:] + p.stderr[-4000:]
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    assert seen["b_trajectory"] == [[0, 16], [3, 32]]            # the user's controller's decision, applied
    # 96 samples: B 16 x 3, then 32, then the tail of 16; epoch 1: 32 x 3
    assert seen["iterations"] == 8 and seen["steps"] == 8 and seen["samples"] == 192
    assert seen["decided_epochs"] == [0, 1] and seen["world"] == [0, 1] and seen["report"] == ["rank", "0"]
    assert seen["errors"] == ["batch=0 must be an integer >= 1",
                              "plan n=[0, 0] has no micro-batch at all; at least one count must be >= 1"]
    assert seen["spec"] == ["public_names_user:build", 5]
