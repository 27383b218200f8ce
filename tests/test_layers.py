"""The layers of hpc_jabas, checked on the source text. Every import counts: lazy ones inside functions and
``if TYPE_CHECKING`` ones included (a type named from above is an arrow back up too).

Between the packages (cli -> runtime -> slurm -> core -> the root leaves):
- core/ is pure: no torch, horovod, mpi4py, submitit, subprocess or clock, and only core + the leaves
  (errors, settings, and trust: the owner and mode checks a config file passes before core/config reads it)
  from the package;
- slurm/ never imports runtime/ or cli/; runtime/ never imports cli/;
- the root modules (errors, settings, trust, log) import only each other: nothing in the package's root points up.

Inside core/ and runtime/, the sub-packages (SUBLAYERS) are layers of their own, bottom first:
- core: config < perf < planning < adaptive, balancing < autoscale < sim;
- runtime: comm < persist < the loop (runtime/'s own modules) < profiling < job.
A module imports only from its own sub-package or from one ranked lower; two sub-packages of one rank never import
each other.

And:
- exactly one module imports horovod (runtime/comm/horovod_backend.py, the Horovod backend of runtime/comm/seam.py);
- core/config/sections.py imports no implementation module: its choices and defaults come from
  core/config/defaults.py, and besides that it uses only the schema and leaf modules (the GPU catalog, the
  slowdown spec);
- no import cycle between the package's modules;
- no module over MAX_LINES lines: a backstop against a module that holds everything, not a target. A module
  is split where it has a seam (a concern of its own, with its own tests), never only to get under a number.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "hpc_jabas"
FORBIDDEN_IN_CORE = {"torch", "horovod", "mpi4py", "submitit", "subprocess", "time", "datetime", "psutil",
                     "pynvml", "socket", "threading", "multiprocessing"}
RANK = {"core": 0, "slurm": 1, "runtime": 2, "cli": 3}
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names of every module imported anywhere in the file (relative ones resolved)."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}   # `from pkg import module`
    return found


MODS = _modules()


def _internal(name: str) -> set[str]:
    return {m for m in _imports(name, MODS[name]) if m in MODS and m != name and m != "hpc_jabas"}


@pytest.mark.parametrize("name", [m for m in MODS if m.startswith("hpc_jabas.core")])
def test_core_is_pure(name):
    bad = {m for m in _imports(name, MODS[name]) if m.split(".")[0] in FORBIDDEN_IN_CORE}
    assert not bad, f"{name} imports {sorted(bad)}"
    up = {m for m in _internal(name) if not (m.startswith("hpc_jabas.core") or m in LEAVES)}
    assert not up, f"{name} imports {sorted(up)} from outside core/"


#: the package's leaf modules core/ may use: nothing of the package besides errors and the other leaves inside
#: them (trust reads HPC_JABAS_TRUST_GROUP through settings, the one reader of HPC_JABAS_* variables)
LEAVES = {"hpc_jabas.errors", "hpc_jabas.trust", "hpc_jabas.settings"}


def test_the_leaves_import_nothing_of_the_package_but_errors():
    for leaf in LEAVES:
        assert _internal(leaf) <= LEAVES - {leaf}, f"{leaf} imports {sorted(_internal(leaf))}"
    assert _internal("hpc_jabas.settings") == {"hpc_jabas.errors"}


def test_layers_point_down():
    wrong = []
    for name in MODS:
        layer = name.split(".")[1] if name.count(".") >= 1 else None
        if layer not in RANK:
            continue
        for m in _internal(name):
            other = m.split(".")[1] if m.count(".") >= 1 else None
            if other in RANK and RANK[other] > RANK[layer]:
                wrong.append(f"{name} -> {m}")
    assert not wrong, wrong


#: the sub-packages of core/ and runtime/, by rank, bottom first ("" : the package's own modules)
SUBLAYERS = {
    "core": {"config": 0, "perf": 1, "planning": 2, "adaptive": 3, "balancing": 3, "autoscale": 4, "sim": 5},
    "runtime": {"comm": 0, "persist": 1, "": 2, "profiling": 3, "job": 4},
}
#: the modules of the package's root besides its __init__ (the public API, the top): leaves, below everything
ROOT_LEAVES = {"hpc_jabas.errors", "hpc_jabas.settings", "hpc_jabas.trust", "hpc_jabas.log"}


def _sub(name: str) -> tuple[str, str] | None:
    """(layer, sub-package) of a module under core/ or runtime/ ("" for the layer's own modules)."""
    parts = name.split(".")
    if len(parts) < 3 or parts[1] not in SUBLAYERS:
        return None
    if len(parts) == 3 and parts[2] not in SUBLAYERS[parts[1]]:
        return parts[1], ""          # a module of the layer itself (or the layer's __init__: parts == 2)
    return parts[1], parts[2]


def test_every_subpackage_is_ranked():
    for layer, ranks in SUBLAYERS.items():
        found = {p.name for p in (PKG / layer).iterdir() if (p / "__init__.py").exists()}
        assert found == set(ranks) - {""}, f"{layer}/ has {sorted(found)}; SUBLAYERS ranks {sorted(ranks)}"
    assert len(SUBLAYERS["core"]) >= 5 and len(SUBLAYERS["runtime"]) >= 3


def test_subpackages_point_down():
    wrong = []
    for name in MODS:
        me = _sub(name)
        if me is None:
            continue
        ranks = SUBLAYERS[me[0]]
        for m in _internal(name):
            other = _sub(m)
            if other is None or other[0] != me[0] or other[1] == me[1]:
                continue
            if ranks[other[1]] >= ranks[me[1]]:
                wrong.append(f"{name} -> {m}")
    assert not wrong, "imports that point up or sideways between sub-packages:\n" + "\n".join(sorted(wrong))


def test_the_root_modules_are_leaves():
    for name in ROOT_LEAVES:
        assert _internal(name) <= ROOT_LEAVES, f"{name} imports {sorted(_internal(name) - ROOT_LEAVES)}"
    roots = {n for n, p in MODS.items() if n.count(".") == 1 and p.name != "__init__.py"}
    assert roots == ROOT_LEAVES, f"a new module in the package's root: {sorted(roots - ROOT_LEAVES)}"


def test_the_sublayer_check_sees_a_violation():
    assert _sub("hpc_jabas.core.config.validate") == ("core", "config")
    assert _sub("hpc_jabas.runtime.trainer") == ("runtime", "")
    assert SUBLAYERS["core"]["perf"] < SUBLAYERS["core"]["planning"]   # perf -> planning would be found


def test_one_module_imports_horovod():
    users = sorted(n for n in MODS if any(m.split(".")[0] == "horovod" for m in _imports(n, MODS[n])))
    assert users == ["hpc_jabas.runtime.comm.horovod_backend"], users


#: what core/config/sections.py may import from the package: its defaults, its generic half (the schema) and the
#: leaves it validates with (GPU type names, slowdown specs, the one number checker core/config/validate.py, which
#: the schema decides with), the one text-file reader (core/config/textfile.py), the trust check of the files it reads
#: and the environment settings that check reads (HPC_JABAS_TRUST_GROUP)
CONFIG_MAY_IMPORT = {"hpc_jabas.core.config." + m for m in ("defaults", "schema", "gpus", "slowdown", "textfile",
                                                             "validate")} | {"hpc_jabas.trust", "hpc_jabas.settings"}


def test_config_imports_no_implementation_module():
    pkgs = ("hpc_jabas.core", "hpc_jabas.core.config", "hpc_jabas.errors")
    core = {m for m in _internal("hpc_jabas.core.config.sections") if m not in pkgs}
    assert core <= CONFIG_MAY_IMPORT, f"core/config/sections.py imports {sorted(core - CONFIG_MAY_IMPORT)}"
    for leaf in CONFIG_MAY_IMPORT:      # none of them pulls an implementation module in behind config's back
        may = {"hpc_jabas.errors", "hpc_jabas.core.config"} | (CONFIG_MAY_IMPORT - {"hpc_jabas.core.config.schema"})
        assert _internal(leaf) <= may - {leaf}, f"{leaf} imports {sorted(_internal(leaf))}"


def test_no_import_cycle():
    graph = {n: _internal(n) for n in MODS}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    assert len(state) == len(MODS)


def test_no_module_over_the_size_cap():
    long = {n: len(p.read_text().splitlines()) for n, p in MODS.items()}
    over = {n: k for n, k in long.items() if k > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines (split along a seam): {over}"


def test_the_check_sees_a_violation(tmp_path):
    # the checker itself can fail: a lazy torch import inside a function is found
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import torch\n    from time import monotonic\n")
    assert {"torch", "time"} <= _imports("x.m", f)
