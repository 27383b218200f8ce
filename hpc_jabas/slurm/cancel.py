"""Ending a chain on purpose: ``hpc-jabas cancel CHAIN_DIR``, and a user's plain ``scancel`` of a chain's job.

A chain goes on by itself: a job told to stop at a safe point checkpoints and is requeued (runtime/job/launch.py),
a move submits the next job, a failure is resubmitted. Two things end it instead, each told apart from Slurm's
own stops by what is recorded, not by guessing:

* ``hpc-jabas cancel CHAIN_DIR`` (:func:`cancel_chain`) first appends a ``cancel`` event to the chain, then asks
  every running job of the chain to stop (``scancel --signal=TERM JOB``: the ranks of its steps, not the batch
  shell; they checkpoint at their next safe point) and cancels every pending one (plain ``scancel``). A running
  job that has not written its ``start`` event yet is not signalled (its ranks may not have their handlers yet):
  it reads the event when it starts and stops at its first safe point. Every job that would submit a successor
  (a stop, a move, a failure) reads the event first (:func:`chain_cancel`) and submits nothing.
* a plain ``scancel JOB``: Slurm records the job CANCELLED at once (sacct ``CANCELLED by <uid>``; squeue says
  COMPLETING) and sends TERM to its processes, KILL ``KillWait`` seconds later; the ranks checkpoint at their
  next safe point, rank 0 reads that state (:func:`slurm_cancelled`) and submits nothing.

Slurm's own stops still requeue: a preemption's TERM comes while the job is RUNNING (its ``GraceTime``; sacct
later says PREEMPTED), a time limit's warning is ``--signal=[B:]USR1@lead`` while RUNNING, and the limit itself
is TIMEOUT. ``scancel --signal=...`` (a signal only) is not a cancel either.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpc_jabas.errors import ConfigError, JabasError, SlurmError
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.slurm import cluster, proc, watch

#: the chain event that ends a chain on purpose
EVENT = "cancel"
#: how long rank 0 waits for sacct to record a cancel that squeue already shows (COMPLETING)
SACCT_LAG_S = 3.0


def _chain_of(events: list[dict], job_id: str) -> list[str]:
    return next((c for c in watch.split_chains(events) if str(job_id) in c), [str(job_id)])


def _first_time(events: list[dict], jobs: list[str]) -> float:
    ids = set(jobs)
    return min([float(e.get("time", 0.0)) for e in events
                if ids & {str(e.get(k)) for k in ("job_id", "from_job", "to_job") if e.get(k) is not None}]
               or [float("inf")])


def chain_cancel(events: list[dict], job_id: str) -> dict | None:
    """The ``cancel`` event that ends the chain ``job_id`` belongs to (one recorded after that chain began: a
    chain submitted again into the same directory is a new chain and goes on), or None."""
    t0 = _first_time(events, _chain_of(events, job_id))
    return next((e for e in reversed(events) if e.get("event") == EVENT and float(e.get("time", 0.0)) >= t0), None)


def slurm_cancelled(job_id: str, env: Mapping[str, str] | None = None, lag_s: float = SACCT_LAG_S,
                    sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Slurm's record when the job was cancelled (``scancel`` without ``--signal``: sacct CANCELLED), else None.
    squeue shows a cancelled job as COMPLETING before sacct may have it: then sacct is asked again for up to
    ``lag_s`` seconds. Slurm not answering: None (a stop is then requeued as before)."""
    end = time.time() + lag_s
    while True:
        try:
            st = watch.sacct_states([job_id], env).get(str(job_id), {}).get("State", "")
        except JabasError:
            return None
        if st == "CANCELLED":
            return st
        if time.time() >= end or cluster.job_clock(job_id, env)["state"] != "COMPLETING":
            return None
        sleep(0.3)


def stop_cause(chain_dir: str | Path, job_id: str, under_slurm: bool,
               env: Mapping[str, str] | None = None) -> dict | None:
    """Rank 0 of a job that stopped at a safe point (or failed): why the chain ends here instead of going on --
    {"by": "hpc-jabas cancel", "time": ...} or {"by": "scancel", "slurm": "CANCELLED"} -- or None (requeue)."""
    ev = chain_cancel(chainlog.read(chain_dir), job_id)
    if ev is not None:
        return {"by": "hpc-jabas cancel", "requested": ev.get("time")}
    if under_slurm:
        st = slurm_cancelled(job_id, env)
        if st is not None:
            return {"by": "scancel", "slurm": st}
    return None


def _signal(job_id: str, env: Mapping[str, str] | None) -> None:
    proc.run(["scancel", "--signal=TERM", str(job_id)], env, refused=f"scancel could not signal job {job_id}")


def _cancel(job_id: str, env: Mapping[str, str] | None) -> None:
    proc.run(["scancel", str(job_id)], env, refused=f"scancel could not cancel job {job_id}")


def cancel_chain(chain_dir: str | Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """End the chains of ``chain_dir``: record the ``cancel`` event, then signal each running job that has started
    (it checkpoints at its next safe point and ends) and cancel each pending one. Returns {"event", "running",
    "starting", "pending", "ended"} (job ids). ConfigError when the directory holds no chain; SlurmError when
    Slurm cannot be asked."""
    d = Path(chain_dir)
    events = chainlog.read(d) if d.is_dir() else []
    if not events:
        raise ConfigError(f"{str(chain_dir)!r} holds no chain (no events in {chainlog.path(d)}); "
                          "give the chain_dir of a submitted job")
    env = dict(os.environ if env is None else env)
    proc.require(("scancel", "sacct"), env)
    ids = sorted({str(e[k]) for e in events for k in ("job_id", "from_job", "to_job")
                  if e.get(k) is not None and str(e[k]).isdigit()}, key=int)
    rec = chainlog.append(d, EVENT, by="user", jobs=ids)
    events = chainlog.read(d)            # read after the event: a job starting later reads it itself
    states = watch.sacct_states(ids, env)
    out: dict[str, Any] = {"event": rec, "running": [], "starting": [], "pending": [], "ended": []}
    for j in ids:
        st = states.get(j, {}).get("State", "")
        if st in watch.TERMINAL or not st:
            out["ended"].append(j)
        elif st in ("PENDING", "REQUEUED", "SUSPENDED"):
            _cancel(j, env)
            out["pending"].append(j)
        elif any(e.get("event") == "start" and str(e.get("job_id")) == j and float(e["time"]) >= _last_submit(events, j)
                 for e in events):
            _signal(j, env)
            out["running"].append(j)
        else:
            out["starting"].append(j)     # it reads the cancel event when it starts
    return out


def _last_submit(events: list[dict], job_id: str) -> float:
    """When this run of the job began at the latest (its last submit or requeue-in-place event; 0 when none)."""
    return max([float(e.get("time", 0.0)) for e in events if str(e.get("job_id") or e.get("to_job")) == job_id
                and e.get("event") in ("submit", "requeue")] or [0.0])


def wait_ended(chain_dir: str | Path, jobs: list[str], timeout_s: float, poll_s: float = 1.0,
               env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Until each of ``jobs`` has recorded its end in the chain or Slurm lists it as ended (at most ``timeout_s``):
    job id -> its chain end state ("cancelled", ...), its Slurm state, or "running" when still going."""
    deadline = time.time() + timeout_s
    while True:
        ev = chainlog.read(chain_dir)
        out: dict[str, str] = {}
        try:
            states = watch.sacct_states(jobs, env) if jobs else {}
        except SlurmError:
            states = {}
        for j in jobs:
            end = next((e for e in reversed(ev) if e.get("event") == "end" and str(e.get("job_id")) == j), None)
            st = states.get(j, {}).get("State", "")
            out[j] = str(end["state"]) if end is not None else st if st in watch.TERMINAL else "running"
        if all(v != "running" for v in out.values()) or time.time() >= deadline:
            return out
        time.sleep(poll_s)
