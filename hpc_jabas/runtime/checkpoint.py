"""Atomic checkpoints that plain ``torch.load`` reads, with their integrity data beside them (invariant 6).

File layout: ``ckpt-<epoch>-<iteration>.pt`` is exactly what ``torch.save`` wrote (a dict with
"model", "optimizer", ... for the Trainer), so ``torch.load(path, weights_only=False)`` reads it
without hpc-jabas. Its integrity record is the sidecar ``<name>.sha256``: one JSON line
``{"format": "hpc-jabas-checkpoint/2", "sha256": ..., "size": ...}``. Writing: the payload goes to a
temporary file in the same directory (fsynced, renamed over the final name), then the sidecar the
same way, then the directory is fsynced: the sidecar is the commit record, so a ``.pt`` without one
(a writer killed between the two renames) counts as incomplete. Loading checks the size
(truncation) and the SHA-256 (corruption) before unpickling; ``load_latest`` walks from the newest
checkpoint to older ones and uses the first good one, naming each bad one it skipped. Files of the
first format (b"HPCJABAS1\\n" + checksum + payload in one file) are still read.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

from hpc_jabas.errors import CheckpointError

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
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(path: str | os.PathLike, state: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
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


def load(path: str | os.PathLike) -> Any:
    payload = read_verified(path)
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as e:     # a checksummed file that torch cannot read: not a checkpoint of ours
        raise CheckpointError(f"checkpoint {path} is not a torch checkpoint: {e}") from None


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
