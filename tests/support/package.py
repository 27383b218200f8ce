"""The package as a user gets it: the wheel built from the checkout, and the third-party packages it declares.

* :func:`build_wheel`: ``pip wheel --no-deps`` of a copy of the checkout's packaging files (pyproject.toml,
  README.md, hpc_jabas/), so that no stale ``build/`` of the shared working tree can add or hide a file;
  without build isolation when the build backend (setuptools) is in this environment, so nothing is downloaded.
* :func:`source_packages` / :func:`wheel_packages`: every directory under hpc_jabas/ that holds Python files,
  and every directory the wheel holds them in (a subpackage left out of the wheel shows as a difference).
* :func:`requirement_closure`: the distributions the package's declared dependencies pull in, read from the
  metadata of the environment this test runs in (the shared environment of scripts/setup.sh).
* :func:`site_packages_copy`: a read-only, world-readable copy (hard links where the file system allows) of
  exactly that closure, as a site's PyTorch module provides one: what a user who is not root gets on
  PYTHONPATH. Only the declared dependencies are in it, so a dependency the package imports without
  declaring it fails the non-root test; Horovod is not a declared dependency, so it is not there either.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "hpc_jabas"


def build_wheel(out: Path) -> Path:
    """The wheel of the checkout, built into ``out``; returns its path."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / PACKAGE, src / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out / "dist"), str(src)]
    try:
        import setuptools  # noqa: F401  (the build backend is here: build with it, download nothing)
        cmd.insert(5, "--no-build-isolation")
    except ImportError:
        pass
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout}\n{r.stderr}"
    wheels = sorted((out / "dist").glob("hpc_jabas-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def source_packages(root: Path = ROOT) -> dict[str, set[str]]:
    """Directory (relative, '/'-separated) under hpc_jabas/ -> its files (Python files and package data)."""
    out: dict[str, set[str]] = {}
    for p in (root / PACKAGE).rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
            out.setdefault(p.parent.relative_to(root).as_posix(), set()).add(p.name)
    return {d: f for d, f in out.items() if any(n.endswith(".py") for n in f) or d.endswith("/data")}


def wheel_packages(whl: Path) -> dict[str, set[str]]:
    """The same for the wheel's files."""
    out: dict[str, set[str]] = {}
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            if n.startswith(PACKAGE + "/") and not n.endswith("/"):
                d, _, f = n.rpartition("/")
                out.setdefault(d, set()).add(f)
    return out


def wheel_requirements(whl: Path) -> list[str]:
    """The Requires-Dist lines of the wheel's METADATA (the dependencies pip resolves)."""
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")]


def requirement_closure(requirements: list[str]) -> list[md.Distribution]:
    """The installed distributions that ``requirements`` need, transitively (markers evaluated, no extras)."""
    seen: dict[str, md.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        dist = md.distribution(req.name)            # PackageNotFoundError: the environment lacks a dependency
        assert dist.version in req.specifier or not req.specifier, (req, dist.version)
        seen[name] = dist
        todo += [Requirement(r) for r in (dist.requires or [])]
    return [seen[k] for k in sorted(seen)]


def _dist_files(dist: md.Distribution) -> list[Path]:
    """The files of ``dist`` inside its site-packages (its RECORD; console scripts in bin/ left out)."""
    base = Path(str(dist.locate_file(""))).resolve()
    out = []
    for f in dist.files or []:
        p = Path(str(dist.locate_file(f))).resolve()
        if p.is_relative_to(base) and p.is_file() and "__pycache__" not in p.parts:
            out.append(p.relative_to(base))
    return out


def _check_root_owned(path: Path) -> None:
    """A cached copy is used only when root made it and nobody else can write it (it lies in /var/tmp)."""
    for p in [path, *path.parents]:
        if p == path.parent.parent:
            break
        st = p.lstat()
        assert st.st_uid == 0 and not (st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX), \
            f"{p} is not root's own: refusing to use it"


def site_packages_copy(requirements: list[str], base: Path = Path("/var/tmp")) -> Path:
    """A read-only, world-readable directory holding exactly the closure of ``requirements`` (made once per set
    of versions, by root; kept), and beside it ``modulefiles/`` with an Lmod module ``pytorch`` that puts it on
    PYTHONPATH. Returns the site-packages directory (its parent holds the modulefiles)."""
    dists = requirement_closure(requirements)
    key = hashlib.sha256("\n".join(f"{d.metadata['Name']}=={d.version}@{d.locate_file('')}" for d in dists)
                         .encode()).hexdigest()[:12]
    dest = base / f"hpc-jabas-site-{key}"
    for old in base.glob("hpc-jabas-site-*"):      # copies of other package versions, unused for 30 days
        used = old / ".complete"
        if old != dest and used.exists() and time.time() - used.stat().st_mtime > 30 * 86400 \
                and old.lstat().st_uid == 0 and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    if (dest / ".complete").exists():
        _check_root_owned(dest)
        os.utime(dest / ".complete")
        return dest / "site-packages"
    tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=base))
    site = tmp / "site-packages"
    tag = sys.implementation.cache_tag
    for d in dists:
        src_base = Path(str(d.locate_file(""))).resolve()
        for rel in _dist_files(d):
            pairs = [(src_base / rel, site / rel)]
            if rel.suffix == ".py":              # the byte code setup.sh compiled (valid: same file, same mtime)
                pyc = src_base / rel.parent / "__pycache__"
                pairs += [(c, site / rel.parent / "__pycache__" / c.name) for c in pyc.glob(f"{rel.stem}.{tag}*.pyc")]
            for src, target in pairs:
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(src, target)         # same file system: no copy (the file stays root's, read-only)
                except OSError:
                    shutil.copy2(src, target)
    for dirpath, _dirnames, filenames in os.walk(tmp):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            st = os.lstat(os.path.join(dirpath, f))
            if stat.S_ISREG(st.st_mode) and (st.st_mode & 0o022 or not st.st_mode & 0o004):
                os.chmod(os.path.join(dirpath, f), (st.st_mode & ~0o022) | 0o444)
    # the site's module for it (Lmod): what `module load pytorch` does at a site that provides PyTorch this way
    torch_v = next(d.version for d in dists if canonicalize_name(d.metadata["Name"]) == "torch")
    mod = tmp / "modulefiles" / "pytorch"
    mod.mkdir(parents=True, mode=0o755)
    (mod / f"{torch_v.split('+')[0]}.lua").write_text(
        f'whatis("PyTorch {torch_v} and the packages hpc-jabas declares, read-only")\n'
        f'prepend_path("PYTHONPATH", "{dest / "site-packages"}")\n')
    for q in (tmp / "modulefiles", mod, mod / f"{torch_v.split('+')[0]}.lua"):
        os.chmod(q, 0o755 if q.is_dir() else 0o644)
    (tmp / ".complete").write_text("\n".join(f"{d.metadata['Name']}=={d.version}" for d in dists) + "\n")
    try:
        tmp.rename(dest)
    except OSError:                                       # another session made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    _check_root_owned(dest)
    return dest / "site-packages"
