"""The shape of hpc_jabas's code: no function over 80 lines and no class over 400 (tests/test_layers.py caps a
module at 600), but those on explicit lists that may only shrink, and no docstring or comment that names a module
of the package (``hpc_jabas.x.y``, or a ``module.function`` of one) that does not exist. The checks read the
source (ast, tokenize); nothing is imported."""
from __future__ import annotations

import ast
import importlib.util
import io
import re
import sys
import tokenize
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "hpc_jabas"
MAX_LINES = 80

#: functions still over MAX_LINES (module path, qualified name): empty, and nothing goes on it (the test
#: fails on a listed function that is no longer over the limit, so the list stays true)
OVER_80: set[tuple[str, str]] = set()


def modules() -> dict[str, Path]:
    """dotted module name -> file, for every module of the package."""
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def function_lengths(tree: ast.AST) -> list[tuple[str, int]]:
    """(qualified name, lines from def to the last line of its body) of every function, nested ones too."""
    out = []

    def walk(node: ast.AST, prefix: str) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + ch.name, ch.end_lineno - ch.lineno + 1))
                walk(ch, prefix + ch.name + ".")
            elif isinstance(ch, ast.ClassDef):
                walk(ch, prefix + ch.name + ".")
            else:
                walk(ch, prefix)
    walk(tree, "")
    return out


def test_function_lengths_are_measured_as_written():
    src = ("def f():\n" + "    x = 1\n" * 5
           + "class C:\n    def g(self):\n        def h():\n            pass\n        return h\n")
    assert function_lengths(ast.parse(src)) == [("f", 6), ("C.g", 4), ("C.g.h", 2)]


def test_no_function_over_80_lines():
    over = set()
    lengths = {}
    for p in modules().values():
        rel = p.relative_to(REPO).as_posix()
        for name, n in function_lengths(ast.parse(p.read_text())):
            if n > MAX_LINES:
                over.add((rel, name))
                lengths[(rel, name)] = n
    new = sorted(f"{m}: {f} ({lengths[(m, f)]} lines)" for m, f in over - OVER_80)
    assert not new, f"functions over {MAX_LINES} lines (split them along a seam):\n" + "\n".join(new)
    done = sorted(f"{m}: {f}" for m, f in OVER_80 - over)
    assert not done, "no longer over the limit: take them off OVER_80 in tests/test_code_shape.py:\n" + "\n".join(done)


#: no class over this many lines (issue 59): a class that holds several concerns is split along its seams
MAX_CLASS_LINES = 400

#: classes still over MAX_CLASS_LINES (module path, class name): nothing goes on it, and the test fails on a listed
#: class that is no longer over the limit, so the list stays true
OVER_400: set[tuple[str, str]] = set()


def class_lengths(tree: ast.AST) -> list[tuple[str, int]]:
    """(qualified name, lines from ``class`` to the last line of its body) of every class, nested ones too."""
    out = []

    def walk(node: ast.AST, prefix: str) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.ClassDef):
                out.append((prefix + ch.name, ch.end_lineno - ch.lineno + 1))
                walk(ch, prefix + ch.name + ".")
            elif isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(ch, prefix + ch.name + ".")
            else:
                walk(ch, prefix)
    walk(tree, "")
    return out


def test_class_lengths_are_measured_as_written():
    src = "class A:\n    x = 1\n    class B:\n        pass\n\n\ndef f():\n    class C:\n        y = 2\n        z = 3\n"
    assert class_lengths(ast.parse(src)) == [("A", 4), ("A.B", 2), ("f.C", 3)]


def test_no_class_over_400_lines():
    over, lengths = set(), {}
    for p in modules().values():
        rel = p.relative_to(REPO).as_posix()
        for name, n in class_lengths(ast.parse(p.read_text())):
            if n > MAX_CLASS_LINES:
                over.add((rel, name))
                lengths[(rel, name)] = n
    new = sorted(f"{m}: {c} ({lengths[(m, c)]} lines)" for m, c in over - OVER_400)
    assert not new, f"classes over {MAX_CLASS_LINES} lines (split them along a seam):\n" + "\n".join(new)
    done = sorted(f"{m}: {c}" for m, c in OVER_400 - over)
    assert not done, "no longer over the limit: take them off OVER_400 in tests/test_code_shape.py:\n" + "\n".join(done)


#: the Trainer's constructor only composes its parts (docs/design.md, section 1): at most this many lines
TRAINER_INIT_MAX = 40


def test_the_trainer_constructor_only_composes():
    path = PKG / "runtime" / "trainer.py"
    n = dict(function_lengths(ast.parse(path.read_text())))["Trainer.__init__"]
    assert n <= TRAINER_INIT_MAX, f"Trainer.__init__ is {n} lines; at most {TRAINER_INIT_MAX} (move a part's " \
                                  "building into a helper or the part)"


# ---- module names in docstrings and comments --------------------------------------------------------
@cache
def top_names(path: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level (and in its if/try blocks)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(st.name)
            elif isinstance(st, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in st.names)
            elif isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in st.targets if isinstance(st, ast.Assign) else [st.target]:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(st, (ast.If, ast.Try)):
                visit(st.body)
                visit(getattr(st, "orelse", []))
                for h in getattr(st, "handlers", []):
                    visit(h.body)
    visit(ast.parse(path.read_text()).body)
    return frozenset(names)


@cache
def package_index() -> tuple[dict[str, Path], frozenset[str]]:
    """The modules, and every top-level function and class name of the package."""
    mods = modules()
    defined = set()
    for p in mods.values():
        tree = ast.parse(p.read_text())
        defined.update(st.name for st in tree.body
                       if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    return mods, frozenset(defined)


def prose(source: str, tree: ast.AST | None = None) -> list[tuple[int, str]]:
    """(line, text) of every docstring (string statement) and comment (a line's text after a '#' that no
    string opened: a '#' inside a string is found by the tokenizer only where the line has a quote)."""
    tree = tree or ast.parse(source)
    out = [(n.lineno, n.value.value) for n in ast.walk(tree)
           if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]
    lines = source.splitlines()
    if any("#" in ln and ("'" in ln or '"' in ln) for ln in lines):
        out += [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT]
    else:
        out += [(i, ln[ln.index("#"):]) for i, ln in enumerate(lines, start=1) if "#" in ln]
    return out


FILE_SUFFIXES = {"py", "json", "jsonl", "toml", "md", "txt", "csv", "sh", "yaml", "yml", "log", "out", "err",
                 "pt", "npz", "lua", "conf", "cfg", "html", "svg", "png", "pdf", "gz", "lock"}
FULL = re.compile(r"\bhpc_jabas(?:\.[A-Za-z_]\w*)+")
QUOTED = re.compile(r"`+(?:~|\.)?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`+")


def code_names(tree: ast.AST) -> set[str]:
    """Names the module's code uses (variables, arguments, attributes): ``x.y`` in its prose may be one."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.Attribute):         # self.world_info: ``world_info.size`` is an attribute's
            out.add(n.attr)
    return out


@cache
def _external(name: str) -> bool:
    if name in sys.stdlib_module_names:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def stale(ref: str, used: set[str]) -> str | None:
    """Why a dotted reference in prose names no module or module attribute of the package (None: it does,
    or it is no reference to the package)."""
    mods, defined = package_index()
    parts = ref.split(".")
    if parts[-1] in FILE_SUFFIXES:               # a file name (allreduce.json, plan.py), not a module path
        return None
    if parts[0] == "hpc_jabas":
        k = max(i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in mods or i == 1)
        if k == len(parts):
            return None
        if ".".join(parts[:k]) in mods and parts[k] in top_names(mods[".".join(parts[:k])]):
            return None
        return f"no module or name {'.'.join(parts[:k + 1])}"
    if parts[0] in used or parts[0] in ("self", "cls") or parts[0][:1].isupper():
        return None
    for k in range(len(parts), 0, -1):           # the longest module-path tail the reference starts with
        tail = "." + ".".join(parts[:k])
        hits = [m for m in mods if ("." + m).endswith(tail)]
        if hits:
            if k == len(parts) or any(parts[k] in top_names(mods[m]) or f"{m}.{parts[k]}" in mods for m in hits):
                return None
            if parts[k] not in defined:          # an object's attribute (``trainer.perf_model``), not a function
                return None
            return f"{'.'.join(parts[:k])} has no {parts[k]}"
    if len(parts) >= 2 and parts[1] in defined and not _external(parts[0]):
        return f"no module {parts[0]} (and {parts[1]} is the package's)"
    return None


def test_the_checker_finds_stale_names():
    used = {"model", "cfg"}
    assert stale("hpc_jabas.core.autoscale.mixsearch.search", used) is None
    assert stale("hpc_jabas.core.planning", used) is None
    assert stale("hpc_jabas.core.snapping", used) == "no module or name hpc_jabas.core.snapping"
    bad = "hpc_jabas.core.autoscale.mixsearch.serch"
    assert stale(bad, used) == f"no module or name {bad}"
    assert stale("snapping.optimal_space", used) == "no module snapping (and optimal_space is the package's)"
    assert stale("planner.plan_range", used) == "planner has no plan_range"
    assert stale("planning.space.snap_nearest", used) is None
    assert stale("identical.plan_range", used) is None
    assert stale("mixsearch.perf_bound", used) is None              # a re-export is a name of the module
    assert stale("model.profile", used) is None and stale("np.interp", used) is None
    assert stale("Planner.plan", used) is None and stale("trainer.perf_model", used) is None
    assert stale("planning.plan.py", used) is None and stale("allreduce.json", used) is None
    src = '"""``snapping.optimal_space``: see hpc_jabas.core.nowhere."""\nx = 1  # ``planner.plan_range``\n'
    found = [(line, r) for line, text in prose(src) for r in FULL.findall(text) + QUOTED.findall(text)]
    assert found == [(1, "hpc_jabas.core.nowhere"), (1, "snapping.optimal_space"), (2, "planner.plan_range")]


def test_docstrings_and_comments_name_existing_modules():
    bad = []
    for p in modules().values():
        src = p.read_text()
        tree = ast.parse(src)
        used = code_names(tree)
        for line, text in prose(src, tree):
            for ref in FULL.findall(text) + QUOTED.findall(text):
                why = stale(ref, used)
                if why:
                    bad.append(f"{p.relative_to(REPO)}:{line}: {ref} ({why})")
    assert not bad, "docstrings or comments that name what does not exist:\n" + "\n".join(bad)
