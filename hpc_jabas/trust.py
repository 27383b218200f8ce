"""Files others can write are not trusted: the owner and mode checks OpenSSH's StrictModes does on keys.

Before hpc-jabas reads a file whose content decides what runs or what is restored (a checkpoint and its
``.sha256`` sidecar, a chain's ``chain.jsonl``, a job spec ``<chain_dir>/jobs/<n>.json``, a run's
``calibration.json``, ``progress.json`` and ``metrics.jsonl`` read back, a job file or ``--config`` TOML, the
module file a task names), :func:`check_file` refuses it when

- another user owns it (not this process's effective user and not root), or
- anyone may write it (world-writable), or
- its group may write it, unless group trust is on (config key ``trust_group = true``, or
  :func:`set_trust_group`, or ``HPC_JABAS_TRUST_GROUP=1`` in the environment, which the job scripts of a
  ``trust_group`` job export so that the launcher trusts the group before it has read the job's config; a
  project space shared by a group is common on clusters), or
- its directory, or any directory above it, is owned by another user or writable by others (the file, or a
  directory on its way, could be replaced), the same way. As OpenSSH's StrictModes walks from the file up to
  the user's home directory (``auth_secure_path``), the walk stops at the user's home directory when the file
  is inside it, else it goes on to ``/``. One difference from OpenSSH: a sticky world-writable directory
  (``/tmp``, a cluster's ``/scratch``) owned by root or this user counts as safe: others cannot rename or
  remove what this user owns in it, and what is below it is checked on its own.

:func:`open_trusted` makes the same check on the file it has opened, for a pickle (submitit's result, the
submitted job): it is read from that open file, not looked up by name again.

:func:`check_dir` is the same check for a directory hpc-jabas writes into and a job later reads from (a chain
directory, its ``jobs/`` and ``jobs/submitit/``: submit refuses them before anything reaches Slurm), and
:func:`check_profile_dir` for a perf-model directory (``<gpu>.json`` and ``allreduce.json``).
:func:`refuse_control_chars` refuses a path that holds a control character (a newline in an ``#SBATCH`` line
or a comment of a job script would start a new shell line).

A refusal is one line (:class:`UntrustedFileError`, a ConfigError: exit 2) naming the file, what is
wrong and the fix. :func:`private_dir` creates the run and chain directories without world write.

The write side (the end of this module): before the first write, a run or chain directory passes the same rule
(:func:`check_write_dir`, :func:`check_run_dir`: an existing directory of another user is refused, not used as
it is), what sits where hpc-jabas writes its own files must not be a link (:func:`check_entry`), and every file
is opened with O_NOFOLLOW and checked on its descriptor (:func:`open_nofollow`, :func:`open_append_nofollow`,
:func:`write_atomic_nofollow`): a planted link is refused in one line, never written through.
"""
from __future__ import annotations

import errno
import os
import pwd
import shlex
import stat
from pathlib import Path
from typing import BinaryIO

from hpc_jabas import settings
from hpc_jabas.errors import ConfigError

_TRUST_GROUP = False
#: set to 1 by the job scripts of a job with trust_group = true (slurm/sbatch.py: setup_lines)
TRUST_GROUP_ENV = settings.TRUST_GROUP


class UntrustedFileError(ConfigError):
    """A file that another user owns or that others may write: refused before it is read."""


def set_trust_group(on: bool) -> None:
    """Process-wide: accept group-writable files and directories (config key ``trust_group``)."""
    global _TRUST_GROUP
    _TRUST_GROUP = bool(on)


def trust_group() -> bool:
    return _TRUST_GROUP or settings.trust_group()


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


def _home() -> Path | None:
    """This user's home directory (the password database's, else $HOME), resolved; None when unknown."""
    try:
        h = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        h = os.environ.get("HOME", "")
    if not h or not os.path.isdir(h):
        return None
    return Path(h).resolve()


def _walk_up(d: Path) -> list[Path]:
    """``d`` and the directories above it that StrictModes examines: up to and including the user's home
    directory when ``d`` is inside it, else up to ``/``."""
    home = _home()
    stop = home if home is not None and (d == home or home in d.parents) else None
    out = []
    for q in (d, *d.parents):
        out.append(q)
        if q == stop:
            break
    return out


def _check_dirs(d: Path, gok: bool) -> tuple[Path, tuple[str, str]] | None:
    """The first directory from ``d`` upward that is not trusted, with what is wrong; None when all are. Both
    the path as given (absolute) and its real path are walked: a symbolic link on the way is only as safe as
    the directory that holds it (others who can write there could point it elsewhere)."""
    walk = _walk_up(d.absolute())
    real = d.resolve()
    walk += [q for q in _walk_up(real) if q not in walk]
    for q in walk:
        try:
            st = os.stat(q)
        except OSError:
            continue
        bad = _problem(st, True, gok)
        if bad is not None:
            return q, bad
    return None


def check_file(path: str | os.PathLike, what: str = "file", group_ok: bool | None = None) -> None:
    """Refuse ``path`` (UntrustedFileError, one line) when another user owns it or others may write it, its
    directory or a directory above it (up to the home directory, else ``/``). A missing file is not checked
    here (the reader reports it)."""
    p = Path(path)
    gok = trust_group() if group_ok is None else group_ok
    try:
        st = os.stat(p)
    except OSError:
        return
    _refuse_untrusted(p, st, stat.S_ISDIR(st.st_mode), what, gok)


def _refuse_untrusted(p: Path, st: os.stat_result, is_dir: bool, what: str, gok: bool) -> None:
    """UntrustedFileError (one line) when the file whose status is ``st`` fails the owner and mode test, or its
    directory or one above it does: the one test of :func:`check_file` and :func:`open_trusted`."""
    bad = _problem(st, is_dir, gok)
    if bad is not None:
        raise UntrustedFileError(f"refusing to read {what} {str(p)!r}: it {bad[0]}; "
                                 f"{bad[1].format(f=shlex.quote(str(p)))}")
    parent = p.absolute().parent
    found = _check_dirs(parent, gok)
    if found is not None:
        q, dbad = found
        where = "its directory" if q in (parent, parent.resolve()) else "the directory above it"
        raise UntrustedFileError(f"refusing to read {what} {str(p)!r}: {where} {str(q)!r} "
                                 f"{dbad[0]}; {dbad[1].format(f=shlex.quote(str(q)))}")


def open_trusted(path: str | os.PathLike, what: str = "file", group_ok: bool | None = None) -> BinaryIO:
    """``path`` opened for reading (binary), once what was opened has passed :func:`check_file`'s test: the
    OPEN file (``os.fstat``: a regular file, owned by this user or root, not writable by others) and its
    directory and those above it. Read from the returned file object, never by name again: nothing can be
    swapped in between the check and the read (a pickle is code). A symbolic link is refused (the file is
    opened with ``O_NOFOLLOW``), and so is anything that is not a regular file (a FIFO does not block the
    open: ``O_NONBLOCK``). A missing file is the OSError of ``os.open`` (FileNotFoundError): unlike
    :func:`check_file`, nothing is passed unchecked."""
    p = Path(path)
    gok = trust_group() if group_ok is None else group_ok
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(p):
            raise UntrustedFileError(f"refusing to read {what} {str(p)!r}: it is a symbolic link (to "
                                     f"{os.readlink(p)!r}); a {what} is read only as a regular file: remove "
                                     f"the link ({shlex.quote(str(p))})") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFileError(f"refusing to read {what} {str(p)!r}: it is not a regular file (mode "
                                     f"{stat.filemode(st.st_mode)}); remove it")
        _refuse_untrusted(p, st, False, what, gok)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_dir(path: str | os.PathLike, what: str = "directory", group_ok: bool | None = None) -> None:
    """Refuse a directory hpc-jabas writes into and later reads from (UntrustedFileError, one line) when it,
    or a directory above it (up to the home directory, else ``/``), is owned by another user or writable by
    others. A missing directory is checked from its nearest existing parent (what it will be created in)."""
    p = Path(path).absolute()
    gok = trust_group() if group_ok is None else group_ok
    q = p
    while not q.exists() and q != q.parent:
        q = q.parent
    found = _check_dirs(q, gok)
    if found is not None:
        d, bad = found
        where = "it" if d in (p, p.resolve()) else f"the directory {str(d)!r} above it" if q == p \
            else f"the directory {str(d)!r} it would be made in"
        raise UntrustedFileError(f"refusing to use {what} {str(p)!r}: {where} {bad[0]}; "
                                 f"{bad[1].format(f=shlex.quote(str(d)))}")


def check_profile_dir(path: str | os.PathLike, what: str = "profile") -> None:
    """A perf-model directory (``hpc-jabas profile``'s output: ``<gpu>.json``, ``allreduce.json``): every
    JSON file in it gets :func:`check_file`, as ``calibration.json`` does (they steer the plans)."""
    d = Path(path)
    if not d.is_dir():
        return                                  # the reader says what is missing
    check_dir(d, f"{what} directory")
    for f in sorted(d.iterdir()):
        if f.name.endswith(".json"):
            check_file(f, what)


def refuse_control_chars(value: str | os.PathLike, what: str) -> str:
    """``value`` unchanged, or ConfigError (one line) when it holds a control character (C0, DEL or C1: a
    newline would end an ``#SBATCH`` line or a comment of a job script and start a shell command)."""
    s = os.fspath(value)
    for i, c in enumerate(s):
        if ord(c) < 32 or 127 <= ord(c) < 160:
            raise ConfigError(f"{what} {s!r} holds a control character ({c!r} at position {i}); a path or "
                              "name that goes into a job script must have none: rename it")
    return s


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
        make_private(d)
    return p


# ---- the write side: the directories hpc-jabas writes into and the files it creates or appends to ------------
#
# Before the first write, a run or chain directory must pass the read side's rule (check_dir: this user's or
# root's, no world write, no group write unless group trust, the same for every directory above it), and what
# sits where the project's own files go must be a regular file (or, for ``checkpoints/``, a directory) of this
# user's: a symbolic link planted there is refused, never written through. Every file is then opened with
# O_NOFOLLOW (a new one with O_EXCL, or written beside and renamed into place) and the open descriptor checked:
# a regular file this user owns.

#: what hpc-jabas writes in a run directory: its files, and its one directory
RUN_DIR_FILES = (".hpc-jabas.lock", "metrics.jsonl", "progress.json", "progress.json.tmp", "calibration.json",
                 "calibration.json.tmp")
RUN_DIR_DIRS = ("checkpoints",)


def _file_mode() -> int:
    return 0o664 if trust_group() else 0o644


def _kind(st: os.stat_result) -> str:
    m = st.st_mode
    return ("a directory" if stat.S_ISDIR(m) else "a symbolic link" if stat.S_ISLNK(m) else
            "a named pipe" if stat.S_ISFIFO(m) else "a socket" if stat.S_ISSOCK(m) else
            "a device" if stat.S_ISCHR(m) or stat.S_ISBLK(m) else "a regular file" if stat.S_ISREG(m) else
            "a special file")


def _link_error(p: str, what: str) -> UntrustedFileError:
    try:
        to = f" (to {os.readlink(p)!r})"
    except OSError:
        to = ""
    return UntrustedFileError(f"refusing to write {what} {p!r}: it is a symbolic link{to}; hpc-jabas writes its own "
                              f"files in place, never through a link: look at it, then remove it "
                              f"(rm {shlex.quote(p)}), or give another directory")


def check_entry(path: str | os.PathLike, what: str = "file", kind: str = "file",
                group_ok: bool | None = None) -> None:
    """Refuse (one line) what sits at ``path`` where hpc-jabas is about to write its own ``kind`` ("file" or
    "dir"): a symbolic link (UntrustedFileError), something of another kind (ConfigError: a file named
    ``checkpoints``, a directory named ``metrics.jsonl``), or one another user owns or others may write
    (UntrustedFileError). Nothing there passes: it will be created."""
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConfigError(f"{what} {p!r} cannot be examined: {e.strerror}; give a directory you can write") from None
    if stat.S_ISLNK(st.st_mode):
        raise _link_error(p, what)
    want_dir = kind == "dir"
    if not (stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)):
        raise ConfigError(f"{what} {p!r} is {_kind(st)}, where hpc-jabas writes its {what} "
                          f"({'a directory' if want_dir else 'a regular file'}); move it away, or give another "
                          "directory")
    bad = _problem(st, want_dir, trust_group() if group_ok is None else group_ok)
    if bad is not None:
        raise UntrustedFileError(f"refusing to write {what} {p!r}: it {bad[0]}; {bad[1].format(f=shlex.quote(p))}")


def check_write_dir(path: str | os.PathLike, what: str = "run directory", group_ok: bool | None = None) -> Path:
    """A directory hpc-jabas is about to write into (a run or chain directory), checked before the first write
    and made when missing (:func:`private_dir`): :func:`check_dir` on where it would be made (the nearest
    existing directory and those above it), then on the directory itself, so that an existing one another user
    owns or others may write (group: unless group trust) is refused, not used as it is. UntrustedFileError, or
    ConfigError when it cannot be made (a file in its place, no permission): one line. The directory itself may
    be a symbolic link (both its path and its real path are walked); the files in it may not
    (:func:`check_entry`)."""
    p = Path(path)
    if not os.fspath(p):
        raise ConfigError(f"{what} is empty; give a directory")
    check_dir(p, what, group_ok)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what} {str(p)!r} is not a directory; give a directory you can write")
    try:
        private_dir(p)
    except OSError as e:
        raise ConfigError(f"{what} {str(p)!r} cannot be written: {e.strerror or e}; give a directory you can "
                          "write") from None
    check_dir(p, what, group_ok)
    return p


def check_run_dir(path: str | os.PathLike, group_ok: bool | None = None) -> Path:
    """A run directory before anything is written into it (rank 0, before training): :func:`check_write_dir`,
    then :func:`check_entry` on every name hpc-jabas writes there (``RUN_DIR_FILES``, ``checkpoints/``)."""
    p = check_write_dir(path, "run directory", group_ok)
    names = {".hpc-jabas.lock": "run directory lock", "metrics.jsonl": "metrics record",
             "progress.json": "progress record", "calibration.json": "calibration"}
    for n in RUN_DIR_FILES:
        base = n.removesuffix(".tmp")
        check_entry(p / n, names.get(base, "file") + (" (temporary file)" if n != base else ""), "file", group_ok)
    for n in RUN_DIR_DIRS:
        check_entry(p / n, "checkpoint directory", "dir", group_ok)
    return p


def open_nofollow(path: str | os.PathLike, flags: int, what: str = "file") -> int:
    """``os.open`` of a file hpc-jabas writes in a checked directory, never through a link: ``flags`` plus
    O_NOFOLLOW, O_CLOEXEC (and O_NONBLOCK while opening: a planted FIFO does not block), a new file made 0o644
    (0o664 with group trust) whatever the umask. The open descriptor must be a regular file this user owns
    (else one line, UntrustedFileError or ConfigError, the descriptor closed); its world write (and group
    write, unless group trust) is removed. A symbolic link at ``path`` is UntrustedFileError; with O_EXCL, an
    existing regular file is FileExistsError; other failures (no space, no permission) are OSError."""
    import errno
    import fcntl
    p = os.fspath(path)
    try:
        fd = os.open(p, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, _file_mode())
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno == errno.EEXIST and os.path.islink(p)):
            raise _link_error(p, what) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {p!r} is {_kind(st)}, where hpc-jabas writes its {what} (a regular file); "
                              "move it away, or give another directory")
        if st.st_uid != os.geteuid():
            raise UntrustedFileError(f"refusing to write {what} {p!r}: it is owned by uid {st.st_uid}, not by this "
                                     f"user (uid {os.geteuid()}); check who wrote it, then move it away")
        mode = stat.S_IMODE(st.st_mode)
        strip = stat.S_IWOTH | (0 if trust_group() else stat.S_IWGRP)
        if mode & strip:
            os.fchmod(fd, mode & ~strip)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append_nofollow(path: str | os.PathLike, what: str = "file") -> int:
    """A log hpc-jabas appends to (``metrics.jsonl``, ``chain.jsonl``): :func:`open_nofollow` with O_RDWR
    (the tail can be read back and repaired), O_APPEND and O_CREAT. The caller closes the descriptor."""
    return open_nofollow(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, what)


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (os.write again after a short write; the error, e.g. ENOSPC, raised)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_atomic_nofollow(path: str | os.PathLike, data: bytes, what: str = "file",
                          tmp: str | os.PathLike | None = None, fsync: bool = False) -> Path:
    """Replace ``path`` with ``data`` atomically, never through a link: ``path`` checked (:func:`check_entry`:
    not a link, a regular file of ours when it exists), ``data`` written to ``tmp`` (default ``<path>.tmp``),
    made with O_CREAT | O_EXCL | O_NOFOLLOW (a regular temporary file of ours that a killed writer left is
    removed first; a link there is refused), then renamed over ``path``. ``fsync``: the file and its
    directory are synced. On any failure the temporary file is removed and the error raised (the old
    ``path`` stays as it was)."""
    p = Path(path)
    t = Path(tmp) if tmp is not None else p.with_name(p.name + ".tmp")
    check_entry(p, what)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        fd = open_nofollow(t, flags, what)
    except FileExistsError:
        check_entry(t, f"{what} (temporary file)")      # a link or another user's: refused, not removed
        os.unlink(t)
        fd = open_nofollow(t, flags, what)
    try:
        try:
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(t, p)
    except BaseException:
        try:
            os.unlink(t)
        except OSError:
            pass
        raise
    if fsync:
        dfd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return p
