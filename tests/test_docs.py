"""The design lives in the repository: what the code and docs cite exists, and nothing cites a tracker.

- every ``*.md`` path named in a comment or string of the package, the tests, the benchmarks, the
  scripts and the examples, and every link of the README and of ``docs/``, is a file of the
  repository (``docs/design.md`` from the root; in ``docs/`` a link may also be relative to it);
- every test ``docs/invariants.md`` names is defined in ``tests/``;
- no tracker reference ("issue 15", "issue #3", "(issue: ...)", "task 12") in ``hpc_jabas/``,
  ``docs/``, ``examples/`` or the README: a comment says what the code does, not where it was asked.
"""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MD_REF = re.compile(r"(?<![\w/.:-])((?:\.{1,2}/)?[\w./-]*[\w-]\.md)\b")
TRACKER = re.compile(r"\b(?:issues?|tasks?|tickets?)\s*(?:#\s*)?\d+|\bissues?\s*#|\(issues?:", re.IGNORECASE)
DOCS = ["design.md", "invariants.md", "formulas.md", "layout.md"]


def _python_text(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and string literal of a Python file (docstrings included)."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            out.append((tok.start[0], tok.string))
    return out


def _text(path: Path) -> list[tuple[int, str]]:
    if path.suffix == ".py":
        return _python_text(path)
    return list(enumerate(path.read_text().splitlines(), 1))


def _files(*globs: str) -> list[Path]:
    found: set[Path] = set()
    for g in globs:
        found |= {p for p in ROOT.glob(g) if p.is_file() and ".venv" not in p.parts}
    return sorted(found)


CITING = _files("hpc_jabas/**/*.py", "hpc_jabas/**/*.toml", "tests/**/*.py", "bench/**/*.py", "bench/*.md",
                "scripts/*", "examples/*.py", "examples/*.md", "README.md", "docs/*.md", "slurm/**/*.md",
                "Makefile")
CITING = [p for p in CITING if p != Path(__file__).resolve()]      # this file names missing files on purpose
NO_TRACKER = _files("hpc_jabas/**/*.py", "hpc_jabas/**/*.toml", "docs/*.md", "examples/*.py", "examples/*.md",
                    "README.md", "bench/*.md")


def missing_md_refs(path: Path, root: Path = ROOT) -> list[tuple[str, str]]:
    """(where, path) of the ``*.md`` paths ``path`` names that are no file (root-relative, or relative to
    ``path``'s folder). A URL's path is not a reference (the pattern cannot start after a ``/``)."""
    bad = []
    for line, text in _text(path):
        for ref in MD_REF.findall(text):
            cands = [root / ref, path.parent / ref]
            if not any(c.is_file() for c in cands):
                bad.append((f"{path.relative_to(root)}:{line}", ref))
    return bad


def tracker_refs(path: Path, root: Path = ROOT) -> list[tuple[str, str]]:
    return [(f"{path.relative_to(root)}:{line}", m.group(0))
            for line, text in _text(path) for m in TRACKER.finditer(text)]


def test_the_docs_exist_and_say_something():
    for name in DOCS:
        p = ROOT / "docs" / name
        assert p.is_file(), f"docs/{name} is missing"
        assert len(p.read_text().splitlines()) >= 15, f"docs/{name} is nearly empty"


def test_every_cited_md_file_exists():
    assert CITING, "nothing scanned"
    bad = [b for p in CITING for b in missing_md_refs(p)]
    assert not bad, "references to files that are not in the repository:\n" + "\n".join(f"{w}: {r}" for w, r in bad)


def test_no_tracker_references_in_code_or_docs():
    bad = [b for p in NO_TRACKER for b in tracker_refs(p)]
    assert not bad, "tracker references (say what the code does instead):\n" + "\n".join(f"{w}: {r!r}" for w, r in bad)


def test_the_invariants_name_tests_that_exist():
    """docs/invariants.md names ``tests/FILE.py::test_name`` and bare ``test_name``s: each one is defined."""
    text = (ROOT / "docs" / "invariants.md").read_text()
    defined = {p.name: set(re.findall(r"^(?:async )?def (test_\w+)", p.read_text(), re.M))
               for p in (ROOT / "tests").glob("test_*.py")}
    every = set().union(*defined.values())
    named = re.findall(r"`tests/(test_\w+\.py)(?:::(test_\w+))?`", text)
    assert len(named) >= 20, named
    bad = [f"{f}::{n}" for f, n in named if f not in defined or (n and n not in defined[f])]
    bad += [n for n in re.findall(r"`(test_\w+)`", text) if n not in every]
    assert not bad, f"docs/invariants.md names tests that do not exist: {bad}"


def test_nothing_cites_a_path_outside_the_repository():
    outside = "/work" + "/shared"
    bad = [f"{p.relative_to(ROOT)}" for p in CITING if outside in p.read_text()]
    assert not bad, bad


@pytest.mark.parametrize("text, missing, tracker", [
    ('"""See design' + '.md section 1."""\n', ["design.md"], []),
    ("# the rule of docs/" + "nowhere.md\nx = 1\n", ["docs/nowhere.md"], []),
    ('"""docs/design.md, section 3 (iss' + 'ue 15)."""\n', [], ["issue 15"]),
    ("# as asked in iss" + "ue #4, task" + " 12 and (iss" + "ue: balancing)\n", [], ["issue #4", "task 12", "(issue:"]),
    ('"""Issue-free text; reissued tokens; 3 tasks; https://example.org/x/CHANGES.md"""\n', [], []),
])
def test_the_checks_see_a_violation(tmp_path, text, missing, tracker):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text("# Design\n")
    f = tmp_path / "m.py"
    f.write_text(text)
    assert [r for _, r in missing_md_refs(f, tmp_path)] == missing
    assert [r.lower() for _, r in tracker_refs(f, tmp_path)] == tracker


def test_bench_is_a_package_that_make_bench_lists_in_full():
    """Every benchmark script is in the Makefile's BENCHES (run as ``python -m bench.NAME``) and has a row in
    bench/RESULTS.md's current table; no file under bench/ edits sys.path."""
    make = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    listed = re.search(r"^BENCHES\s*:=(.*)$", make, re.M)
    assert listed, "the Makefile has no BENCHES list"
    names = listed.group(1).split()
    scripts = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")
    assert sorted(names) == scripts, (names, scripts)
    assert "$(PY) -m bench.$$b" in make, "make bench runs each benchmark as a module"
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    table = results[results.index("## Current results"):results.index("## Run log")]
    rows = re.findall(r"^\| `bench\.(\w+)[^`]*` \|", table, re.M)
    assert set(rows) == set(scripts), (rows, scripts)
    edits = [str(p.relative_to(ROOT)) for p in (ROOT / "bench").rglob("*.py") if "sys.path" in p.read_text()]
    assert edits == [], edits


#: a module a document names: ``hpc_jabas/core/validate.py``, ``runtime/comm.py``, ``core/validate.integer`` (inside
#: the package; a path to another file of the repository, ``slurm/local/up.sh``, is one too),
#: ``hpc_jabas.core.planning`` or ``hpc_jabas.core.planning.make_planner`` (a module, or a name it defines)
MODULE_PATH = re.compile(r"(?<![\w/.-])((?:hpc_jabas/)?(?:core|runtime|slurm|cli|data)/[\w/]*\w|hpc_jabas/\w+)"
                         r"(\.\w+)?(?![\w-])")
DOTTED = re.compile(r"(?<![\w.])(hpc_jabas(?:\.\w+)+)")
DOC_FILES = _files("README.md", "docs/*.md", "examples/*.md", "bench/*.md", "slurm/**/*.md")


def _defines(module: Path, name: str) -> bool:
    """Whether the module file (or package ``__init__``) defines, imports or exports (``__all__``) ``name``."""
    import ast
    tree = ast.parse(module.read_text())
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets) \
                and name in ast.literal_eval(n.value):
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name:
            return True
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(n, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == name
                                                               for a in n.names):
            return True
    return False


def missing_modules(path: Path, root: Path = ROOT) -> list[tuple[str, str]]:
    """(where, reference) of the package modules ``path`` names that do not exist: a module path (from the
    repository root, or from ``hpc_jabas/``), or a dotted name whose longest module prefix is a file of the
    package and whose next part, if any, is a name that module defines (a further ``.attr`` is not checked)."""
    pkg, bad = root / "hpc_jabas", []
    for line, text in _text(path):
        for stem, suffix in MODULE_PATH.findall(text):
            ok = ((root / (stem + suffix)).exists() or (root / stem).exists()
                  or any((base / stem).with_suffix(".py").is_file() or (base / stem / "__init__.py").is_file()
                         for base in (root, pkg)))
            if not ok:
                bad.append((f"{path.relative_to(root)}:{line}", stem + suffix))
        for ref in DOTTED.findall(text):
            parts = ref.split(".")
            if parts[-1] in ("py", "md", "toml", "json"):
                continue
            k, mod = 1, pkg / "__init__.py"
            for i in range(2, len(parts) + 1):
                stem = root.joinpath(*parts[:i])
                if stem.with_suffix(".py").is_file():
                    k, mod = i, stem.with_suffix(".py")
                elif (stem / "__init__.py").is_file():
                    k, mod = i, stem / "__init__.py"
                else:
                    break
            if k < len(parts) and not _defines(mod, parts[k]):
                bad.append((f"{path.relative_to(root)}:{line}", ref))
    return bad


def test_every_module_a_document_names_exists():
    assert len(DOC_FILES) >= 10, DOC_FILES
    bad = [b for p in DOC_FILES for b in missing_modules(p)]
    assert not bad, "documents name modules that do not exist:\n" + "\n".join(f"{w}: {r}" for w, r in bad)


def test_the_module_check_sees_a_missing_module(tmp_path):
    (tmp_path / "hpc_jabas" / "core").mkdir(parents=True)
    (tmp_path / "hpc_jabas" / "__init__.py").write_text("")
    (tmp_path / "hpc_jabas" / "core" / "__init__.py").write_text("from os import path\n")
    (tmp_path / "hpc_jabas" / "core" / "validate.py").write_text("def parse_int(): ...\nLIMIT = 3\n")
    doc = tmp_path / "d.md"
    doc.write_text("`core/validate.py`, `hpc_jabas/core/validate.py`, hpc_jabas.core.validate.parse_int,\n"
                   "hpc_jabas.core.validate.LIMIT, hpc_jabas.core.path; but core/grouptimes.py,\n"
                   "hpc_jabas.core.grouptimes, hpc_jabas.core.validate.parse_float and runtime/comm_x.py;\n"
                   "core/validate.parse_int and core/schema.read_table (a module that is not there)\n")
    (tmp_path / "hpc_jabas" / "__init__.py").write_text('__all__ = ["Trainer"]\n')
    doc.write_text(doc.read_text() + "hpc_jabas.Trainer, but hpc_jabas.Trainr\n")
    assert sorted(r for _, r in missing_modules(doc, tmp_path)) == [
        "core/grouptimes.py", "core/schema.read_table", "hpc_jabas.Trainr", "hpc_jabas.core.grouptimes",
        "hpc_jabas.core.validate.parse_float", "runtime/comm_x.py"]
