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
    assert deep_imports("import hpc_jabas.runtime.comm as c\n") == ["hpc_jabas.runtime.comm"]


def test_errors_quiet_is_a_declared_field_and_one_formatter_prints_them():
    from hpc_jabas.errors import ConfigError, StateError, error_line
    assert error_line(ConfigError("batch=0 is invalid")) == "hpc-jabas: error: batch=0 is invalid"
    assert error_line(ConfigError("said on rank 0", quiet=True)) is None
    assert ConfigError("x").quiet is False and ConfigError("x", quiet=True).quiet is True
    assert issubclass(StateError, hpc_jabas.JabasError) and not issubclass(StateError, ConfigError)
