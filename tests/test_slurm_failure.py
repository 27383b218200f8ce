"""A submitit job whose rank is killed is resubmitted from the last good checkpoint (submitit's
teardown lines run the same recovery as a method-"sbatch" job script: bounded retries, backoff, failed nodes
excluded), and the chain finishes with the uninterrupted run's parameters."""
from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import localcluster
import pytest
from mpi_util import PY, ROOT
from reference import reference_run
from test_preemption import CHAIN_CFG, PLAN, _iterations

from hpc_jabas.slurm import chain as chainlog

pytestmark = pytest.mark.slurm


def kill_rank(job_id: str, rank: int) -> int:
    """SIGKILL one rank of a job (localcluster.kill_rank); fails when it is not found."""
    pid = localcluster.kill_rank(job_id, rank)
    assert pid is not None, f"no rank {rank} of job {job_id} found"
    return pid


def test_submitit_job_with_a_killed_rank_is_resubmitted_from_the_last_checkpoint(slurm_cluster, slurm_tmp):
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.runtime.persist.checkpoint import load_latest
    from hpc_jabas.slurm.executor import submit
    from hpc_jabas.slurm.watch import wait_chain
    chain = slurm_tmp / "chain"
    k = random.Random(os.getpid() + 4).randint(5, 22)
    spec = JobSpec(task="preempt_task:build", config=dict(CHAIN_CFG), chain_dir=str(chain), mix={"rtx2060": 2},
                   method="submitit", pythonpath=[str(ROOT), str(ROOT / "tests")], python=PY)
    first = submit(spec).job_id
    jobs = [first]
    try:
        end = time.time() + 120
        while not any(r["it"] >= k for r in _iterations(chain)):
            assert time.time() < end, f"job {first} never reached iteration {k}: {chainlog.read(chain)}"
            time.sleep(0.2)
        kill_rank(first, 1)
        res = wait_chain(chain, first, timeout=240, poll_s=0.5)
        jobs = res["jobs"]
        ev = chainlog.read(chain)
        assert res["ok"], (res, json.dumps(ev))
        assert slurm_cluster.wait_state(res["job_id"]) == "COMPLETED"
        jobs = []
    finally:
        slurm_cluster.cancel(*jobs)
    assert slurm_cluster.job_state(first) == "FAILED"
    (req,) = [e for e in ev if e["event"] == "requeue"]
    assert req["reason"] == "failure" and req["method"] == "submitit" and str(req["from_job"]) == first, req
    assert req["attempt"] == 1 and req["excluded"] == [] and res["jobs"] == [first, str(req["to_job"])]
    failed = next(e for e in ev if e["event"] == "end" and e.get("state") == "failed")
    assert 0 <= failed["lost_iterations"] <= CHAIN_CFG["checkpoint_every"], failed
    assert failed["lost_iterations"] == req["lost_iterations"]
    assert sorted({r["it"] for r in _iterations(chain)}) == list(range(30))      # repeats only, none skipped
    starts = [e for e in ev if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["resumed"] and starts[1]["iteration"] == failed["iteration"], starts
    state = load_latest(Path(chain) / "run" / "checkpoints")[0]
    assert state["iteration"] == 30
    ref = reference_run({"optimizer": "adam", "lr": 0.01, "plan": PLAN, "steps": 30, "n": 240})
    for name, want in ref.items():
        err = float((state["model"][name] - want).abs().max() / (want.abs().max() + 1e-12))
        assert err <= 1e-6, f"{name}: relative difference {err:.2e} to the uninterrupted run"


def test_a_job_that_fails_twice_of_the_same_error_is_not_resubmitted_again(slurm_cluster, slurm_tmp):
    """A task whose builder raises the same error every time: the first failure is resubmitted (it may be a
    one-off), the second, with the same signature (type, message, place), is not; its end event and the job's
    output say why, in one line. Two allocations, not 1 + max_failures."""
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.slurm.executor import submit
    from hpc_jabas.slurm.watch import wait_chain
    (slurm_tmp / "hjdetfail.py").write_text("def build():\n    raise RuntimeError('no such file: data.npz')\n")
    chain = slurm_tmp / "chain-detfail"
    spec = JobSpec(task="hjdetfail:build", config=dict(CHAIN_CFG, slurm={"time_min": 15, "max_failures": 3}),
                   chain_dir=str(chain), mix={"rtx2060": 2}, method="sbatch",
                   pythonpath=[str(ROOT), str(ROOT / "tests"), str(slurm_tmp)], python=PY)
    first = submit(spec).job_id
    res = wait_chain(chain, first, timeout=240, poll_s=0.5)
    ev = chainlog.read(chain)
    slurm_cluster.cancel(*res["jobs"])
    assert not res["ok"] and len(res["jobs"]) == 2, (res, json.dumps(ev))
    second = res["jobs"][1]
    (req,) = [e for e in ev if e["event"] == "requeue"]
    assert req["reason"] == "failure" and str(req["from_job"]) == first and str(req["to_job"]) == second
    sig = req["signature"]
    assert sig["type"] == "builtins.RuntimeError" and sig["where"].endswith("hjdetfail.py:2"), sig
    ends = [e for e in ev if e["event"] == "end"]
    assert [e["state"] for e in ends] == ["failed", "failed"] and all(e["signature"] == sig for e in ends)
    assert ends[-1]["resubmitted"] is False and f"same error as job {first}" in ends[-1]["message"]
    assert {str(e["job_id"]) for e in ev if e["event"] == "error"} == {first, second}
    outs = {q.name: q.read_text() for q in (chain / "jobs").rglob("*") if q.is_file() and q.suffix in (".out", ".err")}
    said = [ln for text in outs.values() for ln in text.splitlines() if "not resubmitted" in ln]
    assert len(said) == 1 and f"job {second} failed" in said[0], (sorted(outs), said)
