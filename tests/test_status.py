"""`hpc-jabas status`: independent jobs are separate chains, a job's wall time is Slurm's elapsed
(sacct) with the training time beside it, a running chain shows its progress, --json."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from hpc_jabas.cli.status import render, status
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.slurm.watch import split_chains

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")
HPC_JABAS = str(ROOT / ".venv" / "bin" / "hpc-jabas")


def test_split_chains_follows_moves_only():
    ev = [{"event": "submit", "job_id": "10"}, {"event": "start", "job_id": "10"},
          {"event": "start", "job_id": "11"},                       # by hand, same chain_dir: its own chain
          {"event": "move", "from_job": "10", "to_job": "12"}, {"event": "submit", "job_id": "12"},
          {"event": "end", "job_id": "10"}, {"event": "start", "job_id": "12"},
          {"event": "move", "from_job": "12", "to_job": "13"}, {"event": "start", "job_id": "13"}]
    assert split_chains(ev) == [["10", "12", "13"], ["11"]]


def test_running_chain_shows_epoch_and_eta(tmp_path):
    chainlog.append(tmp_path, "submit", job_id="7", mix={"v100": 2}, method="sbatch", by="user")
    chainlog.append(tmp_path, "start", job_id="7", mix={"v100": 2}, world=2, epoch=0, iteration=0)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "progress.json").write_text(json.dumps(
        {"time": time.time(), "job_id": "7", "epoch": 1, "epochs": 3, "iteration": 30, "B": 256,
         "samples_done": 1500, "samples_total": 4041, "samples_per_s": 500.0, "eta_s": 5.082}))
    st = status(tmp_path, use_sacct=False)
    assert len(st["chains"]) == 1 and st["chains"][0]["progress"]["iteration"] == 30
    text = render(st)
    line = next(ln for ln in text.splitlines() if ln.startswith("progress:"))
    assert line.startswith("progress: epoch 2 of 3, iteration 30, B=256, 37% of the samples, 500 samples/s, ETA 5 s")
    assert text.splitlines()[-1] == "current: running: job 7 from epoch 0"
    # another job's progress file is not this chain's progress
    (tmp_path / "run" / "progress.json").write_text(json.dumps({"time": time.time(), "job_id": "8", "epoch": 1}))
    assert status(tmp_path, use_sacct=False)["chains"][0]["progress"] is None


def test_finished_job_is_not_shown_running_while_sacct_lags(tmp_path):
    from hpc_jabas.cli.status import _chain
    chainlog.append(tmp_path, "submit", job_id="7", mix={"v100": 2}, method="sbatch", by="user")
    chainlog.append(tmp_path, "start", job_id="7", mix={"v100": 2}, world=2, epoch=0, iteration=0)
    chainlog.append(tmp_path, "end", job_id="7", epochs=2, wall_s=3.0, cost=0.01, state="finished")
    events = chainlog.read(tmp_path)
    lag = {"7": [{"State": "RUNNING", "ElapsedRaw": "4", "billing": 2.0, "cost": 0.002}]}
    ch = _chain(events, ["7"], tmp_path, lag, time.time())
    assert ch["jobs"][0]["state"] == "finished"
    assert ch["jobs"][0]["slurm"] == "finishing (Slurm still reports RUNNING)"
    assert ch["current"].startswith("finished (job 7")
    done = {"7": [{"State": "COMPLETED", "ElapsedRaw": "4", "billing": 2.0, "cost": 0.002}]}
    assert _chain(events, ["7"], tmp_path, done, time.time())["jobs"][0]["slurm"] == "COMPLETED"
    text = render({"chain_dir": str(tmp_path), "chains": [ch]})
    assert "RUNNING" not in text.replace("Slurm still reports RUNNING", ""), text


def _elapsed_s(text: str) -> int:
    days, _, hms = text.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


@pytest.mark.slurm
def test_two_independent_jobs_are_two_chains_with_sacct_elapsed(slurm_cluster, slurm_tmp):
    chain = slurm_tmp / "chain"
    job = slurm_tmp / "job.sh"
    # a job that records itself in the chain as the job entry does (start ... end), trains ~2 s, and
    # spends time outside the training (before and after) that only Slurm's elapsed time shows
    job.write_text(f"""#!/bin/bash
#SBATCH --partition=rtx2060 --ntasks=1 --mem=256M --time=5 --output={slurm_tmp}/%j.out
sleep 2
{PY} - <<'EOF'
import os, time
from hpc_jabas.slurm import chain
d, j = {str(chain)!r}, os.environ["SLURM_JOB_ID"]
chain.append(d, "start", job_id=j, mix={{"rtx2060": 1}}, world=1, epoch=0, iteration=0)
t0 = time.time()
time.sleep(2)
chain.append(d, "end", job_id=j, epochs=1, wall_s=time.time() - t0, cost=0.0, state="finished", iteration=5)
EOF
sleep 2
""")
    env = dict(slurm_cluster.env, PYTHONPATH=str(ROOT))
    ids = [subprocess.run(["sbatch", "--parsable", str(job)], env=env, capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip().split(";")[0] for _ in range(2)]
    try:
        for j in ids:
            assert slurm_cluster.wait_state(j, timeout=120) == "COMPLETED"
    finally:
        slurm_cluster.cancel(*ids)
    r = subprocess.run([HPC_JABAS, "status", str(chain), "--json"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert [[j["job_id"] for j in c["jobs"]] for c in st["chains"]] == [[ids[0]], [ids[1]]] or \
        [[j["job_id"] for j in c["jobs"]] for c in st["chains"]] == [[ids[1]], [ids[0]]]
    sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,Elapsed", "-j", ",".join(ids)], env=env,
                           capture_output=True, text=True, check=True, timeout=60).stdout
    elapsed = {ln.split("|")[0]: _elapsed_s(ln.split("|")[1]) for ln in sacct.split() if "|" in ln}
    for c in st["chains"]:
        (row,) = c["jobs"]
        assert abs(row["elapsed_s"] - elapsed[row["job_id"]]) <= 2, (row, elapsed)
        assert row["wall_s"] == row["elapsed_s"]
        assert 1.9 <= row["train_s"] < row["elapsed_s"], row        # the training is a part of the job
        assert row["slurm"] == "COMPLETED" and c["current"].startswith("finished")
    text = subprocess.run([HPC_JABAS, "status", str(chain)], env=env, capture_output=True, text=True,
                          timeout=60).stdout
    assert text.splitlines()[0].endswith("2 chains (jobs not linked by a move are separate chains; give each job "
                                         "its own chain_dir)"), text
    assert text.count("current: finished") == 2 and "elapsed_s" in text and "train_s" in text
    assert not [p for p in os.listdir(chain) if p.endswith(".out")]


def test_sacct_runs_of_a_requeued_hetjob_fold_per_run():
    from hpc_jabas.slurm.text import parse_sacct
    from hpc_jabas.slurm.watch import ATTEMPT_FIELDS, fold_attempts
    text = "\n".join([
        "70+0|REQUEUED|12|2026-11-30T10:00:00|2026-11-30T10:00:12|a100|gpua1|billing=4,cpu=1,gres/gpu=1",
        "70+1|REQUEUED|11|2026-11-30T10:00:00|2026-11-30T10:00:11|v100|gpuv1|billing=4,cpu=2,gres/gpu=2",
        "70+0|COMPLETED|30|2026-11-30T10:01:00|2026-11-30T10:01:30|a100|gpua1|billing=4,cpu=1,gres/gpu=1",
        "70+1|COMPLETED|30|2026-11-30T10:01:00|2026-11-30T10:01:30|v100|gpuv1|billing=4,cpu=2,gres/gpu=2",
        "71|FAILED|7|2026-11-30T10:02:00|2026-11-30T10:02:07|rtx2060|gpur1|cpu=1,mem=1G",
        "72|PENDING|0|Unknown|Unknown|v100||"])
    runs = fold_attempts(parse_sacct(text, ATTEMPT_FIELDS))
    assert [(a["attempt"], a["State"], a["ElapsedRaw"], a["billing"]) for a in runs["70"]] == [
        (1, "REQUEUED", 12, 8.0), (2, "COMPLETED", 30, 8.0)]
    assert runs["70"][0]["cost"] == 8.0 * 12 / 3600 and runs["70"][1]["Partition"] == "a100,v100"
    assert runs["71"][0]["billing"] is None and runs["71"][0]["cost"] is None
    assert runs["72"][0]["State"] == "PENDING" and runs["72"][0]["billing"] is None


@pytest.mark.slurm
def test_requeued_and_failed_runs_are_listed_with_cost_and_lost_iterations(slurm_cluster, slurm_tmp):
    """A real `scontrol requeue`: the job's first run (it recorded a failure losing 3 iterations) and its second
    run are both listed with Slurm's elapsed time, billing x time as cost and the lost iterations; the totals
    include the first run."""
    chain = slurm_tmp / "chain"
    job = slurm_tmp / "job.sh"
    job.write_text(f"""#!/bin/bash
#SBATCH --partition=rtx2060 --ntasks=1 --gres=gpu:rtx2060:1 --mem=256M --time=5 --requeue
#SBATCH --output=/dev/null
{PY} - <<'EOF'
import os, time
from hpc_jabas.slurm import chain
d, j, n = {str(chain)!r}, os.environ["SLURM_JOB_ID"], int(os.environ.get("SLURM_RESTART_COUNT") or 0)
chain.append(d, "start", job_id=j, mix={{"rtx2060": 1}}, world=1, epoch=0, iteration=0)
if n == 0:
    chain.append(d, "end", job_id=j, state="failed", iteration=4, lost_iterations=3)
    time.sleep(300)
time.sleep(2)
chain.append(d, "end", job_id=j, epochs=1, wall_s=2.0, cost=0.0, state="finished", iteration=10, lost_iterations=0)
EOF
""")
    env = dict(slurm_cluster.env, PYTHONPATH=str(ROOT))
    jid = subprocess.run(["sbatch", "--parsable", str(job)], env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout.strip().split(";")[0]
    try:
        slurm_cluster.wait_running(jid)
        end = time.time() + 30
        while len([e for e in chainlog.read(chain) if e["event"] == "end"]) < 1:
            assert time.time() < end, "the job never wrote its first end event"
            time.sleep(0.3)
        time.sleep(2)
        slurm_cluster.run("scontrol", "requeue", jid)
        assert slurm_cluster.wait_state(jid, states=("COMPLETED",), timeout=120) == "COMPLETED"
    finally:
        slurm_cluster.cancel(jid)
    sacct = slurm_cluster.run("sacct", "-D", "-X", "-n", "-P", "-o", "State,ElapsedRaw", "-j", jid).stdout.split()
    runs = [ln.split("|") for ln in sacct]
    assert [r[0] for r in runs] == ["REQUEUED", "COMPLETED"], runs
    st = status(chain)
    (row,) = st["jobs"]
    assert [(a["slurm"], a["elapsed_s"], a["lost_iterations"]) for a in row["attempts"]] == [
        ("REQUEUED", float(runs[0][1]), 3), ("COMPLETED", float(runs[1][1]), 0)]
    assert [a["cost"] for a in row["attempts"]] == [float(r[1]) / 3600 for r in runs]      # billing 1 per GPU
    assert row["elapsed_s"] == sum(float(r[1]) for r in runs) and row["lost_iterations"] == 3
    assert st["total_cost"] == pytest.approx(sum(float(r[1]) for r in runs) / 3600)
    assert st["attempts"] == 2 and st["total_lost_iterations"] == 3
    text = render(st)
    assert "  run 1/2" in text and "  run 2/2" in text and "2 run(s)" in text and "3 iteration(s) lost" in text, text
