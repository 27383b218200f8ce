"""A successor that pends on drained/down nodes is cancelled and re-planned onto the next-best
feasible mix (slurm/replan.py, core/autoscale.replan); with no feasible mix it waits, keeping its checkpoint."""
from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest
from mpi_util import PY, ROOT
from support.slurm_records import node as _node
from support.slurm_records import part as _part
from test_preemption import CHAIN_CFG, _iterations, check_exact

from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.slurm import replan as rp
from hpc_jabas.slurm.cluster import build_view

TYPES = {"a100": "a100", "rtx2060": "rtx2060", "v100": "v100"}


def _view(v_state: str):
    nodes = [_node("gpua1", "gpu:a100:2", "IDLE", "a100"), _node("gpur1", "gpu:rtx2060:4", "IDLE", "rtx2060"),
             _node("gpuv1", "gpu:v100:2", v_state, "v100"), _node("gpuv2", "gpu:v100:2", v_state, "v100")]
    return build_view(nodes, [_part("a100", "gpua1", "CPU=0.0,GRES/gpu=4.0"),
                              _part("rtx2060", "gpur1", "CPU=0.0,GRES/gpu=1.0"), _part("v100", "gpuv[1-2]")])


def test_replan_ranks_by_the_decision_table_else_most_gpus_cheapest():
    table = [{"mix": {"v100": 2}, "feasible": True, "total_time_s": 10.0, "total_cost": 5.0},
             {"mix": {"a100": 2}, "feasible": True, "total_time_s": 12.0, "total_cost": 9.0},
             {"mix": {"rtx2060": 3}, "feasible": True, "total_time_s": 15.0, "total_cost": 2.0},
             {"mix": {"rtx2060": 4}, "feasible": False, "total_time_s": None, "total_cost": None}]
    free = {"a100": 2, "rtx2060": 4, "v100": 0}
    assert autoscale.replan({"v100": 2}, free, TYPES, ["v100"], table) == {"a100": 2}
    assert autoscale.replan({"v100": 2}, free, TYPES, ["v100"], table, objective="cost") == {"rtx2060": 3}
    assert autoscale.replan({"v100": 2}, {**free, "a100": 1}, TYPES, ["v100"], table) == {"rtx2060": 3}
    # no table: at most the pending mix's 2 GPUs, the most, then the lowest rate
    rates = {"a100": 4.0, "rtx2060": 1.0, "v100": 2.0}
    assert autoscale.replan({"v100": 2}, free, TYPES, ["v100"], None, rates=rates) == {"rtx2060": 2}
    assert autoscale.replan({"v100": 2}, {"a100": 1, "rtx2060": 0}, TYPES, ["v100"], None, rates=rates) == {"a100": 1}
    assert autoscale.replan({"v100": 2}, {"a100": 0, "rtx2060": 0, "v100": 4}, TYPES, ["v100"], None) is None


def test_stuck_partitions_from_node_states_and_reasons():
    up, drained = _view("IDLE"), _view("IDLE+DRAIN")
    assert rp.stuck_partitions({"v100": 2}, up, ["Resources"]) == []
    assert rp.stuck_partitions({"v100": 2, "a100": 1}, drained, ["Resources"]) == ["v100"]
    assert rp.stuck_partitions({"v100": 2}, _view("DOWN*"), [""]) == ["v100"]
    # the nodes are up in the view but Slurm names them unavailable (a reservation, a race)
    assert rp.stuck_partitions({"v100": 2, "a100": 1}, up, ["ReqNodeNotAvail, UnavailableNodes:gpuv[1-2]"]) == ["v100"]
    assert rp.stuck_partitions({"v100": 5}, up, ["PartitionNodeLimit"]) == ["v100"]       # asks more than exist
    said = "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"
    assert rp.stuck_partitions({"v100": 2, "a100": 1}, up, [said]) == ["a100", "v100"]    # squeue names no node
    assert rp.stuck_partitions({"v100": 2, "a100": 1}, drained, [said]) == ["v100"]
    assert [rp.backoff_s(k) for k in (1, 2, 3, 10)] == [10.0, 20.0, 40.0, 300.0]


def test_no_feasible_mix_waits_with_backoff_and_keeps_the_job(tmp_path, monkeypatch):
    from hpc_jabas.core.config.jobspec import JobSpec
    spec = JobSpec(task="x:y", config={}, chain_dir=str(tmp_path), mix={"v100": 2}, method="sbatch")
    sp = spec.save(tmp_path / "jobs" / "1.json")
    chainlog.append(tmp_path, "submit", job_id="41", mix={"v100": 2}, spec=str(sp))
    all_drained = build_view([_node("gpuv1", "gpu:v100:2", "IDLE+DRAIN", "v100")], [_part("v100", "gpuv1")])
    monkeypatch.setattr(rp, "pending_info", lambda j, env=None: ("PENDING", ["ReqNodeNotAvail"]))
    cancelled = []
    monkeypatch.setattr(rp.proc, "run", lambda *a, **k: cancelled.append(a) or "")
    clock = [1000.0]
    w = rp.PendingWatch(tmp_path, submit_fn=lambda s: pytest.fail("nothing may be submitted"),
                        view_fn=lambda pt: all_drained, clock=lambda: clock[0], first_check_s=0.0)
    assert w.check("41") is None
    clock[0] += 5.0
    assert w.check("41") is None                    # within the 10 s backoff: not asked again
    clock[0] += 6.0
    assert w.check("41") is None
    waits = [e for e in chainlog.read(tmp_path) if e["event"] == "replan_wait"]
    assert [e["next_check_s"] for e in waits] == [10.0, 20.0] and waits[0]["excluded"] == ["v100"]
    assert "stays queued with its checkpoint" in waits[0]["message"] and cancelled == []


@pytest.mark.slurm
@pytest.mark.slurm_exclusive
def test_successor_pending_on_drained_partition_is_cancelled_and_replanned(slurm_cluster, slurm_tmp):
    """A chain on v100:2; once iteration k is on record both v100 nodes are drained and the job is told to stop
    (USR1 to its batch shell): it checkpoints and submits its successor onto v100:2, which pends. The watcher
    cancels it and re-plans onto rtx2060:2 (the most GPUs at the lowest billing rate without v100), which
    resumes from the checkpoint and finishes with the uninterrupted run's parameters."""
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.runtime.persist.checkpoint import load_latest
    from hpc_jabas.slurm.executor import submit, submit_job
    from hpc_jabas.slurm.watch import wait_chain
    chain = slurm_tmp / "chain"
    k = random.Random(os.getpid() + 3).randint(3, 20)
    spec = JobSpec(task="preempt_task:build", config=dict(CHAIN_CFG), chain_dir=str(chain), mix={"v100": 2},
                   method="sbatch", pythonpath=[str(ROOT), str(ROOT / "tests")], python=PY)
    jobs: list[str] = []
    try:
        first = submit(spec).job_id
        jobs.append(first)
        end = time.time() + 120
        while not any(r["it"] >= k for r in _iterations(chain)):
            assert time.time() < end, f"job {first} never reached iteration {k}: {chainlog.read(chain)}"
            time.sleep(0.2)
        slurm_cluster.run("scontrol", "update", "nodename=gpuv[1-2]", "state=drain", "reason=hj-test")
        slurm_cluster.run("scancel", "--batch", "--signal=USR1", first)
        watch = rp.PendingWatch(chain, submit_job, first_check_s=2.0)
        res = wait_chain(chain, first, timeout=240, poll_s=0.5, on_pending=watch.check)
        jobs += res["jobs"]
        ev = chainlog.read(chain)
        assert res["ok"], (res, json.dumps(ev))
        assert slurm_cluster.wait_state(res["job_id"]) == "COMPLETED"
        jobs = []
    finally:
        slurm_cluster.run("scontrol", "update", "nodename=gpuv[1-2]", "state=resume", check=False)
        slurm_cluster.cancel(*jobs)
    req = next(e for e in ev if e["event"] == "requeue")
    re_ = [e for e in ev if e["event"] == "replan"]
    assert len(re_) == 1 and re_[0]["from_job"] == req["to_job"] and re_[0]["excluded"] == ["v100"], ev
    assert re_[0]["mix"] == {"rtx2060": 2} and res["jobs"] == [first, req["to_job"], re_[0]["to_job"]]
    assert slurm_cluster.wait_state(req["to_job"]) == "CANCELLED"
    starts = [e for e in ev if e["event"] == "start"]
    assert starts[1]["job_id"] == re_[0]["to_job"] and starts[1]["mix"] == {"rtx2060": 2}
    restart = [e for e in ev if e["event"] == "restart"]
    assert len(restart) == 1 and restart[0]["after"] == "replan"
    # the queue wait runs from the first submission of the successor (the requeue), apart from the overhead
    assert restart[0]["queue_wait_s"] >= re_[0]["time"] - req["time"] - 1.0
    found = load_latest(Path(chain) / "run" / "checkpoints")
    check_exact({"events": ev, "state": found[0], "chain": chain}, k, "USR1")
    from hpc_jabas.cli.status import status
    st = status(chain)
    assert [[r["job_id"] for r in c["jobs"]] for c in st["chains"]] == [res["jobs"]]
    rows = st["jobs"]
    assert [r["state"] for r in rows] == ["stopped", "replanned", "finished"], rows
    assert [r["slurm"] for r in rows][1:] == ["CANCELLED", "COMPLETED"] and rows[1]["elapsed_s"] == 0.0
    assert rows[0]["cost"] > 0 and rows[2]["cost"] > 0
    assert st["total_cost"] == pytest.approx(sum(r["cost"] for r in rows))
