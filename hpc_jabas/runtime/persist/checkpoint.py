"""Atomic checkpoints that plain ``torch.load`` reads, with their integrity data beside them (invariant 6).

File layout: ``ckpt-<epoch>-<iteration>.pt`` is exactly what ``torch.save`` wrote (a dict with
"model", "optimizer", ... for the Trainer), so ``torch.load(path, weights_only=True)`` reads it
without hpc-jabas: the state is stored as tensors and plain containers (:func:`to_plain`: a numpy
array becomes ``{"__hj_ndarray__": bytes, "dtype", "shape"}``, a numpy scalar a Python number, a deque
a list), and loading never unpickles anything else (a checkpoint is not code). Before reading, the
checkpoint and its sidecar pass hpc_jabas.trust.check_file (owner and mode, like OpenSSH's StrictModes).
Its integrity record is the sidecar ``<name>.sha256``: one JSON line
``{"format": "hpc-jabas-checkpoint/2", "sha256": ..., "size": ...}``. Writing: the payload goes to a
temporary file in the same directory (fsynced, renamed over the final name), then the sidecar the
same way, then the directory is fsynced: the sidecar is the commit record, so a ``.pt`` without one
(a writer killed between the two renames) counts as incomplete. Loading checks the size
(truncation) and the SHA-256 (corruption) before unpickling; ``load_latest`` walks from the newest
checkpoint to older ones and uses the first good one, naming each bad one it skipped. Files of the
first format (b"HPCJABAS1\\n" + checksum + payload in one file) are still read.

The sidecar's ``format`` is read back: a format this version does not know (a newer hpc-jabas wrote it) is
refused in one line (:class:`CheckpointFormatError`), never loaded and never skipped past silently.

Writing never follows a link and never fills a disk by surprise: the temporary file is created with
``O_EXCL | O_NOFOLLOW`` (a planted link is refused, not written through), the free space is checked against the
payload's size with a margin before the first byte is written, and a write that fails (ENOSPC, EDQUOT, EFBIG)
removes its temporary file and is one line naming the directory and the free space (:class:`DiskFullError`).

Pruning keeps checkpoints by validity, not by name (:func:`prune`): only checkpoints that verify (sidecar, size,
checksum) count toward ``keep``, the one just written is never deleted, and a torn or unverifiable file newer
than the kept ones is moved aside (renamed ``<name>.bad``, with a warning) instead of taking a good one's place.
"""
from __future__ import annotations

import collections
import errno
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpc_jabas.errors import CheckpointError
from hpc_jabas.trust import UntrustedFileError, check_entry, check_file, check_write_dir, open_private

MAGIC = b"HPCJABAS1\n"               # the first format's header (read only)
FORMAT = "hpc-jabas-checkpoint/2"
KNOWN_FORMATS = (FORMAT,)             # the sidecar formats this version reads
BAD_SUFFIX = ".bad"                   # a torn or unverifiable checkpoint set aside by pruning
#: free space wanted beyond the payload before a checkpoint is written: this fraction of it, and at least
SPACE_MARGIN, SPACE_MARGIN_MIN = 0.05, 1 << 20
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class CheckpointFormatError(CheckpointError):
    """A checkpoint whose sidecar names a format this version does not read: refused, not skipped."""


class DiskFullError(CheckpointError):
    """No room for a checkpoint (too little free space, a quota, a file size limit): nothing was written."""
SIDECAR_SUFFIX = ".sha256"
_NAME = re.compile(r"^ckpt-(\d{6})-(\d{9})\.pt$")


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(str(d), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def sidecar(path: str | os.PathLike) -> Path:
    """The integrity record of checkpoint ``path``."""
    p = Path(path)
    return p.with_name(p.name + SIDECAR_SUFFIX)


def _free_bytes(d: Path) -> int | None:
    try:
        return shutil.disk_usage(d).free
    except OSError:
        return None


def _size_text(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} bytes"


def _disk_full(d: Path, need: int, e: OSError | None = None) -> DiskFullError:
    why = f"writing failed ({e.strerror})" if e is not None else "there is not enough free space"
    return DiskFullError(f"cannot write a checkpoint in {str(d)!r}: {why}; it needs {_size_text(need)} and the "
                         f"file system has {_size_text(_free_bytes(d))} free; the previous checkpoints are "
                         "intact: free space (or raise the quota), then run again to resume")


def _check_space(d: Path, size: int) -> None:
    """DiskFullError before anything is written when ``d``'s file system has no room for ``size`` bytes and a
    margin (``ulimit -f`` and quotas show only when writing: :func:`_write_atomic` turns those into the same)."""
    need = size + max(SPACE_MARGIN_MIN, int(SPACE_MARGIN * size))
    free = _free_bytes(d)
    if free is not None and free < need:
        raise _disk_full(d, need)


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a new temporary file beside it (``O_EXCL | O_NOFOLLOW``: a link planted
    at its name is refused, never written through), fsynced and renamed over ``path`` (a rename replaces a link
    at ``path`` itself, never its target). A failed write removes the temporary file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    flags = os.O_WRONLY | os.O_EXCL | os.O_NOFOLLOW
    try:
        try:
            fd = open_private(tmp, flags)
        except FileExistsError:           # our own leftover (same pid, an earlier failed try): not followed
            os.unlink(tmp)
            fd = open_private(tmp, flags)
    except OSError as e:
        raise CheckpointError(f"cannot write a checkpoint in {str(path.parent)!r}: {e.strerror} ({tmp.name}); "
                              "give a run directory you own and can write (--run-dir)") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if e.errno in _DISK_FULL:
            raise _disk_full(path.parent, len(data), e) from None
        raise CheckpointError(f"cannot write checkpoint {str(path)!r}: {e.strerror}") from None


def _check_own_dir(d: Path) -> None:
    """The checkpoint directory is a real directory of this user's, not a link or a file (trust.check_entry: one
    line otherwise)."""
    check_entry(d, "checkpoint directory", "dir")


_ND = "__hj_ndarray__"
_LEAVES = (str, int, float, bool, complex, bytes, type(None), torch.Tensor, torch.dtype, torch.device, torch.Size)


#: the attribute and state_dict key part of torch.compile's wrapper (OptimizedModule) around the module it compiles
_COMPILED = "_orig_mod"


def plain_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module a ``torch.compile`` wrapper (OptimizedModule) compiles, unwrapped; any other module as it is.
    Checkpoints hold its state: the same keys with compile on or off, so either resumes the other."""
    while isinstance(getattr(model, _COMPILED, None), torch.nn.Module):
        model = getattr(model, _COMPILED)
    return model


def plain_state(sd: Mapping[str, Any]) -> dict[str, Any]:
    """A model state_dict with the ``_orig_mod.`` parts of compiled (sub)modules taken out of its keys (the keys of
    the plain model; checkpoints of earlier versions of a compiled model hold them)."""
    return {".".join(p for p in k.split(".") if p != _COMPILED): v for k, v in sd.items()}


def to_plain(obj: Any, where: str = "state") -> Any:
    """``obj`` as tensors, numbers, strings and lists/tuples/dicts, which ``torch.load(weights_only=True)``
    reads; a value of any other type is refused (CheckpointError naming where it is)."""
    if isinstance(obj, _LEAVES):
        return obj
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise CheckpointError(f"cannot checkpoint {where}: a numpy array of Python objects")
        a = np.ascontiguousarray(obj)
        return {_ND: a.tobytes(), "dtype": a.dtype.str, "shape": list(a.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        items = [(k, to_plain(v, f"{where}[{k!r}]")) for k, v in obj.items()]
        return collections.OrderedDict(items) if isinstance(obj, collections.OrderedDict) else dict(items)
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, (list, collections.deque)):
        return [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    raise CheckpointError(f"cannot checkpoint {where}: a {type(obj).__module__}.{type(obj).__qualname__}, "
                          "which a weights_only load cannot read; keep state as tensors, numbers, strings, "
                          "lists and dicts")


def from_plain(obj: Any) -> Any:
    """The inverse of :func:`to_plain` (numpy arrays back; deques stay lists)."""
    if isinstance(obj, dict):
        if _ND in obj and set(obj) == {_ND, "dtype", "shape"}:
            return np.frombuffer(obj[_ND], dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
        out = {k: from_plain(v) for k, v in obj.items()}
        return collections.OrderedDict(out) if isinstance(obj, collections.OrderedDict) else out
    if isinstance(obj, tuple):
        return tuple(from_plain(v) for v in obj)
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    return obj


def save(path: str | os.PathLike, state: Any) -> Path:
    """Checkpoint ``state`` at ``path`` atomically (payload, then its sidecar, the commit record). A failure is
    one line (CheckpointError; DiskFullError for space) and leaves no partial file and no ``.pt`` without a
    valid sidecar behind."""
    path = Path(path)
    _check_own_dir(path.parent)
    check_write_dir(path.parent, "checkpoint directory")   # this user's, not writable by others (trust.py)
    buf = io.BytesIO()
    torch.save(to_plain(state), buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    record = {"format": FORMAT, "sha256": digest, "size": len(payload)}
    _check_space(path.parent, len(payload))
    _write_atomic(path, payload)
    try:
        _write_atomic(sidecar(path), (json.dumps(record) + "\n").encode())
    except CheckpointError:
        remove(path)                    # a .pt without its record is torn: not left for pruning to keep
        raise
    _fsync_dir(path.parent)
    _remember_good(path)
    return path


def _legacy_payload(path: Path, data: bytes) -> bytes:
    head = len(MAGIC) + 65
    if len(data) < head or data[head - 1:head] != b"\n":
        raise CheckpointError(f"checkpoint {path} is truncated or not an hpc-jabas checkpoint")
    digest, payload = data[len(MAGIC):head - 1], data[head:]
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        raise CheckpointError(f"checkpoint {path} is corrupted (checksum mismatch)")
    return payload


def read_verified(path: str | os.PathLike) -> bytes:
    """The checkpoint's bytes after the size and checksum checks (CheckpointError when they fail)."""
    path = Path(path)
    check_file(path, "checkpoint")
    check_file(sidecar(path), "checkpoint record")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e.strerror}") from None
    if data.startswith(MAGIC):
        return _legacy_payload(path, data)
    side = sidecar(path)
    try:
        rec = json.loads(side.read_text())
        size, digest = int(rec["size"]), str(rec["sha256"])
        fmt = rec.get("format", FORMAT)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is truncated or incomplete: its integrity record "
                              f"{side.name} is missing") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {path} is corrupted: its integrity record {side.name} "
                              "is unreadable") from None
    if fmt not in KNOWN_FORMATS:
        raise CheckpointFormatError(
            f"checkpoint {path} has format {fmt!r}, which this hpc-jabas does not read (it reads "
            f"{', '.join(map(repr, KNOWN_FORMATS))}): resume with the hpc-jabas version that wrote it, or move "
            f"{path.name} and {side.name} out of {str(path.parent)!r} to resume from the checkpoint before it")
    if len(data) != size:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupted: {len(data)} bytes, "
                              f"its record says {size}")
    if hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointError(f"checkpoint {path} is corrupted (checksum mismatch)")
    _remember_good(path)
    return data


def _identity(path: Path) -> tuple[int, ...] | None:
    """What identifies a checkpoint's bytes and its record on disk (inode, size, mtime of both)."""
    try:
        a, b = os.stat(path), os.stat(sidecar(path))
    except OSError:
        return None
    return (a.st_ino, a.st_size, a.st_mtime_ns, b.st_ino, b.st_size, b.st_mtime_ns)


_GOOD: dict[str, tuple[int, ...]] = {}       # checkpoints verified (or written) by this process: path -> identity


def _remember_good(path: Path) -> None:
    ident = _identity(path)
    if ident is not None:
        _GOOD[str(path)] = ident


def verify(path: str | os.PathLike) -> str | None:
    """None when checkpoint ``path`` verifies (its record, size and checksum; a format this version does not read
    still counts as whole), else why not. A file this process wrote or verified, unchanged since, is not read
    again."""
    p = Path(path)
    ident = _identity(p)
    if ident is not None and _GOOD.get(str(p)) == ident:
        return None
    try:
        read_verified(p)
    except CheckpointFormatError:
        pass
    except (CheckpointError, UntrustedFileError) as e:
        return str(e)
    _remember_good(p)
    return None


def _numpy_globals() -> list[Any]:
    """What checkpoints of earlier hpc-jabas versions hold besides tensors (numpy arrays and scalars: the numpy
    RNG state): numpy's array and scalar constructors, which build data only (an object array's items go
    through the same restricted unpickler)."""
    core = getattr(np, "_core", None) or np.core
    mod = core.multiarray
    dtypes = getattr(np, "dtypes", None)        # numpy >= 1.25: one class per dtype (no object arrays here)
    kinds = [getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType") and n != "ObjectDType"] if dtypes else []
    return [np.dtype, np.ndarray, mod._reconstruct, mod.scalar, *kinds]


def load(path: str | os.PathLike) -> Any:
    payload = read_verified(path)
    try:       # weights_only: tensors and plain containers, never an arbitrary object (no code runs)
        with torch.serialization.safe_globals(_numpy_globals()):
            st = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:     # a global outside the allow-list: refused, not run
        first = str(e).strip().splitlines()
        why = next((ln.strip() for ln in first if any(w in ln for w in ("GLOBAL", "Unsupported", "but got"))),
                   first[0] if first else "")
        raise CheckpointError(f"checkpoint {path} holds objects a weights_only load refuses ({why[:200]}); "
                              "it was not written by hpc-jabas, or by an older version: re-create it") from None
    except Exception as e:     # a checksummed file that torch cannot read: not a checkpoint of ours
        raise CheckpointError(f"checkpoint {path} is not a torch checkpoint: {e}") from None
    return from_plain(st)


def remove(path: str | os.PathLike) -> None:
    """The checkpoint and its integrity record (missing files ignored)."""
    for p in (Path(path), sidecar(path)):
        try:
            p.unlink()
        except OSError:
            pass


def name_for(epoch: int, iteration: int) -> str:
    return f"ckpt-{epoch:06d}-{iteration:09d}.pt"


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if _NAME.match(p.name)), key=lambda p: p.name)


def latest_good(directory: str | os.PathLike) -> Path | None:
    """The newest checkpoint in ``directory`` that verifies, None when none does."""
    return next((p for p in reversed(list_checkpoints(directory)) if verify(p) is None), None)


def set_aside(path: Path, why: str, log=None) -> Path | None:
    """Rename a torn or unverifiable checkpoint (and its record) to ``<name>.bad``, with a warning; the new
    name, None when it could not be moved (then it is left where it is)."""
    log = log or (lambda m: print(m, file=sys.stderr))
    dest = path.with_name(path.name + BAD_SUFFIX)
    try:
        os.replace(path, dest)
    except OSError:
        return None
    try:
        os.replace(sidecar(path), dest.with_name(sidecar(path).name + BAD_SUFFIX))
    except OSError:
        pass
    log(f"hpc-jabas: set aside checkpoint {path.name} ({why}) as {dest.name}: it does not count as one of the "
        "checkpoints kept; remove it when you no longer need it")
    return dest


def prune(directory: str | os.PathLike, keep: int, newest: Path | None = None, log=None) -> list[Path]:
    """Keep the ``keep`` newest checkpoints that verify (``newest``, the one just written, always among them);
    older ones are removed. A torn or unverifiable one is set aside (:func:`set_aside`) when it is newer than
    ``newest`` or would have been kept, never kept in place of a good one; a good one newer than ``newest`` (a
    run started over in the same directory) is neither counted nor removed, with a warning (a resume would
    continue from it). The kept checkpoints, newest first."""
    say = log or (lambda m: print(m, file=sys.stderr))
    kept: list[Path] = [newest] if newest is not None else []
    for p in reversed(list_checkpoints(directory)):
        if newest is not None and p.name == newest.name:
            continue
        later = newest is not None and p.name > newest.name
        if not later and keep > 0 and len(kept) >= keep:
            remove(p)
            continue
        why = verify(p)
        if why is not None:
            if set_aside(p, why.removeprefix(f"checkpoint {p} is ").removeprefix(f"checkpoint {p} "), log) is None:
                remove(p)
        elif later and newest is not None:
            say(f"hpc-jabas: checkpoint {p.name} is newer than the one just written ({newest.name}): it is kept, "
                "and a resume would continue from it; remove it if this run supersedes it")
        else:
            kept.append(p)
    return kept


def save_in(directory: str | os.PathLike, state: Any, epoch: int, iteration: int, keep: int = 3,
            log=None) -> Path:
    """Save as ckpt-<epoch>-<iteration>.pt in directory; keep the newest ``keep`` good ones (:func:`prune`).
    Temporary files a killed writer left behind are removed first (one writer: the run directory's lock)."""
    d = Path(directory)
    _check_own_dir(d)
    for stale in d.glob(".ckpt-*.pt*.tmp*") if d.is_dir() else []:
        try:
            stale.unlink()
        except OSError:
            pass
    p = save(d / name_for(epoch, iteration), state)
    prune(d, keep, newest=p, log=log)
    return p


def load_latest(directory: str | os.PathLike, log=None) -> tuple[Any, Path] | None:
    """Newest good checkpoint in directory, or None when there is none at all."""
    log = log or (lambda m: print(m, file=sys.stderr))
    cands = list_checkpoints(directory)
    bad = []
    for p in reversed(cands):
        try:
            return load(p), p
        except CheckpointFormatError:
            raise                        # a newer version's checkpoint: not skipped past silently
        except CheckpointError as e:
            bad.append(p)
            log(f"hpc-jabas: skipping bad checkpoint: {e}; trying the previous one")
    if bad:
        raise CheckpointError(f"no usable checkpoint in {directory}: all {len(bad)} are truncated or corrupted")
    return None
