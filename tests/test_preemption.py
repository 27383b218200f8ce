"""Safe points (a signal only sets a flag; all ranks agree at an iteration boundary and checkpoint),
periodic checkpoints inside an epoch, kill -9 during a checkpoint write, drained nodes not counted as free."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from mpi_util import PY, ROOT, WORKERS, mpi_env, run_ranks
from reference import reference_run
from test_equivalence import assert_params_close

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime import safepoint as sp
from hpc_jabas.runtime.persist import checkpoint as ckpt
from hpc_jabas.runtime.persist.dirlock import DirLock
from hpc_jabas.runtime.safepoint import Agreement, PeriodicCheckpoint, agree
from hpc_jabas.runtime.trainer import Trainer

BASE = {"optimizer": "adam", "lr": 0.01, "plan": "b=4 n=1,3,4", "steps": 24, "n": 256}   # B=32: 8 iterations/epoch


# ---- pure units ---------------------------------------------------------------------------------
def test_agreement_one_allreduce_any_rank_stops_all():
    sent = []

    def fake_allreduce(t, name):     # three ranks: rank 2 got TERM, rank 0's clock says a checkpoint is due
        sent.append((name, t.tolist()))
        return t + torch.tensor([0, 0, 1, 0, 0, 0, 0, 0], dtype=t.dtype)
    a = agree(0, False, True, rank=0, allreduce=fake_allreduce)
    assert a == Agreement(stop=True, signal="TERM", checkpoint_due=True)
    # [USR1, USR2, TERM, request, due, any non-finite, rank 0's proposed interval, this iteration's non-finite]
    assert sent == [("hj.safepoint", [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0])]
    b = agree(int(signal.SIGUSR1), False, True, rank=1, allreduce=lambda t, n: t)   # due counts rank 0's only
    assert b == Agreement(stop=True, signal="USR1", checkpoint_due=False)
    assert agree(0, True, False, 0, allreduce=lambda t, n: t).signal == "request"
    clock = [100.0]
    p = PeriodicCheckpoint(every=5, minutes=0.5, clock=lambda: clock[0])
    assert not p.due_by_iterations(4) and p.due_by_iterations(5) and not p.due_by_clock()
    clock[0] += 30.0
    assert p.due_by_clock()
    p.mark(5)
    assert not p.due_by_clock() and not p.due_by_iterations(9) and p.due_by_iterations(10)


class _Ranks:
    """Two ranks' safe points in one process: rank 0 is driven, ``other`` holds rank 1's flags per call."""

    def __init__(self):
        self.other = torch.zeros(8, dtype=torch.float64)     # one iteration's flags a boundary
        self.ops: list[str] = []

    def allreduce(self, t, name):
        self.ops.append("blocking")
        return t + self.other

    def start(self, t, name):
        self.ops.append("launch")
        return t + self.other          # the other rank's flags as they were when it launched

    def sync(self, h):
        self.ops.append("read")
        return h


class _Sampler:
    epoch = 0

    def __init__(self, per_epoch):
        self.per_epoch, self.it = per_epoch, [0]

    def epoch_done(self, B):
        return self.it[0] % self.per_epoch == 0


class _Trainer:
    """What a safe point reads of the trainer; ``Trainer._safe_point`` (the trainer's own boundary) runs on it."""

    def __init__(self, ranks, per_epoch=100):
        self.safe_points = sp.SafePoints(allreduce=ranks.allreduce, allreduce_async=ranks.start,
                                         synchronize=ranks.sync)
        self.sampler = _Sampler(per_epoch)
        self.plan = type("P", (), {"B": 4})()
        self.iteration, self.rank, self.world = 0, 0, 2
        self.stop_requested = self.nonfinite_loss = False
        self.stop_reason: dict | None = None
        self.saved: list[int] = []
        self.metrics = type("M", (), {"write": lambda self, r: None})()

    def step(self):
        self.iteration += 1
        self.sampler.it[0] = self.iteration

    def save_checkpoint(self):
        self.saved.append(self.iteration)
        return f"ckpt-{self.iteration}"


def safe_point(tr: _Trainer, periodic: PeriodicCheckpoint) -> bool:
    """The boundary exactly as fit() runs it: ``Trainer._safe_point`` with the trainer's periodic clock."""
    tr._periodic = periodic
    return Trainer._safe_point(tr)  # type: ignore[arg-type]


def test_the_agreement_travels_during_the_next_iteration_and_checkpoint_boundaries_agree_blocking():
    ranks = _Ranks()
    tr, periodic = _Trainer(ranks, per_epoch=6), PeriodicCheckpoint(every=None, minutes=None)
    for _ in range(2):
        tr.step()
        assert not safe_point(tr, periodic)
    assert ranks.ops == ["launch", "read", "launch"] and tr.safe_points.in_flight
    ranks.other[2] = 1.0                        # rank 1 got TERM after iteration 2: sent at boundary 3
    tr.step()
    assert not safe_point(tr, periodic)     # read at boundary 3: its flags are boundary 2's
    ranks.other[2] = 0.0
    tr.step()
    assert safe_point(tr, periodic)         # boundary 4: every rank stops here, after a blocking agreement
    assert ranks.ops[-2:] == ["read", "blocking"] and tr.saved == [4] and not tr.safe_points.in_flight
    assert tr.stop_reason["signal"] == "TERM" and tr.stop_reason["iteration"] == 4
    # a signal that reaches a boundary which ends an epoch stops there (the boundary agrees blocking anyway)
    ranks2 = _Ranks()
    tr2 = _Trainer(ranks2, per_epoch=3)
    for _ in range(2):
        tr2.step()
        assert not safe_point(tr2, periodic)
    ranks2.other[0] = 1.0
    tr2.step()
    assert safe_point(tr2, periodic) and tr2.saved == [3] and tr2.stop_reason["signal"] == "USR1"
    assert tr2.safe_points.blocking_count == 1


class _Paced(_Trainer):
    """One iteration takes 0.1 s of rank 0's (fake) clock; the other rank's stop flags ride in ``other``."""

    def __init__(self, interval_s):
        self.clock, self.other_flags = [0.0], torch.zeros(sp._HEAD, dtype=torch.float64)
        super().__init__(self, per_epoch=10**6)
        self.safe_points = sp.SafePoints(allreduce=self.allreduce, allreduce_async=self.start, synchronize=self.sync,
                                         interval_s=interval_s, clock=lambda: self.clock[0])
        self.ops, self.cfg = [], type("C", (), {"checkpoint": False})()
        self.ckpt_dir = Path("/nonexistent")

    def _other(self, t):                  # the other rank: its stop flags, no proposal, finite losses
        t = t.clone()
        t[:sp._HEAD] += self.other_flags
        return t

    def allreduce(self, t, name):
        self.ops.append(("blocking", self.iteration))
        return self._other(t)

    def start(self, t, name):
        self.ops.append(("launch", self.iteration))
        return self._other(t)

    def sync(self, h):
        self.ops.append(("read", self.iteration))
        return h

    def step(self):
        super().step()
        self.clock[0] += 0.1

    def flush_metrics(self):
        pass


def test_agreements_come_about_every_interval_at_rank_0s_pace_and_lose_no_flag():
    tr, periodic = _Paced(interval_s=1.0), PeriodicCheckpoint(every=None, minutes=None)
    for _ in range(13):
        tr.step()
        assert not safe_point(tr, periodic)
    # boundary 1: nothing measured yet (every 1); 2: rank 0 measured 0.1 s an iteration and proposes 10, agreed
    # (read) at boundary 3; from there every 10th boundary agrees
    assert tr.ops == [("launch", 1), ("read", 2), ("launch", 2), ("read", 3), ("launch", 3), ("read", 13),
                      ("launch", 13)]
    assert tr.safe_points.every == 10 and tr.safe_points.agreements == 4
    # the other rank gets TERM after iteration 14: sent at boundary 23, read at 33, where every rank stops
    tr.other_flags[2] = 1.0
    stopped = None
    for _ in range(30):
        tr.step()
        if safe_point(tr, periodic):
            stopped = tr.iteration
            break
    assert stopped == 33 and tr.ops[-2:] == [("read", 33), ("blocking", 33)] and tr.saved == [33]
    assert tr.stop_reason["signal"] == "TERM"
    # a non-finite loss on this rank at iteration 40 (counted from 0) alone, between agreement boundaries: sent with
    # the next agreement and named exactly when it is read
    tr2 = _Paced(interval_s=1.0)
    with pytest.raises(sp.NonFiniteError, match="the loss of iteration 40 is not a finite number on 1 of 2 rank"):
        for i in range(80):
            tr2.nonfinite_loss = i == 40
            tr2.step()
            safe_point(tr2, periodic)
    assert tr2.ops[-1] == ("read", 53)           # flags of 43-52 launched at boundary 43 ... read at 53
    # a loop that ends between agreement boundaries: fit's finish agrees the flags since the last one, blocking
    tr3 = _Paced(interval_s=1.0)
    for i in range(17):
        tr3.nonfinite_loss = i == 16
        tr3.step()
        if i < 16:
            safe_point(tr3, periodic)
    with pytest.raises(sp.NonFiniteError, match="the loss of iteration 16 is not"):
        sp.finish(tr3)
    assert tr3.ops[-2:] == [("read", 17), ("blocking", 17)]


def test_interval_zero_agrees_at_every_boundary_and_the_proposal_is_bounded():
    tr, periodic = _Paced(interval_s=0.0), PeriodicCheckpoint(every=None, minutes=None)
    for _ in range(5):
        tr.step()
        safe_point(tr, periodic)
    assert [op for op, _ in tr.ops] == ["launch"] + ["read", "launch"] * 4 and tr.safe_points.every == 1
    at = sp.SafePoints(interval_s=10.0, clock=lambda: 0.0)
    at._paced = (-1.0, 0)
    assert at._proposal(1) == 10                                  # 1 s an iteration: 10 to make 10 s
    fast = sp.SafePoints(interval_s=10.0, clock=lambda: 0.0)
    fast._paced = (-1e-3, 0)
    assert fast._proposal(1) == sp.MAX_EVERY                      # 1 ms an iteration: capped
    slow = sp.SafePoints(interval_s=0.5, clock=lambda: 100.0)
    slow._paced = (0.0, 0)
    assert slow._proposal(10) == 1                                # 10 s an iteration: every boundary


def test_blocking_and_off_modes():
    ranks = _Ranks()
    tr, periodic = _Trainer(ranks), PeriodicCheckpoint(every=None, minutes=None)
    tr.safe_points.mode = "blocking"
    ranks.other[3] = 1.0                        # rank 1 asks to stop
    tr.step()
    assert safe_point(tr, periodic) and tr.stop_reason["signal"] == "request" and ranks.ops == ["blocking"]
    tr.safe_points.mode = "off"
    tr.step()
    assert not safe_point(tr, periodic) and ranks.ops == ["blocking"]
    with pytest.raises(ValueError):
        sp.SafePoints("sometimes")


def test_second_writer_refused_naming_the_holder(tmp_path):
    code = ("import sys,time; from hpc_jabas.runtime.persist.dirlock import DirLock; "
            f"DirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as e:
            DirLock(tmp_path).acquire()
        msg = str(e.value)
        assert "\n" not in msg and f"pid {holder.pid}" in msg and "in use by" in msg, msg
        assert DirLock(tmp_path).locked_by_other()["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    with DirLock(tmp_path) as lk:                 # the kernel dropped the killed holder's lock
        assert lk.held and DirLock(tmp_path).acquire() is lk     # same process: the same lock
    assert DirLock(tmp_path).locked_by_other() is None


# ---- kill -9 during checkpoint writes ---------------------------------------------------------------
WRITER = """
import sys, torch
from hpc_jabas.runtime.persist import checkpoint as ckpt
d = sys.argv[1]
n = 4_000_000                        # 16 MB: a write takes a while
i = int(sys.argv[2])
print("ready", flush=True)
while True:
    i += 1
    ckpt.save_in(d, {"i": i, "x": torch.full((n,), float(i))}, epoch=0, iteration=i, keep=2)
"""


def test_kill9_during_checkpoint_write_leaves_previous_loadable(tmp_path):
    d = tmp_path / "ckpt"
    ckpt.save_in(d, {"i": 0, "x": torch.zeros(4_000_000)}, epoch=0, iteration=0)
    rng = random.Random(12)
    last = 0
    for _ in range(3):
        w = subprocess.Popen([PY, "-c", WRITER, str(d), str(last)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert w.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.2, 1.0))
        w.send_signal(signal.SIGKILL)
        w.wait()
        st, path = ckpt.load_latest(d, log=lambda m: None)
        assert path.name == ckpt.name_for(0, st["i"]) and st["i"] >= last
        assert bool((st["x"] == st["i"]).all()) and len(st["x"]) == 4_000_000
        last = st["i"]
    assert last > 0     # the writer got through some saves


# ---- safe points and periodic checkpoints on 3 ranks (mpirun) -----------------------------------------
def _run_expect_kill(spec: dict, np_: int = 3) -> None:
    """Like mpi_util.run_ranks, for a run that a SIGKILLed rank takes down (non-zero exit expected)."""
    with tempfile.TemporaryDirectory() as td:
        sp = Path(td) / "spec.json"
        sp.write_text(json.dumps(dict(spec, out_dir=td)))
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), PY,
               str(WORKERS / "preempt_worker.py"), str(sp)]
        p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=300, cwd=str(ROOT))
        assert p.returncode != 0 and not (Path(td) / "rank0.json").exists(), p.stderr[-3000:]


@pytest.mark.mpi
def test_signal_on_one_rank_stops_all_at_a_safe_point_and_resume_is_exact(tmp_path):
    """USR1 to rank 1 only, at a random iteration, at the default agreement interval: all ranks agree and
    checkpoint at the same iteration, at the latest at the next epoch end (a checkpoint boundary agrees blocking;
    these iterations take milliseconds, far below the interval's 0.5 s), or at that iteration when it ends an
    epoch; no work lost; the resumed run (2 ranks, another plan of the same B) equals the uninterrupted run."""
    k = random.Random(os.getpid()).randint(3, 15)
    spec = dict(BASE, run_dir=str(tmp_path / "run"), signal_at={"it": k, "rank": 1, "signal": "USR1"})
    first = run_ranks("preempt_worker.py", spec, np_=3)
    assert [r["stopped"]["signal"] for r in first] == ["USR1"] * 3
    stop_it = first[0]["iterations"]
    assert (k if k % 8 == 0 else k + 1) <= stop_it <= -(-k // 8) * 8, (k, stop_it)     # 8 iterations an epoch
    assert [r["iterations"] for r in first] == [stop_it] * 3
    assert ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")[-1].name.endswith(f"-{stop_it:09d}.pt")
    second = run_ranks("preempt_worker.py", dict(spec, plan="b=4 n=3,5", resume=True), np_=2)
    ref = reference_run(BASE)
    assert second[0]["resumed_from"].endswith(f"-{stop_it:09d}.pt")
    for r in second:
        assert r["iterations"] == BASE["steps"] and not r["stopped"]
        assert_params_close(r["params"], ref, rel=1e-6)


@pytest.mark.mpi
def test_periodic_checkpoint_resume_inside_epoch_is_exact(tmp_path):
    """checkpoint_every=3 (counted from the last checkpoint: 3, 6, the epoch end at 8, 11, 14...); rank 2 is
    SIGKILLed after iteration 13 (mid-epoch 1): the last checkpoint is iteration 11 (lost work 2 <= 3);
    resuming from it gives the uninterrupted run's parameters."""
    spec = dict(BASE, run_dir=str(tmp_path / "run"), checkpoint_every=3, keep_checkpoints=2,
                signal_at={"it": 13, "rank": 2, "signal": "KILL"})
    _run_expect_kill(spec)
    names = [p.name for p in ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")]
    assert names == [ckpt.name_for(1, 8), ckpt.name_for(1, 11)], names       # keep_checkpoints=2
    second = run_ranks("preempt_worker.py", dict(spec, resume=True), np_=3)
    ref = reference_run(BASE)
    assert second[0]["resumed_from"].endswith(ckpt.name_for(1, 11))
    for r in second:
        assert r["iterations"] == BASE["steps"]
        assert_params_close(r["params"], ref, rel=1e-6)


# ---- drained nodes are not free ------------------------------------------------------------------------
def test_held_gpus_on_drained_nodes_are_not_available():
    """The job holds both v100 GPUs of gpuv1 and gpuv2 (a hetjob a100:1 + v100:2); the auto-scaler may
    count them for the next mix only while their nodes can take a job. Drained (MIXED+DRAIN), down or
    draining: not counted; the a100 node's idle GPU stays free."""
    from test_cluster import _node, _part

    from hpc_jabas.slurm.cluster import available_gpus, build_view, job_nodes, parse_duration

    def view(v_state):
        nodes = [_node("gpua1", "gpu:a100:2", "MIXED", "a100", "cpu=1,gres/gpu=1"),
                 _node("gpuv1", "gpu:v100:2", v_state, "v100", "cpu=1,gres/gpu=1"),
                 _node("gpuv2", "gpu:v100:2", v_state, "v100", "cpu=1,gres/gpu=1")]
        return build_view(nodes, [_part("a100", "gpua1"), _part("v100", "gpuv[1-2]")])
    env = {"SLURM_JOB_NODELIST_HET_GROUP_0": "gpua1", "SLURM_JOB_NODELIST_HET_GROUP_1": "gpuv[1-2]"}
    assert job_nodes(env) == ["gpua1", "gpuv1", "gpuv2"]
    held = {"a100": 1, "v100": 2}
    assert available_gpus(view("MIXED"), held, job_nodes(env)) == {"a100": 2, "v100": 4}
    for bad in ("MIXED+DRAIN", "DOWN*", "MIXED+DRAIN+NOT_RESPONDING", "ALLOCATED+DRAIN"):
        v = view(bad)
        assert v.free == {"a100": 1, "v100": 0}, bad
        assert available_gpus(v, held, job_nodes(env)) == {"a100": 2, "v100": 0}, bad
        assert available_gpus(v, held) == {"a100": 2, "v100": 0}, bad        # without the job's node list
    assert [parse_duration(t) for t in ("1-02:03:04", "10:00", "45", "UNLIMITED", "")] == [93784.0, 600.0, 45.0,
                                                                                           None, None]


def test_failed_job_resubmitted_from_last_checkpoint_with_bounded_retries(tmp_path):
    """The batch shell after a failed srun (runtime/job/launch.py --after-failure): the successor resumes from the
    last good checkpoint, the iterations lost since it are recorded; not after a clean end, not on exit 2
    (the job said why), not beyond max_failures."""
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.runtime.job.launch import failure_backoff_s, resubmit_after_failure
    from hpc_jabas.slurm import chain as chainlog
    spec = JobSpec(task="preempt_task:build", config={"slurm": {"max_failures": 1}}, chain_dir=str(tmp_path),
                   mix={"rtx2060": 2}, method="sbatch")
    ckpt.save_in(tmp_path / "run" / "checkpoints", {"iteration": 8}, epoch=0, iteration=8)
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps({"type": "iteration", "it": i}) + "\n"
                                                            for i in range(11)))
    chainlog.append(tmp_path, "start", job_id="7")
    subs, naps = [], []

    def fake_submit(s):
        subs.append(s.mix)
        return str(8 + len(subs))
    kw = {"sleep": naps.append, "submit": fake_submit, "env": {"SLURM_CONF": "/nonexistent"}}   # no node states
    assert resubmit_after_failure(spec, "7", 2, **kw) is None and not subs             # exit 2: said why
    assert resubmit_after_failure(spec, "7", 137, **kw) == "9" and subs == [{"rtx2060": 2}]
    ev = chainlog.read(tmp_path)
    assert ev[-2]["event"] == "end" and ev[-2]["state"] == "failed" and ev[-2]["lost_iterations"] == 3
    assert ev[-1]["event"] == "requeue" and ev[-1]["reason"] == "failure" and ev[-1]["to_job"] == "9"
    assert naps == [failure_backoff_s(1)] and failure_backoff_s(3) == 20.0
    chainlog.append(tmp_path, "start", job_id="9")
    assert resubmit_after_failure(spec, "9", 1, **kw) is None and len(subs) == 1      # max_failures=1 reached
    chainlog.append(tmp_path, "start", job_id="10")
    chainlog.append(tmp_path, "end", job_id="10", state="moved")
    assert resubmit_after_failure(spec, "10", 1, **kw) is None and len(subs) == 1     # it ended on its own


# ---- preemption on the real local Slurm ------------------------------------------------------------
PLAN = "b=4 n=2,2"           # B=16 on two rtx2060 ranks: 15 iterations per epoch of the 240 samples
CHAIN_CFG = {"planner": "fixed", "plan": PLAN, "batch": 16, "epochs": 2, "emulate": True, "emulate_base_s": 0.08,
             "emulate_per_sample_s": 0.0, "metrics_period": 1, "checkpoint_every": 4, "seed": 0,
             "autoscale": {"enabled": False}, "slurm": {"time_min": 15}}


def _iterations(chain_dir) -> list[dict]:
    p = Path(chain_dir) / "run" / "metrics.jsonl"
    recs = [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []
    return [r for r in recs if r.get("type") == "iteration"]


def preempt_chain(cluster, chain_dir: Path, method: str, k: int, how: list[str], timeout: float = 240) -> dict:
    """Submit the preempt_task chain, signal its first job (``scancel *how JOB``) once iteration k is on
    record, follow the chain to its end; the chain's events and the final checkpoint's parameters."""
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.runtime.persist.checkpoint import load_latest
    from hpc_jabas.slurm.chain import read
    from hpc_jabas.slurm.executor import submit
    from hpc_jabas.slurm.watch import wait_chain
    spec = JobSpec(task="preempt_task:build", config=dict(CHAIN_CFG), chain_dir=str(chain_dir), mix={"rtx2060": 2},
                   method=method, pythonpath=[str(ROOT), str(ROOT / "tests")], python=PY)
    first = submit(spec).job_id
    end = time.time() + 120
    while not any(r["it"] >= k for r in _iterations(chain_dir)):
        assert time.time() < end, f"job {first} never reached iteration {k}: {read(chain_dir)}"
        time.sleep(0.2)
    cluster.run("scancel", *how, first)
    res = wait_chain(chain_dir, first, timeout=timeout, poll_s=0.5)
    ev = read(chain_dir)
    if not res["ok"]:
        cluster.cancel(*res["jobs"])
        logs = "\n".join(f"--- {q.name}\n{q.read_text()[-2000:]}" for q in sorted((chain_dir / "jobs").rglob("*"))
                         if q.is_file() and q.suffix in (".out", ".err"))
        pytest.fail(f"chain {res}: {json.dumps(ev)}\n{logs[-8000:]}")
    found = load_latest(Path(chain_dir) / "run" / "checkpoints")
    return {"res": res, "events": ev, "state": found[0], "first": first}


def check_exact(out: dict, k: int, signal_name: str) -> int:
    """Finished with the uninterrupted run's parameters (1e-6 relative); no iteration lost or repeated."""
    ev = out["events"]
    stops = [e for e in ev if e["event"] == "end" and e.get("state") == "stopped"]
    assert len(stops) == 1 and stops[0]["signal"] == signal_name and stops[0]["lost_iterations"] == 0, ev
    stop_it = stops[0]["iteration"]
    # k is drawn with room before the end: the stop comes a few iterations after k (the signal's way through
    # scancel and the batch shell, then the agreement travels during the next iteration, runtime/safepoint.py)
    assert k <= stop_it < 30, (k, stop_it)
    req = [e for e in ev if e["event"] == "requeue"]
    assert len(req) == 1 and req[0]["reason"] == "preempted" and req[0]["iteration"] == stop_it, ev
    starts = [e for e in ev if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["resumed"] and starts[1]["iteration"] == stop_it, starts
    assert [e["state"] for e in ev if e["event"] == "end"] == ["stopped", "finished"]
    its = sorted(r["it"] for r in _iterations(out["chain"]))
    assert its == list(range(30)), its        # every iteration once: nothing lost, nothing repeated
    assert out["state"]["iteration"] == 30
    ref = reference_run({"optimizer": "adam", "lr": 0.01, "plan": PLAN, "steps": 30, "n": 240})
    for name, want in ref.items():
        got = out["state"]["model"][name]
        err = float((got - want).abs().max() / (want.abs().max() + 1e-12))
        assert err <= 1e-6, f"{name}: relative difference {err:.2e} to the uninterrupted run"
    return stop_it


@pytest.mark.slurm
def test_submitit_job_preempted_by_usr2_requeues_and_finishes_exactly(slurm_cluster, slurm_tmp):
    """USR2 (submitit's signal) to every rank at a random iteration: all ranks checkpoint at the next safe
    point, submitit requeues the same job (scontrol requeue), it resumes and finishes with the parameters
    of the uninterrupted run."""
    k = random.Random(os.getpid() + 2).randint(3, 16)
    out = preempt_chain(slurm_cluster, slurm_tmp / "chain", "submitit", k, ["--signal=USR2"])
    out["chain"] = slurm_tmp / "chain"
    check_exact(out, k, "USR2")
    assert out["res"]["jobs"] == [out["first"]]                     # requeued in place: the same job id
    req = next(e for e in out["events"] if e["event"] == "requeue")
    assert req["method"] == "submitit" and str(req["to_job"]) == out["first"]


@pytest.mark.slurm
def test_sbatch_job_usr1_to_batch_shell_resubmits_and_finishes_exactly(slurm_cluster, slurm_tmp):
    """USR1 to the batch shell only (what --signal=B:USR1@lead sends): the job script's trap passes it to
    the ranks, they checkpoint at the next safe point, rank 0 submits the successor, which finishes with
    the parameters of the uninterrupted run."""
    k = random.Random(os.getpid() + 1).randint(3, 16)
    out = preempt_chain(slurm_cluster, slurm_tmp / "chain", "sbatch", k, ["--batch", "--signal=USR1"])
    out["chain"] = slurm_tmp / "chain"
    check_exact(out, k, "USR1")
    assert len(out["res"]["jobs"]) == 2 and out["res"]["jobs"][0] == out["first"]
    restart = [e for e in out["events"] if e["event"] == "restart"]
    assert len(restart) == 1 and restart[0]["after"] == "requeue" and restart[0]["queue_wait_s"] >= 0


@pytest.mark.slurm
@pytest.mark.timeout(420)
@pytest.mark.slurm_exclusive
def test_real_preemption_with_loader_workers_requeues_and_finishes_exactly(slurm_cluster, slurm_tmp):
    """Slurm's own preemption (here under submitit: the same job requeued; bench/faults.py runs it for both
    launchers, with and without loader workers; the sbatch launcher's stop and successor are held by
    test_sbatch_job_usr1_to_batch_shell_resubmits_and_finishes_exactly): the chain (DataLoader with 2
    workers) runs on the rtx2060 node; a job of
    the higher-tier hidden partition "urgent" (slurm/local/up.sh: PreemptType=preempt/partition_prio,
    PreemptMode=REQUEUE, GraceTime=30) asks for all 4 GPUs of that node. Slurm sends TERM to every process of
    the job, workers included; the ranks stop at their next safe point, checkpoint, and the chain resumes after
    the urgent job and finishes with the uninterrupted run's parameters: no iteration lost or repeated, and
    the preemption is not counted as a failure. It runs on the torch backend (runtime/comm/torch_backend.py)."""
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.runtime.persist.checkpoint import load_latest
    from hpc_jabas.slurm.chain import read
    from hpc_jabas.slurm.executor import submit
    from hpc_jabas.slurm.watch import wait_chain
    chain = slurm_tmp / "chain"
    k = random.Random(os.getpid() + 7).randint(3, 14)
    # on the torch backend (Gloo, under srun): the other preemption tests here run on Horovod
    spec = JobSpec(task="preempt_task:build_loader", config=dict(CHAIN_CFG, backend="torch"), chain_dir=str(chain),
                   mix={"rtx2060": 2}, method="submitit", pythonpath=[str(ROOT), str(ROOT / "tests")], python=PY)
    first = submit(spec).job_id
    urgent = None
    try:
        end = time.time() + 150
        while not any(r["it"] >= k for r in _iterations(chain)):
            assert time.time() < end, f"job {first} never reached iteration {k}: {read(chain)}"
            time.sleep(0.2)
        urgent = slurm_cluster.sbatch("-p", "urgent", "-N", "1", "-n", "1", "--gres=gpu:rtx2060:4", "-t", "2",
                                      "-o", str(slurm_tmp / "urgent.out"), "--wrap", "sleep 4")
        res = wait_chain(chain, first, timeout=300, poll_s=0.5)
        ev = read(chain)
        if not res["ok"]:
            logs = "\n".join(f"--- {q.name}\n{q.read_text()[-2000:]}" for q in sorted((chain / "jobs").rglob("*"))
                             if q.is_file() and q.suffix in (".out", ".err"))
            pytest.fail(f"chain {res}: {json.dumps(ev)}\n{logs[-8000:]}")
    finally:
        slurm_cluster.cancel(*[j for j in (first, urgent) if j])
    assert slurm_cluster.wait_state(urgent) == "COMPLETED"
    stops = [e for e in ev if e["event"] == "end" and e.get("state") == "stopped"]
    assert len(stops) == 1 and stops[0]["signal"] == "TERM" and stops[0]["lost_iterations"] == 0, ev
    stop_it = stops[0]["iteration"]
    assert k <= stop_it < 30, (k, stop_it)
    assert not [e for e in ev if e["event"] == "requeue" and e.get("reason") == "failure"], ev   # not a failure
    assert not [e for e in ev if e["event"] == "end" and e.get("state") == "failed"], ev
    starts = [e for e in ev if e["event"] == "start"]
    assert len(starts) == 2 and starts[1]["resumed"] and starts[1]["iteration"] == stop_it, starts
    assert [(e["backend"], e["launcher"]) for e in starts] == [("torch", "srun")] * 2, starts
    its = sorted(r["it"] for r in _iterations(chain))
    assert its == list(range(30)), its             # every iteration once: nothing lost, nothing repeated
    state = load_latest(Path(chain) / "run" / "checkpoints")[0]
    assert state["iteration"] == 30
    ref = reference_run({"optimizer": "adam", "lr": 0.01, "plan": PLAN, "steps": 30, "n": 240})
    for name, want in ref.items():
        err = float((state["model"][name] - want).abs().max() / (want.abs().max() + 1e-12))
        assert err <= 1e-6, f"{name}: relative difference {err:.2e} to the uninterrupted run"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
