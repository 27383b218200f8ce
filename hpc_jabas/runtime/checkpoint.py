"""Atomic, checksummed checkpoints (design.md invariant 6).

File layout: b"HPCJABAS1\\n" + 64 hex chars of SHA-256 of the payload + b"\\n" + payload
(torch.save bytes). Written to a temporary file in the same directory, fsynced, renamed over
the final name, directory fsynced. Loading verifies the checksum; ``load_latest`` walks from the
newest checkpoint to older ones and uses the first good one, naming each bad one it skipped.
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

from hpc_jabas.errors import CheckpointError

MAGIC = b"HPCJABAS1\n"
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


def save(path: str | os.PathLike, state: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(MAGIC + digest + b"\n" + payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return path


def load(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} cannot be read: {e.strerror}") from None
    head = len(MAGIC) + 65
    if len(data) < head or not data.startswith(MAGIC) or data[head - 1:head] != b"\n":
        raise CheckpointError(f"checkpoint {path} is truncated or not an hpc-jabas checkpoint")
    digest, payload = data[len(MAGIC):head - 1], data[head:]
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        raise CheckpointError(f"checkpoint {path} is corrupted (checksum mismatch)")
    return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)


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
    for stale in Path(directory).glob(".ckpt-*.pt.tmp*") if Path(directory).is_dir() else []:
        try:
            stale.unlink()
        except OSError:
            pass
    p = save(Path(directory) / name_for(epoch, iteration), state)
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        try:
            old.unlink()
        except OSError:
            pass
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
