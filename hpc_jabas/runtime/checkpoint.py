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
"""
from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import pickle
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpc_jabas.errors import CheckpointError
from hpc_jabas.trust import check_file, open_private, private_dir

MAGIC = b"HPCJABAS1\n"               # the first format's header (read only)
FORMAT = "hpc-jabas-checkpoint/2"
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


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


_ND = "__hj_ndarray__"
_LEAVES = (str, int, float, bool, complex, bytes, type(None), torch.Tensor, torch.dtype, torch.device, torch.Size)


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
    path = Path(path)
    private_dir(path.parent)
    buf = io.BytesIO()
    torch.save(to_plain(state), buf)
    payload = buf.getvalue()
    record = {"format": FORMAT, "sha256": hashlib.sha256(payload).hexdigest(), "size": len(payload)}
    _write_atomic(path, payload)
    _write_atomic(sidecar(path), (json.dumps(record) + "\n").encode())
    _fsync_dir(path.parent)
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
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} is truncated or incomplete: its integrity record "
                              f"{side.name} is missing") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {path} is corrupted: its integrity record {side.name} "
                              "is unreadable") from None
    if len(data) != size:
        raise CheckpointError(f"checkpoint {path} is truncated or corrupted: {len(data)} bytes, "
                              f"its record says {size}")
    if hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointError(f"checkpoint {path} is corrupted (checksum mismatch)")
    return data


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


def save_in(directory: str | os.PathLike, state: Any, epoch: int, iteration: int, keep: int = 3) -> Path:
    """Save as ckpt-<epoch>-<iteration>.pt in directory; keep the newest ``keep`` good ones.
    Temporary files a killed writer left behind are removed first (one writer: the run directory's lock)."""
    for stale in Path(directory).glob(".ckpt-*.pt*.tmp*") if Path(directory).is_dir() else []:
        try:
            stale.unlink()
        except OSError:
            pass
    p = save(Path(directory) / name_for(epoch, iteration), state)
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        remove(old)
    return p


def load_latest(directory: str | os.PathLike, log=None) -> tuple[Any, Path] | None:
    """Newest good checkpoint in directory, or None when there is none at all."""
    log = log or (lambda m: print(m, file=sys.stderr))
    cands = list_checkpoints(directory)
    bad = []
    for p in reversed(cands):
        try:
            return load(p), p
        except CheckpointError as e:
            bad.append(p)
            log(f"hpc-jabas: skipping bad checkpoint: {e}; trying the previous one")
    if bad:
        raise CheckpointError(f"no usable checkpoint in {directory}: all {len(bad)} are truncated or corrupted")
    return None
