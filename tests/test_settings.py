"""hpc_jabas/settings.py: the one reader of HPC_JABAS_* variables; every bad value is one line naming it."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_jabas import settings
from hpc_jabas.core.config.defaults import BACKENDS
from hpc_jabas.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1] / "hpc_jabas"
NAME = re.compile(r"HPC_JABAS_[A-Z0-9_]*")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def ours_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of every HPC_JABAS_ variable name in the code as a string constant (or an f-string's
    head), other than a docstring: the name of one of our variables where the code can read it."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and NAME.fullmatch(head.value):
                out.append((node.lineno, head.value))
            skip |= {id(v) for v in node.values}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if NAME.fullmatch(node.value):
                out.append((node.lineno, node.value))
    return out


def test_the_checker_finds_reads():
    src = '''
import os
def f(env, k):
    """HPC_JABAS_LOG in a docstring is no read."""
    a = os.environ.get("HPC_JABAS_TORCH_TIMEOUT_S", "300")
    b = env["HPC_JABAS_BACKEND"]
    c = env.get(f"HPC_JABAS_{k}")
    d = "text that names HPC_JABAS_DEBUG in a message"
'''
    assert sorted(n for _, n in ours_reads(src)) == ["HPC_JABAS_", "HPC_JABAS_BACKEND", "HPC_JABAS_TORCH_TIMEOUT_S"]


def test_only_settings_reads_our_variables():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        if rel == "hpc_jabas/settings.py":
            continue
        found += [f"{rel}:{line}: {name}" for line, name in ours_reads(path.read_text())]
    assert found == [], "read HPC_JABAS_* variables through hpc_jabas.settings:\n" + "\n".join(found)


def test_every_variable_has_a_getter_or_is_shell_only():
    names = [v.name for v in settings.VARIABLES]
    assert len(names) == len(set(names)) == 11
    assert set(names) - set(settings.GETTERS) == {settings.CACHE, settings.VENV}
    assert settings.BACKENDS == BACKENDS


def test_defaults():
    assert settings.torch_timeout_s({}) == 300.0
    assert settings.heartbeat_s({}) == 20.0 and settings.heartbeat_s({"HPC_JABAS_HEARTBEAT_S": "0"}) == 0.0
    assert settings.error_grace_s({}) == 10.0
    assert settings.backend({}) is None and settings.log_level({}) is None and settings.progress({}) is None
    assert settings.debug({}) is False and settings.trust_group({}) is False and settings.shared_tmp({}) == []
    settings.check({})


def test_good_values():
    assert settings.torch_timeout_s({"HPC_JABAS_TORCH_TIMEOUT_S": " 30.5 "}) == 30.5
    assert settings.error_grace_s({"HPC_JABAS_ERROR_GRACE_S": "0"}) == 0.0
    assert settings.backend({"HPC_JABAS_BACKEND": "Torch"}) == "torch"
    assert settings.progress({"HPC_JABAS_PROGRESS": "off"}) is False
    assert settings.progress({"HPC_JABAS_PROGRESS": "1"}) is True
    assert settings.trust_group({"HPC_JABAS_TRUST_GROUP": "1"}) is True
    assert settings.debug({"HPC_JABAS_DEBUG": "yes"}) is True
    assert settings.log_level({"HPC_JABAS_LOG": "DEBUG"}) == "debug"
    assert settings.shared_tmp({"HPC_JABAS_SHARED_TMP": "/var/tmp::/scratch/t"}) == ["/var/tmp", "/scratch/t"]


BAD = [
    ("HPC_JABAS_TORCH_TIMEOUT_S", "abc", "a finite number of seconds > 0"),
    ("HPC_JABAS_TORCH_TIMEOUT_S", "0", "a finite number of seconds > 0"),
    ("HPC_JABAS_TORCH_TIMEOUT_S", "inf", "a finite number of seconds > 0"),
    ("HPC_JABAS_ERROR_GRACE_S", "-1", "a finite number of seconds >= 0"),
    ("HPC_JABAS_ERROR_GRACE_S", "nan", "a finite number of seconds >= 0"),
    ("HPC_JABAS_HEARTBEAT_S", "-5", "a finite number of seconds >= 0"),
    ("HPC_JABAS_BACKEND", "mpi", "one of horovod, torch, auto"),
    ("HPC_JABAS_PROGRESS", "maybe", "one of 1, true, yes, on, 0, false, no, off, auto"),
    ("HPC_JABAS_DEBUG", "2", "one of 1, true, yes, on, 0, false, no, off"),
    ("HPC_JABAS_LOG", "verbose", "one of debug, info, warning, quiet, error"),
    ("HPC_JABAS_TRUST_GROUP", "group", "one of 1, true, yes, on, 0, false, no, off"),
    ("HPC_JABAS_SHARED_TMP", "/var/tmp:scratch", "colon-separated absolute paths"),
]


@pytest.mark.parametrize("name,value,rule", BAD)
def test_a_bad_value_is_one_line_naming_it(name, value, rule):
    with pytest.raises(ConfigError) as ei:
        settings.check({name: value})
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"{name}={value!r} in the environment is invalid; it must be {rule}"), msg


def test_a_bad_timeout_is_one_line_at_start_up_not_a_traceback(tmp_path):
    """HPC_JABAS_TORCH_TIMEOUT_S=abc was a ValueError traceback at the import of the torch backend."""
    script = tmp_path / "s.py"
    script.write_text("import hpc_jabas\nfrom hpc_jabas.runtime.comm import seam as comm, torch_backend as comm_torch\n"
                      "comm.use('torch')\n"
                      "comm.init()\nprint('started')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "TORCHELASTIC"))}
    env.update(HPC_JABAS_TORCH_TIMEOUT_S="abc", PYTHONPATH=str(ROOT.parent))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["hpc-jabas: error: HPC_JABAS_TORCH_TIMEOUT_S='abc' in the environment is "
                                     "invalid; it must be a finite number of seconds > 0"], r.stderr
