"""Files others can write are not trusted: the owner and mode checks OpenSSH's StrictModes does on keys.

Before hpc-jabas reads a file whose content decides what runs or what is restored (a checkpoint and its
``.sha256`` sidecar, a chain's ``chain.jsonl``, a job spec ``<chain_dir>/jobs/<n>.json``, a run's
``calibration.json``, ``progress.json`` and ``metrics.jsonl`` read back, a submitit result pickle),
:func:`check_file` refuses it when

- another user owns it (not this process's effective user and not root), or
- anyone may write it (world-writable), or
- its group may write it, unless group trust is on (config key ``trust_group = true``, or
  :func:`set_trust_group`, or ``HPC_JABAS_TRUST_GROUP=1`` in the environment, which the job scripts of a
  ``trust_group`` job export so that the launcher trusts the group before it has read the job's config; a
  project space shared by a group is common on clusters), or
- its directory is writable by others (the file could be replaced), the same way; a sticky
  world-writable directory (``/tmp``) counts as safe, as for OpenSSH.

A refusal is one line (:class:`UntrustedFileError`, a ConfigError: exit 2) naming the file, what is
wrong and the fix. :func:`private_dir` creates the run and chain directories without world write.
"""
from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from hpc_jabas.errors import ConfigError

_TRUST_GROUP = False
#: set to 1 by the job scripts of a job with trust_group = true (slurm/sbatch.py: setup_lines)
TRUST_GROUP_ENV = "HPC_JABAS_TRUST_GROUP"


class UntrustedFileError(ConfigError):
    """A file that another user owns or that others may write: refused before it is read."""


def set_trust_group(on: bool) -> None:
    """Process-wide: accept group-writable files and directories (config key ``trust_group``)."""
    global _TRUST_GROUP
    _TRUST_GROUP = bool(on)


def trust_group() -> bool:
    return _TRUST_GROUP or os.environ.get(TRUST_GROUP_ENV) == "1"


def _problem(st: os.stat_result, is_dir: bool, group_ok: bool) -> tuple[str, str] | None:
    """(what is wrong, the fix) for one stat result, None when it is trusted."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return (f"is owned by uid {st.st_uid}, not by this user (uid {me}) or root",
                "check who wrote it; if it is yours, chown $USER {f}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH and not (is_dir and mode & stat.S_ISVTX):
        return f"is writable by every user (mode {mode:04o})", "chmod o-w {f}"
    if mode & stat.S_IWGRP and not group_ok and not (is_dir and mode & stat.S_ISVTX):
        return (f"is writable by its group (mode {mode:04o})",
                "chmod g-w {f}, or, if the group is trusted, set trust_group = true in the job's config "
                "(hpc-jabas status: --trust-group)")
    return None


def check_file(path: str | os.PathLike, what: str = "file", group_ok: bool | None = None) -> None:
    """Refuse ``path`` (UntrustedFileError, one line) when another user owns it or others may write it or
    its directory. A missing file is not checked here (the reader reports it)."""
    p = Path(path)
    gok = trust_group() if group_ok is None else group_ok
    try:
        st = os.stat(p)
    except OSError:
        return
    bad = _problem(st, stat.S_ISDIR(st.st_mode), gok)
    if bad is None:
        parent = p.resolve().parent
        try:
            pst = os.stat(parent)
        except OSError:
            return
        dbad = _problem(pst, True, gok)
        if dbad is not None:
            raise UntrustedFileError(f"refusing to read {what} {str(p)!r}: its directory {str(parent)!r} "
                                     f"{dbad[0]}; {dbad[1].format(f=shlex.quote(str(parent)))}")
        return
    raise UntrustedFileError(f"refusing to read {what} {str(p)!r}: it {bad[0]}; {bad[1].format(f=shlex.quote(str(p)))}")


def open_private(path: str | os.PathLike, flags: int) -> int:
    """``os.open`` of a file hpc-jabas writes and later trusts (checkpoints, sidecars, chain.jsonl): created
    0o644 at most (0o664 with group trust), whatever the umask."""
    return os.open(path, flags | os.O_CREAT, 0o664 if trust_group() else 0o644)


def make_private(path: str | os.PathLike) -> Path:
    """A file hpc-jabas has just written and later trusts (a job spec, metrics.jsonl, progress.json,
    calibration.json): its world write, and its group write unless group trust is on, removed, so that a
    umask of 002 does not make it one that :func:`check_file` refuses."""
    p = Path(path)
    try:
        mode = stat.S_IMODE(os.stat(p).st_mode)
        strip = stat.S_IWOTH | (0 if trust_group() else stat.S_IWGRP)
        if mode & strip:
            os.chmod(p, mode & ~strip)
    except OSError:
        pass
    return p


def private_dir(path: str | os.PathLike) -> Path:
    """``mkdir -p`` of a run or chain directory: the directories it creates have no world write, and no group
    write unless group trust is on (so that a umask of 002 does not make our own files untrusted); an
    existing directory is left as it is."""
    p = Path(path)
    missing = []
    q = p
    while not q.exists() and q != q.parent:
        missing.append(q)
        q = q.parent
    p.mkdir(parents=True, exist_ok=True)
    for d in missing:
        try:
            mode = stat.S_IMODE(os.stat(d).st_mode)
            strip = stat.S_IWOTH | (0 if trust_group() else stat.S_IWGRP)
            if mode & strip:
                os.chmod(d, mode & ~strip)
        except OSError:
            pass
    return p
