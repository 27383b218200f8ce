"""Ending a chain on purpose, on the real local Slurm cluster (beside tests/test_preemption.py, whose USR1/USR2 and
real-preemption tests show that Slurm's own stops still requeue):

- ``hpc-jabas cancel CHAIN_DIR`` (method sbatch): the running job stops at its next safe point with a checkpoint,
  exits, and no successor is submitted (sacct lists one job of the chain, COMPLETED; squeue none);
- a user's plain ``scancel JOB`` (method submitit, whose own handler would requeue): Slurm records CANCELLED, the
  ranks checkpoint at their next safe point within KillWait, and the chain ends there too.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from mpi_util import PY, ROOT
from test_preemption import CHAIN_CFG, _iterations

from hpc_jabas.slurm import chain as chainlog

pytestmark = pytest.mark.slurm
HPC_JABAS = str(ROOT / ".venv" / "bin" / "hpc-jabas")
#: the preemption tests' chain, slower (30 iterations of 0.25 s): the stop lands well before its end
CFG = dict(CHAIN_CFG, emulate_base_s=0.25)


def _start(chain: Path, method: str, k: int) -> tuple[str, str]:
    """Submit the chain under a job name of its own; wait for iteration k. (first job id, job name)"""
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.slurm.executor import submit
    name = f"hjc-{uuid.uuid4().hex[:8]}"
    spec = JobSpec(task="preempt_task:build", config=dict(CFG), chain_dir=str(chain), mix={"rtx2060": 2},
                   method=method, pythonpath=[str(ROOT), str(ROOT / "tests")], python=PY, extra={"job_name": name})
    first = submit(spec).job_id
    end = time.time() + 150
    while not any(r["it"] >= k for r in _iterations(chain)):
        assert time.time() < end, f"job {first} never reached iteration {k}: {chainlog.read(chain)}"
        time.sleep(0.2)
    return first, name


def _ended_without_successor(cluster, chain: Path, first: str, name: str, k: int, by: str, slurm_state: str) -> int:
    """The chain ended on purpose at a safe point after iteration k: one end event ("cancelled", by ``by``), its
    checkpoint on disk at that iteration, no iteration lost, no requeue, no second job in Slurm."""
    from hpc_jabas.runtime.persist.checkpoint import load_latest
    from hpc_jabas.slurm.watch import wait_chain
    res = wait_chain(chain, first, timeout=150, poll_s=0.5)
    ev = chainlog.read(chain)
    try:
        assert res["state"] == "cancelled" and res["jobs"] == [first], (res, json.dumps(ev))
        assert cluster.wait_state(first, timeout=60) == slurm_state
    finally:
        cluster.cancel(*res["jobs"])
    time.sleep(2.0)               # a successor would have been submitted by now (right after the end event)
    ends = [e for e in ev if e["event"] == "end"]
    assert len(ends) == 1 and ends[0]["state"] == "cancelled" and ends[0]["cancelled_by"] == by, ev
    stop_it = ends[0]["iteration"]
    assert k <= stop_it < 30, (k, stop_it)
    assert not [e for e in ev if e["event"] in ("requeue", "move")], ev
    assert [e["event"] for e in ev].count("start") == 1 and [e["event"] for e in ev].count("submit") == 1, ev
    state, path = load_latest(chain / "run" / "checkpoints")
    assert state["iteration"] == stop_it and path.name == Path(ends[0]["checkpoint"]).name, (state["iteration"], path)
    assert sorted(r["it"] for r in _iterations(chain)) == list(range(stop_it))      # nothing lost or repeated
    acct = cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,State", "--name", name, "-S", "now-1hours").stdout
    rows = [ln.split("|") for ln in acct.splitlines() if ln.strip()]
    assert [r[0] for r in rows] == [first] and rows[0][1].startswith(slurm_state), acct     # no successor
    # no successor in the queue: only the cancelled job itself, while Slurm completes it (its processes may take
    # a few seconds to end on a loaded machine), and then nothing
    end = time.time() + 60
    while (left := cluster.run("squeue", "-h", "-n", name, "-o", "%i").stdout.split()) and time.time() < end:
        assert left == [first], left
        time.sleep(1.0)
    assert left == [], left
    st = subprocess.run([HPC_JABAS, "status", str(chain)], capture_output=True, text=True, env=cluster.env, timeout=60)
    want = f"current: cancelled ({by}): job {first} stopped at iteration {stop_it}"
    assert st.returncode == 0 and want in st.stdout, st.stdout + st.stderr
    return stop_it


def test_hpc_jabas_cancel_ends_the_chain_with_a_checkpoint(slurm_cluster, slurm_tmp):
    chain = slurm_tmp / "chain"
    k = random.Random(os.getpid() + 11).randint(3, 10)
    first, name = _start(chain, "sbatch", k)
    r = subprocess.run([HPC_JABAS, "cancel", str(chain), "--wait", "90"], capture_output=True, text=True,
                       env=slurm_cluster.env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert f"job {first} stops at its next safe point with a checkpoint" in lines[0], r.stdout
    assert lines[1:] == [f"job {first}: cancelled"], r.stdout
    _ended_without_successor(slurm_cluster, chain, first, name, k, "hpc-jabas cancel", "COMPLETED")
    cancels = [e for e in chainlog.read(chain) if e["event"] == "cancel"]
    assert len(cancels) == 1 and cancels[0]["jobs"] == [first]


def test_plain_scancel_ends_the_chain_instead_of_requeueing(slurm_cluster, slurm_tmp):
    chain = slurm_tmp / "chain"
    k = random.Random(os.getpid() + 12).randint(3, 10)
    first, name = _start(chain, "submitit", k)
    slurm_cluster.run("scancel", first)
    _ended_without_successor(slurm_cluster, chain, first, name, k, "scancel", "CANCELLED")
    assert not [e for e in chainlog.read(chain) if e["event"] == "cancel"]     # Slurm's record alone told it


def test_a_cancel_ends_the_chains_begun_before_it_only():
    """Pure: the cancel event applies to the chains of the directory that began before it (their later jobs,
    moved or requeued, included), not to a chain submitted again afterwards."""
    from hpc_jabas.slurm.cancel import chain_cancel

    def ev(event, t, **kw):
        return {"event": event, "time": float(t), **kw}
    first = [ev("submit", 1, job_id="5", by="user"), ev("start", 2, job_id="5"),
             ev("move", 3, from_job="5", to_job="6"), ev("submit", 3, job_id="6", by="job 5")]
    cancel = ev("cancel", 4, by="user", jobs=["5", "6"])
    later = [ev("submit", 9, job_id="8", by="user"), ev("start", 10, job_id="8")]
    events = first + [cancel] + later
    assert chain_cancel(events, "5") == cancel and chain_cancel(events, "6") == cancel
    assert chain_cancel(events, "8") is None                      # a new chain in the same directory goes on
    assert chain_cancel(first, "6") is None                       # nothing cancelled
    again = events + [ev("cancel", 11, by="user", jobs=["8"])]
    assert chain_cancel(again, "8")["time"] == 11.0
