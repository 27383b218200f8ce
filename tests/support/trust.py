"""A planted checkpoint, as anyone who can write a run directory could make one (tests/test_trust.py,
bench/faults.py's ``planted`` section)."""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import torch

from hpc_jabas.runtime.persist import checkpoint as ckpt


class Payload:
    """What a planted checkpoint would carry: code run on unpickling."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


def plant(p: Path, obj) -> None:
    """A checkpoint with a matching sidecar, as anyone who can write the directory could make."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    p.write_bytes(data)
    ckpt.sidecar(p).write_text(json.dumps({"format": ckpt.FORMAT, "sha256": hashlib.sha256(data).hexdigest(),
                                           "size": len(data)}) + "\n")
