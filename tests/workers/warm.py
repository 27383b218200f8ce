"""What the warm helper processes of the test suite share (pool_worker.py, fork_server.py): waiting for the
next request file, and ending when told to or when the test process that started them is gone."""
import json
import os
import sys
import time
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def next_request(directory: Path, k: int, owner: int, poll_s: float = 0.01) -> dict:
    """The request ``req<k>.json`` once it is there; exits the process on ``stop`` or when ``owner`` died."""
    req = directory / f"req{k}.json"
    while not req.exists():
        if (directory / "stop").exists() or not _alive(owner):
            sys.exit(0)
        time.sleep(poll_s)
    return json.loads(req.read_text())


def answer(directory: Path, name: str, value: dict) -> None:
    """Write ``name`` atomically (the test process polls for it)."""
    tmp = directory / f".{name}.tmp"
    tmp.write_text(json.dumps(value))
    tmp.rename(directory / name)
