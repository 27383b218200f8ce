"""Checks of output paths before any work: one clear line for a file where a directory should be, a path under
a file, a read-only or virtual file system (/proc); nothing is left behind."""
from __future__ import annotations

from pathlib import Path

from hpc_jabas.errors import ConfigError


def probe_dir(path: str | Path, what: str) -> None:
    """ConfigError unless ``path`` is a directory or one can be made there. A missing directory is made and
    removed again (with the parents made for it): the probe leaves the file system as it was."""
    d = Path(path)
    if d.exists():
        if not d.is_dir():
            raise ConfigError(f"{what} {str(d)!r} is a file, not a directory")
        return
    made: list[Path] = []
    p = d
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    if not p.is_dir():
        raise ConfigError(f"{what} {str(d)!r} cannot be made: {str(p)!r} is a file, not a directory")
    try:
        for q in reversed(made):
            q.mkdir()
    except OSError as e:
        raise ConfigError(f"{what} {str(d)!r} cannot be made: {e.strerror or e}") from None
    finally:
        for q in made:
            try:
                q.rmdir()
            except OSError:
                pass
