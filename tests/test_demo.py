"""`make demo` end to end: scripts/demo.sh (what `make demo` runs after set-up) on a fresh run dir.

It checks what the demo says it shows, on what it left behind, not on its wording:
- part 1 (mpirun, 3 emulated ranks): B grows from its start; after the injected 3x slowdown of
  rank 0 at iteration 60 the controller rebalances (a balance record that changed the plan, with
  rank 0's measured speed factor below the others'); the report PNG is written and non-empty;
- part 2 (the local Slurm cluster): the job is submitted, moved at an epoch end onto another mix,
  the successor resumes from the checkpoint and the chain finishes all its epochs: the chain's events in
  order, each job on its mix, submitit's own job objects, and the final parameters equal to one process
  replaying the recorded batches (tests/chain_checks.py). This is the suite's submitit chain with a move
  (the sbatch one, by hand: tests/test_slurm_lifecycle.py). The simulator then replays the chain decision for
  decision (the same move, the same B at every iteration): issue 24's chain validation in test size.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from chain_checks import check_moves, check_parameters, events

from bench import sim_validation as sv

ROOT = Path(__file__).resolve().parents[1]


def _records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_make_demo_runs_and_shows_what_it_promises(slurm_cluster, slurm_tmp):
    run = slurm_tmp / "demo"
    env = {**os.environ, "HPC_JABAS_DEMO_DIR": str(run)}
    git_before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    t0 = time.time()
    r = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=560, stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    print(f"\nmake demo (scripts/demo.sh): {time.time() - t0:.0f} s")
    assert r.returncode == 0, out[-6000:]
    assert "Traceback" not in out, out[-6000:]

    # part 1: adaptive B, the rebalancing after the slowdown, the report
    recs = _records(run / "metrics.jsonl")
    its = [x for x in recs if x["type"] == "iteration"]
    assert its, "no iteration records"
    assert max(x["B"] for x in its) > its[0]["B"], [x["B"] for x in its[::10]]
    def share0(plan: str) -> float:              # rank 0's share of B in a plan "b=17,11,4 n=1,1,1"
        b, n = ([int(v) for v in part.split("=")[1].split(",")] for part in plan.split())
        return b[0] * n[0] / sum(x * y for x, y in zip(b, n))
    bal = [x for x in recs if x["type"] == "balance"]
    before = [share0(x["plan"]) for x in bal if x["it"] < 60]
    after = [x for x in bal if x["it"] >= 80]
    assert before and after, [x["it"] for x in bal]
    # the slowdown is measured (rank 0 at about 1/3 of its speed) and rank 0 loses most of its share
    assert all(x["measured"][0] is not None and x["measured"][0] < 0.5 for x in after), [x["measured"] for x in after]
    med = sorted(share0(x["plan"]) for x in after)[len(after) // 2]
    assert med < 0.6 * sorted(before)[len(before) // 2], (before, [x["plan"] for x in after])
    # the run itself (this was tests/test_foundation.py's own 8-epoch run): it learns, every rank reports its
    # work, one iteration record each with every rank's compute, and until the rebalancer's first record (the
    # plans from the profile) the emulated V100 (rank 0) gets a larger share of B than the RTX 2060 (rank 2)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test_acc"] >= 0.90 and len(its) == summary["iterations"], summary
    assert all(len(x["compute_s"]) == 3 for x in its)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("rank ") and "samples_per_s=" in ln]
    assert len(lines) == 3 and all(int(ln.split("samples=")[1].split()[0]) > 0 for ln in lines), lines
    def share(plan: str, k: int) -> float:
        b, n = ([int(v) for v in part.split("=")[1].split(",")] for part in plan.split())
        return b[k] * n[k] / sum(x * y for x, y in zip(b, n))
    first_balance = min([x["it"] for x in recs if x["type"] == "balance"] + [60])
    early = [x["plan"] for x in its if x["it"] < first_balance]
    assert early and all(share(p, 0) > share(p, 2) for p in early), early[:5]
    png = run / "report.png"
    assert png.is_file() and png.stat().st_size > 10_000, png
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # part 2: submitted, moved at an epoch end (where the auto-scaler chose), resumed, finished: the chain's
    # events in order, each job on its mix, and the final parameters those of one process fed the same batches
    d = run / "slurm" / "chain"
    jobs = check_moves(d, {"a100": 1, "v100": 2}, by_hand=False, epochs=4)
    starts = [e for e in events(d) if e["event"] == "start"]
    check_parameters(d, {s["world"] for s in starts}, b_changed=False)
    srecs = _records(d / "run" / "metrics.jsonl")
    epochs = sorted({x["epoch"] for x in srecs if x["type"] == "epoch_end"})
    assert epochs == [0, 1, 2, 3], epochs
    assert (d / "run" / "report.png").is_file()
    # submitit's own objects, rebuilt from the chain directory: each job's result (global rank 0's summary, the
    # other ranks' None), its log and its final state; the successors' submissions carry no hetjob of the first
    from hpc_jabas.slurm.executor import submitit_job
    for k, (j, s) in enumerate(zip(jobs, starts)):
        job = submitit_job(d, j)
        assert slurm_cluster.wait_state(j, timeout=90) == "COMPLETED"    # the ranks exit after the result
        res = job.results()
        assert res[0]["job_id"] == j and res[0]["mix"] == s["mix"] and res[1:] == [None] * (s["world"] - 1), res
        moved = res[0]["moved_to"]
        if k == len(jobs) - 1:
            assert moved is None and res[0]["epoch"] == 4, res
        else:
            assert moved["job_id"] == jobs[k + 1] and moved["mix"] == starts[k + 1]["mix"], res
        assert "Job completed successfully" in job.stdout()
        job.get_info(mode="force")
        assert job.state == "COMPLETED" and job.done()
        if k:
            text = (d / "jobs" / "submitit" / f"{j}_submission.sh").read_text()
            assert ("hetjob" in text) == (len(s["mix"]) > 1), text
    # the simulator replays the chain (bench/sim_validation.py: simulate_chain; its times are compared by
    # bench/sim_validation_chain.py, not here): the cluster as the first epoch end saw it, the job's perf model
    # and its own gradient statistics give the same move at the same epoch and the same B at every iteration
    real = sv.chain_real(d)
    sim = sv.simulate_chain(d, real, sv.chain_overheads(real, 4), real["restarts_s"][0], slurm_tmp / "sim")
    assert sv.sim_moves(sim) == real["moves"] and len(real["moves"]) == 1, (sim.decisions, real["moves"])
    assert sim.totals["iterations"] == len(real["its"]) and sim.totals["samples"] == real["samples"]
    assert sv.b_error(real["B"], sim.trajectory) == 0.0, (sim.trajectory, real["B"][::5])
    assert sim.totals["restarts"] == 1 and len(real["restarts_s"]) == 1
    acct = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,Partition,State", "-j", jobs[0]).stdout
    assert f"{jobs[0]}+0|a100|COMPLETED" in acct and f"{jobs[0]}+1|v100|COMPLETED" in acct, acct
    git_after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert git_after == git_before, f"the demo wrote outside its run dir:\n{git_after}"
