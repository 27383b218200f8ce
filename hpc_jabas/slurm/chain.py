"""The resubmission chain's record: chain.jsonl in the chain directory (append-only, one event a line).

Events: submit (job id, mix, by whom), start (job id, mix, world, epoch, iteration, wall time),
move (from job, to job, new mix, epoch, checkpoint time), end (job id, epochs, wall_s, cost), error (a rank's
exception that ended the job: its ``signature``, see ``failure_signature``).
"""
from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

from hpc_jabas.errors import ConfigError
from hpc_jabas.trust import check_file, check_write_dir, open_append_nofollow, write_all


def path(chain_dir: str | Path) -> Path:
    return Path(chain_dir) / "chain.jsonl"


def append(chain_dir: str | Path, event: str, **kw) -> dict:
    rec = {"event": event, "time": time.time(), **kw}
    p = path(chain_dir)
    check_write_dir(p.parent, "chain directory")      # this user's, not writable by others (hpc_jabas/trust.py)
    fd = open_append_nofollow(p, "chain record")      # never through a link
    try:
        write_all(fd, (json.dumps(rec, default=str) + "\n").encode())     # one whole line
        os.fsync(fd)
    finally:
        os.close(fd)
    return rec


def read(chain_dir: str | Path) -> list[dict]:
    p = path(chain_dir)
    if not p.exists():
        return []
    check_file(p, "chain record")        # its events decide what is resubmitted: not one others can write
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"chain record {str(p)!r} cannot be read: {e.strerror}") from None
    out = []
    for n, b in enumerate(raw.splitlines(), 1):
        try:
            ln = b.decode("utf-8")
        except UnicodeDecodeError:       # hpc-jabas writes ASCII JSON: not a record of ours
            raise ConfigError(f"chain record {str(p)!r}: line {n} is not valid UTF-8; it was not written by "
                              "hpc-jabas (restore the file or start a new chain_dir)") from None
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:     # a line torn by a killed writer
            continue
        if isinstance(rec, dict) and "event" in rec:
            out.append(rec)
    return out


def summarize(events: list[dict]) -> list[dict]:
    """One row per job: id, mix, epochs, wall time, cost, state."""
    jobs: dict[str, dict] = {}
    order: list[str] = []
    for e in events:
        jid = str(e.get("job_id") or e.get("to_job") or "")
        if e["event"] == "submit":
            if jid not in jobs:
                order.append(jid)
            jobs.setdefault(jid, {"job_id": jid, "mix": e.get("mix"), "state": "submitted", "epochs": None,
                                  "wall_s": None, "cost": None, "submitted": e["time"]})
        elif e["event"] == "start":
            if jid not in jobs:
                order.append(jid)
                jobs[jid] = {"job_id": jid, "mix": e.get("mix"), "epochs": None, "wall_s": None, "cost": None}
            jobs[jid].update(state="running", start_epoch=e.get("epoch"), started=e["time"], world=e.get("world"))
        elif e["event"] == "move":
            j = jobs.get(str(e.get("from_job")))
            if j is not None:
                j.update(state="moved", end_epoch=e.get("epoch"), next=e.get("to_job"))
        elif e["event"] == "replan":      # cancelled while pending on unavailable nodes (slurm/replan.py)
            j = jobs.get(str(e.get("from_job")))
            if j is not None:
                j.update(state="replanned", next=e.get("to_job"), wall_s=0.0, cost=0.0, epochs=None)
        elif e["event"] == "end":
            j = jobs.get(jid)
            if j is not None:
                j.update(epochs=e.get("epochs"), wall_s=e.get("wall_s"), cost=e.get("cost"),
                         state=j.get("state") if j.get("state") == "moved" else e.get("state", "finished"))
    return [jobs[j] for j in order]


#: a failure signature's message is cut to this many characters
SIGNATURE_MESSAGE_CHARS = 300


def failure_signature(exc: BaseException) -> dict:
    """What identifies a deterministic error: the exception's type, its message (one line) and the innermost
    frame of its traceback (file:line) -- the same three for the same bug on the same input."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    message = " ".join(str(exc).split())[:SIGNATURE_MESSAGE_CHARS]
    return {"type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": message, "where": where}


def signature_text(sig: dict) -> str:
    return f"{sig.get('type')}: {sig.get('message')} at {sig.get('where')}"


def job_failure_signature(events: list[dict], job_id: str, since: float = 0.0) -> dict | None:
    """The signature of the error that ended this run of the job (its first ``error`` event since ``since``,
    its start): the rank that failed first. None when no rank reported one (a killed rank, a lost node)."""
    for e in events:
        if (e.get("event") == "error" and str(e.get("job_id")) == str(job_id)
                and float(e.get("time", 0)) >= since and isinstance(e.get("signature"), dict)):
            return e["signature"]
    return None


def repeated_failure(events: list[dict], signature: dict | None, before: float) -> dict | None:
    """The chain's previous failure (its last ``end`` event with state failed, recorded before ``before``) when
    it had the same signature: the same error at the same place again, which a resubmission would repeat.
    None otherwise (no signature, no earlier failure, or a different one)."""
    if not signature:
        return None
    failed = [e for e in events if e.get("event") == "end" and e.get("state") == "failed"
              and float(e.get("time", 0)) < before]
    if failed and failed[-1].get("signature") == signature:
        return failed[-1]
    return None
