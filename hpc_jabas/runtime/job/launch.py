"""The job entry point inside Slurm (or mpirun): build the user's task, resume, train, auto-scale.

    python -m hpc_jabas.runtime.job.launch SPEC.json        # a JobSpec written by hpc_jabas.slurm.executor
    python -m hpc_jabas.runtime.job.launch JOB.toml         # by hand: [job] task/chain_dir/method + config keys
    python -m hpc_jabas.runtime.job.launch --after-failure RC SPEC.json|JOB.toml   # the batch shell, srun failed

Every rank runs this. The current mix is read from the ranks' Slurm partitions (allgather).
Returns (rank 0) a summary dict; submitit hands it back through its usual job objects.

Stop signals (USR1 from ``--signal=B:USR1@<lead>``, USR2 from submitit, TERM) are flags from the first
line on (runtime/safepoint.py); at the next safe point every rank checkpoints and the job is requeued:
a submitit job through submitit (``EntryPoint.checkpoint``, ``scontrol requeue``), any other Slurm job by
submitting its successor onto the same mix (chain event ``requeue``). A stop within ``signal_lead_s`` (+60 s:
Slurm may signal early) of the time limit is a time-out; after ``max_timeouts`` of them the chain stops
(preemptions are not counted).

The package's own modules that import torch, Horovod or submitit are imported inside the functions that need
them: this module runs first on a node, and the job's code is trust-checked and its ``pythonpath`` put in
front (``_trust_and_path``), and the stop signals turned into flags, before any of them is imported; the batch
shell's ``--after-failure`` path needs none of them.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from hpc_jabas.core.config.jobspec import JobSpec, check_job_table
from hpc_jabas.core.config.loader import load_callable
from hpc_jabas.errors import ConfigError, JabasError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.comm import launchers
from hpc_jabas.runtime.hooks import Callback
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.slurm.env import SlurmEnv
from hpc_jabas.trust import check_file

log = get_logger(__name__)
#: a chain's next job waits this long for the job before it to release the run directory
PREDECESSOR_WAIT_S = 120.0
#: a stop signal this close to the time limit (beyond signal_lead_s) is a time-out: Slurm may signal early
TIMEOUT_SLACK_S = 60.0


def spec_from_file(path: str) -> JobSpec:
    p = Path(path)
    if p.suffix == ".json":        # written by submit into <chain_dir>/jobs/: it names the code that runs
        check_file(p, "job spec")
        return JobSpec.load(p)
    from hpc_jabas.core.config.sections import read_toml
    d = read_toml(p, "job file")        # it names the code that runs too: trust-checked before it is read
    job = d.pop("job", None)
    if job is not None:
        check_job_table(job, path)         # unknown keys, a value of the wrong type: one line (as submit says it)
    if not job or "task" not in job or "chain_dir" not in job:
        raise ConfigError(f"job file {path!r} needs a [job] table with task = 'module:callable' and chain_dir")
    where = "top level" if "run_dir" in d else next((f"[{k}]" for k, v in d.items() if isinstance(v, dict)
                                                      and k not in ("autoscale", "slowdown") and "run_dir" in v), None)
    if where is not None:      # a chain's run directory is <chain_dir>/run: a run_dir here would be ignored
        raise ConfigError(f"job file {path!r}: run_dir ({where}) cannot be set in a job file: the run directory "
                          f"is <chain_dir>/run; remove run_dir, or give the job its own chain_dir")
    return JobSpec(task=job["task"], config=d, chain_dir=str(Path(job["chain_dir"]).resolve()),
                   mix=job.get("mix") or {"unknown": 1}, method=job.get("method", "sbatch"),
                   pythonpath=[pp] if isinstance(pp := job.get("pythonpath", []), str) else list(pp),
                   python=job.get("python"))


def check_code(spec: JobSpec, search: list[str] | None = None) -> None:
    """The code a job spec names, trust-checked before any of it is imported (hpc_jabas/trust.py; one line,
    UntrustedFileError, exit 2): every ``pythonpath`` directory (``check_dir``: whoever can write one could plant
    a module there that any import of the job picks up), the file the ``task``'s module resolves to and the
    ``__init__.py`` of each package on its way (``check_file``, which walks the directories above them), and the
    ``python`` interpreter the job scripts name. The module is located without running any of it (importlib's
    ``PathFinder``, package by package), on ``search`` (default: the spec's pythonpath, then ``sys.path`` and the
    current directory, as the job imports it). A module that is not found is left to the loader to report.
    ``hpc-jabas submit`` calls this on the login node, the launcher (``run_job``) again on the compute node."""
    import importlib.machinery
    import shutil

    from hpc_jabas.trust import check_dir
    for p in spec.pythonpath:
        check_dir(p, "pythonpath directory")
    if spec.python:
        exe = spec.python if os.sep in spec.python else shutil.which(spec.python)
        if exe:
            check_file(exe, "python interpreter")
    mod = spec.task.partition(":")[0] if isinstance(spec.task, str) else ""
    if not mod or any(not part.isidentifier() for part in mod.split(".")):
        return                                 # the loader says what a valid task is
    path = [str(p) for p in (search if search is not None else [*spec.pythonpath, *sys.path, os.getcwd()])]
    path = [p or os.getcwd() for p in path]
    locations: list[str] | None = path
    name = ""
    for part in mod.split("."):
        name = f"{name}.{part}" if name else part
        try:
            found = importlib.machinery.PathFinder.find_spec(name, locations)
        except (ImportError, ValueError, OSError):
            return
        if found is None:
            return
        if found.origin and found.has_location:
            check_file(found.origin, f"task module {mod!r} of task {spec.task!r}, file")
        locations = list(found.submodule_search_locations or [])
        if not locations:
            return


def current_mix(comm) -> dict[str, int]:
    from hpc_jabas.slurm.cluster import rank_partition
    part = rank_partition(os.environ) or "local"
    return dict(sorted(Counter(comm.allgather_object(part, name="hj.mix")).items()))


def run_job(spec: JobSpec | dict) -> dict | None:
    """The job on this rank (srun's ``python -m hpc_jabas.runtime.job.launch`` and submitit's entry point alike).
    An exception other than a JabasError (which says why in one line) is recorded in the chain first
    (``record_error``): the failure path reads it."""
    if isinstance(spec, dict):
        spec = JobSpec.from_dict(spec)
    try:
        return _run_job(spec)
    except JabasError:
        raise
    except Exception as e:                     # the user's code (or ours) failed: the traceback follows
        record_error(spec, e)
        raise


def _trust_and_path(spec: JobSpec) -> None:
    """On the node, before anything of the job is imported: the job's group trust, its code checked again
    (``check_code``), its ``pythonpath`` put in front."""
    from hpc_jabas.core.config.sections import flatten
    from hpc_jabas.trust import set_trust_group
    if flatten(spec.config or {})[0].get("trust_group") is True:   # the spec was checked before it was read
        set_trust_group(True)
    check_code(spec)
    for p in spec.pythonpath:
        if p not in sys.path:
            sys.path.insert(0, p)


def _run_job(spec: JobSpec) -> dict | None:
    _trust_and_path(spec)
    from hpc_jabas.core.config.sections import JobConfig, flatten
    from hpc_jabas.runtime.comm import seam as comm
    from hpc_jabas.runtime.job.lifecycle import EpochEndAutoscaler
    from hpc_jabas.runtime.job.task import Task, call_task
    from hpc_jabas.runtime.safepoint import stop_signals
    from hpc_jabas.runtime.trainer import Trainer
    stop_signals().install()                       # from here on a stop signal is a flag (safe points)
    launchers.set_in_chain()                       # a rank gone or hung: the chain resubmits (the error line)
    # before Horovod's background thread starts polling; a Task or the older dict, checked (one line, exit 2)
    task = Task.from_parts(call_task(load_callable(spec.task, "task"), spec.config, spec.run_dir), spec.task)
    comm.use(flatten(spec.config)[0].get("backend"))     # the job's backend key (top level or [train])
    comm.init()
    rank = comm.rank()
    mix = current_mix(comm)
    if "local" not in mix:
        spec = spec.with_mix(mix)
    job_id = SlurmEnv().local_job_id()
    cfgd = dict(spec.config)
    cfgd["run_dir"] = spec.run_dir
    cfgd.pop("job", None)
    cfg = JobConfig.from_dict(cfgd)
    submit_fn = None
    if "local" not in mix:
        from hpc_jabas.slurm.executor import submit_job
        submit_fn = submit_job
    hook = EpochEndAutoscaler(spec, submit_fn=submit_fn, job_id=job_id)
    t0 = time.time()
    restart = RestartOverheadCallback(spec.chain_dir, job_id, hook, trainer_start=t0)
    kw = task.trainer_kwargs()
    kw["callbacks"] = [restart, *kw["callbacks"]]
    tr = Trainer(task.model, task.optimizer, task.dataset, task.loss_fn, config=cfg, epoch_end_hook=hook, **kw)
    from hpc_jabas.runtime.persist.dirlock import lock_on_rank0
    wait_s = _predecessor_wait(spec.chain_dir, job_id) if rank == 0 else 0.0
    lock_on_rank0(spec.chain_dir, rank, "chain directory", wait_s=wait_s)    # one job of a chain at a time
    tr.lock_run_dir(wait_s=wait_s)
    resumed = restart.resumed = tr.maybe_resume()
    if rank == 0:
        chainlog.append(spec.chain_dir, "start", job_id=job_id, mix=mix, world=tr.world, epoch=tr.sampler.epoch,
                        iteration=tr.iteration, resumed=resumed, gpu_types=tr.gpu_types,
                        backend=comm.backend(), launcher=comm.controller())
        from hpc_jabas.runtime.job.lifecycle import stop_cause
        if stop_cause(spec, job_id, under_slurm=False) is not None:    # cancelled before this job started:
            tr.stop_requested = True                                  # stop (checkpointed) at the first safe point
    res = tr.fit(resume=False)
    wall = time.time() - t0
    rates = {}
    try:
        from hpc_jabas.slurm.cluster import read_cluster
        if "local" not in mix:
            rates = read_cluster(hook.cfg.partition_types).billing
    except JabasError:
        rates = {}
    cost = sum(n * rates.get(p, 0.0) for p, n in mix.items()) * wall / 3600.0
    moved = tr.moved_to.to_dict() if tr.moved_to is not None else None
    stopped = res.get("stopped")
    requeue: dict | None = None
    if rank == 0:
        from hpc_jabas.runtime.job.lifecycle import stop_cause
        # a user's cancel (hpc-jabas cancel, a plain scancel) ends the chain; Slurm's preemption or time limit requeues
        cancel = stop_cause(spec, job_id, under_slurm=submit_fn is not None) if stopped else None
        state = "moved" if moved else "cancelled" if cancel else "stopped" if stopped else "finished"
        chainlog.append(spec.chain_dir, "end", job_id=job_id, epochs=tr.sampler.epoch, wall_s=wall, cost=cost,
                        state=state, iteration=tr.iteration, signal=(stopped or {}).get("signal"), lost_iterations=0,
                        **({"cancelled_by": cancel["by"], "checkpoint": (stopped or {}).get("checkpoint")}
                           if cancel else {}))
        if cancel:
            log.info("job %s cancelled (%s): stopped after iteration %s with checkpoint %s; the chain ends here "
                     "(no successor)", job_id, cancel["by"], tr.iteration, (stopped or {}).get("checkpoint"))
            requeue = {"requeued": False, "reason": "cancelled", "by": cancel["by"]}
        elif stopped:
            requeue = requeue_after_stop(spec, job_id, mix, stopped, submit_fn)
    summary = {"job_id": job_id, "mix": mix, "epoch": tr.sampler.epoch, "iteration": tr.iteration,
               "moved_to": moved, "requeue": requeue, "params_sha": _params_digest(tr.model), "B": tr.B, **res}
    return summary if rank == 0 else None


def _predecessor_wait(chain_dir: str, job_id: str) -> float:
    """How long this job may wait for the run directory: the chain named it as a successor (a move or a
    requeue), whose predecessor may still be writing its last lines; else not at all."""
    named = any(e.get("event") in ("move", "requeue", "replan") and str(e.get("to_job")) == str(job_id)
                for e in chainlog.read(chain_dir))
    return PREDECESSOR_WAIT_S if named else 0.0


def requeue_after_stop(spec: JobSpec, job_id: str, mix: dict[str, int], stopped: dict,
                       submit_fn=None) -> dict:
    """Rank 0, once every rank has checkpointed at a safe point on a stop signal: requeue the job.

    A time-out (the signal came within ``signal_lead_s`` + 60 s of the time limit) counts against
    ``max_timeouts`` (the chain's ``requeue`` events with reason ``timeout``); a preemption does not. Under
    submitit the requeue is submitit's own (its USR2 handler, called here and not in a signal handler: its
    time-out count, ``EntryPoint.checkpoint``, ``scontrol requeue``; it exits the process). Other Slurm jobs
    submit their successor onto the same mix. Outside Slurm: the run stops, to be resumed by hand."""
    from hpc_jabas.slurm.cluster import job_clock
    from hpc_jabas.slurm.components import slurm_option
    under_slurm = submit_fn is not None
    left = job_clock(job_id)["time_left_s"] if under_slurm else None
    lead, max_timeouts = slurm_option(spec, "signal_lead_s"), slurm_option(spec, "max_timeouts")
    timed_out = left is not None and left <= lead + TIMEOUT_SLACK_S
    reason = "timeout" if timed_out else "preempted"
    base = {"from_job": job_id, "reason": reason, "signal": stopped.get("signal"), "epoch": stopped.get("epoch"),
            "iteration": stopped.get("iteration"), "checkpoint_time": stopped.get("time"), "time_left_s": left,
            "lost_iterations": 0}
    if not under_slurm:
        log.info("stopped at a safe point (%s) after iteration %s; run the same command again to resume",
                 stopped.get("signal"), stopped.get("iteration"))
        return {"requeued": False, "reason": "not under Slurm"}
    timeouts = sum(1 for e in chainlog.read(spec.chain_dir)
                   if e.get("event") == "requeue" and e.get("reason") == "timeout")
    if timed_out and timeouts >= max_timeouts:
        msg = (f"job {job_id} reached its time limit again ({timeouts + 1} time-outs, "
               f"max_timeouts={max_timeouts}): not requeued; its checkpoint is kept: raise time_min or "
               "max_timeouts and submit again")
        chainlog.append(spec.chain_dir, "requeue_refused", job_id=job_id, **{k: v for k, v in base.items()
                                                                             if k != "from_job"}, message=msg)
        log.error("%s", msg)
        return {"requeued": False, "reason": reason, "message": msg}
    if os.environ.get("SUBMITIT_FOLDER") and _submitit_requeue_handler() is not None:
        chainlog.append(spec.chain_dir, "requeue", to_job=job_id, method="submitit", **base)
        log.info("requeueing job %s through submitit (%s)", job_id, reason)
        _submitit_requeue_handler()(signal.SIGUSR2, None)     # requeues, then exits the process
        return {"requeued": True, "to_job": job_id}           # (not reached)
    new_id = submit_fn(spec.with_mix(mix))
    chainlog.append(spec.chain_dir, "requeue", to_job=new_id, method=spec.method, **base)
    log.info("job %s %s: its successor %s resumes from the checkpoint", job_id, reason, new_id)
    return {"requeued": True, "to_job": str(new_id), "reason": reason}


def record_error(spec: JobSpec, exc: BaseException) -> None:
    """This rank's exception that ends the job, as a chain event ``error`` with its signature (type, message,
    innermost frame): the failure path (``resubmit_after_failure``) does not resubmit the same error twice.
    Never masks the exception itself."""
    senv = SlurmEnv()
    job_id = senv.local_job_id()
    try:
        rank = launchers.detect().rank
        chainlog.append(spec.chain_dir, "error", job_id=job_id, rank=rank,
                        signature=chainlog.failure_signature(exc))
    except (OSError, ValueError, JabasError) as e:
        log.warning("the error could not be recorded in the chain (%s)", e)


def failure_backoff_s(attempt: int) -> float:
    """Seconds to wait before the ``attempt``-th resubmission of a failed job (1, 2, ...)."""
    return min(60.0, 5.0 * 2 ** (attempt - 1))


def resubmit_after_failure(spec: JobSpec, job_id: str, rc: int, env=None, sleep=time.sleep,
                           submit=None) -> str | None:
    """The batch shell of a method-"sbatch" job whose srun failed (a killed rank, a lost node): unless the job
    ended on its own (an ``end`` event), submit its successor onto the same mix, to resume from the last good
    checkpoint, after a backoff, at most ``max_failures`` times per chain. Chain events: ``end`` (state
    failed, the iterations lost since that checkpoint, the error's ``signature`` that a rank recorded, see
    ``record_error``) and ``requeue`` (reason failure). Not resubmitted when the chain's previous failure had
    the same signature (the same exception type and message at the same place: it would fail again); the
    ``end`` event then says why (``message``). The new job id, or None."""
    from hpc_jabas.errors import CheckpointError
    from hpc_jabas.runtime.persist import checkpoint as ckpt
    from hpc_jabas.slurm.cluster import mix_from_env
    from hpc_jabas.slurm.components import extra_args, slurm_option
    from hpc_jabas.slurm.executor import submit_job
    if rc == 2:
        return None                      # the job said why it stopped (bad input, a directory in use)
    from hpc_jabas.slurm.cluster import job_clock
    state = job_clock(job_id, env)["state"] if submit is None else None
    if state not in (None, "RUNNING"):
        return None                      # cancelled (scancel) or ending: not a failure to recover from
    ev = chainlog.read(spec.chain_dir)
    if any(e.get("event") == "end" and str(e.get("job_id")) == str(job_id) and e.get("time", 0) >= _started(ev, job_id)
           for e in ev):
        return None                      # it ended on its own (moved, stopped, finished): nothing to recover
    from hpc_jabas.slurm.cancel import chain_cancel
    if chain_cancel(ev, job_id) is not None:
        chainlog.append(spec.chain_dir, "end", job_id=job_id, state="cancelled", exit_code=rc,
                        cancelled_by="hpc-jabas cancel")
        return None                      # the chain was cancelled (hpc-jabas cancel): no successor
    failures = sum(1 for e in ev if e.get("event") == "requeue" and e.get("reason") == "failure")
    its = [int(r["it"]) for r in _metrics(spec) if r.get("type") == "iteration"]
    try:
        found = ckpt.load_latest(Path(spec.run_dir) / "checkpoints", log=log.warning)
    except CheckpointError:
        found = None
    at = int(found[0]["iteration"]) if found else 0
    lost = max(0, (max(its) + 1 if its else 0) - at)
    started = _started(ev, job_id)
    sig = chainlog.job_failure_signature(ev, job_id, since=started)     # None: no rank said (killed, node lost)
    end = {"job_id": job_id, "state": "failed", "exit_code": rc, "iteration": at, "lost_iterations": lost,
           "signature": sig}
    # a job whose task failed to build never wrote a start event: its run began when it was submitted
    seen = [float(e.get("time", 0)) for e in ev if str(job_id) in (str(e.get("job_id")), str(e.get("to_job")))]
    same = chainlog.repeated_failure(ev, sig, before=started or (min(seen) if seen else 0.0))
    if same is not None:                 # the same error at the same place as the failure before: not again
        msg = (f"job {job_id} failed (exit {rc}) of the same error as job {same.get('job_id')} before it "
               f"({chainlog.signature_text(sig or {})}): not resubmitted, it would fail again; fix it and submit "
               f"again (the checkpoint at iteration {at} is kept)")
        chainlog.append(spec.chain_dir, "end", **end, resubmitted=False, message=msg)
        log.error("%s", msg)
        return None
    chainlog.append(spec.chain_dir, "end", **end)
    if failures >= slurm_option(spec, "max_failures"):
        log.error("job %s failed (exit %s); the chain has been resubmitted after %d failures already "
                  "(max_failures): not again; the checkpoint at iteration %d is kept", job_id, rc, failures, at)
        return None
    mix = spec.mix if "unknown" not in spec.mix else (mix_from_env(env) or spec.mix)
    sleep(failure_backoff_s(failures + 1))
    bad = _failed_nodes(env)
    if bad:                              # nodes the failure points to (down, drained now): not again
        spec = dataclasses.replace(spec, slurm=dataclasses.replace(
            spec.slurm, sbatch_args=[*extra_args(spec), f"--exclude={','.join(bad)}"]))
    new_id = (submit or submit_job)(spec.with_mix(mix))
    chainlog.append(spec.chain_dir, "requeue", from_job=job_id, to_job=new_id, reason="failure", exit_code=rc,
                    excluded=bad, signature=sig,
                    iteration=at, lost_iterations=lost, attempt=failures + 1, method=spec.method,
                    checkpoint_time=(found[1].stat().st_mtime if found else time.time()))
    log.warning("job %s failed (exit %s): resubmitted as %s from the checkpoint at iteration %d (%d iterations "
                "lost; failure %d of max %d)", job_id, rc, new_id, at, lost, failures + 1,
                slurm_option(spec, "max_failures"))
    return str(new_id)


def _failed_nodes(env=None) -> list[str]:
    """This job's nodes that cannot take a job now (down, drained, failing): where the failure points."""
    from hpc_jabas.slurm.cluster import job_nodes, read_cluster
    try:
        view = read_cluster(env=env)
    except JabasError:
        return []
    return [n for n in job_nodes(env) if n in view.nodes and not view.nodes[n].usable]


def _started(ev: list[dict], job_id: str) -> float:
    """When this run of the job started (its last start event; 0 when none)."""
    return max([float(e.get("time", 0)) for e in ev if e.get("event") == "start"
                and str(e.get("job_id")) == str(job_id)] or [0.0])


def _metrics(spec: JobSpec) -> list[dict]:
    from hpc_jabas.core.config import jsonl
    p = Path(spec.run_dir) / "metrics.jsonl"
    check_file(p, "metrics record")     # the lost iterations recorded in the chain are counted from it
    out, notes = jsonl.parse(p.read_text() if p.exists() else "", str(p))
    for n in notes:                     # a line that is not a record is said, not skipped silently
        log.warning("%s", n)
    return out


def _submitit_requeue_handler():
    """submitit's USR2 handler that our stop-signal flag replaced (None when submitit did not set one)."""
    from hpc_jabas.runtime.safepoint import stop_signals
    h = stop_signals().previous(signal.SIGUSR2)
    return h if callable(h) and getattr(h, "__name__", "") == "checkpoint_and_try_requeue" else None


class RestartOverheadCallback(Callback):
    """Rank 0, after the first iteration of a job that resumed after a move or a requeue: the restart
    overhead (checkpoint -> now, less the time the job waited in Slurm's queue) goes to the auto-scaler's
    state and the chain log; the queue wait (submission -> the job's start, from squeue) is recorded apart."""

    def __init__(self, chain_dir: str, job_id: str, hook, trainer_start: float):
        self.chain_dir, self.job_id, self.hook, self.trainer_start = chain_dir, job_id, hook, trainer_start
        self.resumed = False

    def on_first_step(self, trainer) -> None:
        if trainer.rank != 0 or not self.resumed:
            return
        moves = [e for e in chainlog.read(self.chain_dir)
                 if e["event"] in ("move", "requeue", "replan") and str(e.get("to_job")) == str(self.job_id)]
        if moves:
            total = time.time() - float(moves[-1]["checkpoint_time"])
            queue_wait = 0.0
            if not str(self.job_id).startswith("local-"):
                from hpc_jabas.slurm.cluster import job_clock
                start = job_clock(self.job_id)["start"]
                if start is not None:   # a re-planned job queued from the first submission (slurm/replan.py)
                    queued = float(moves[-1].get("queued_since") or moves[-1]["time"])
                    queue_wait = min(max(0.0, start - queued), total)
            overhead = total - queue_wait
            self.hook.record_restart(overhead)
            # since_move_s: move recorded -> this job's trainer built (Slurm queue + start-up)
            chainlog.append(self.chain_dir, "restart", job_id=self.job_id, overhead_s=overhead,
                            queue_wait_s=queue_wait, total_s=total, after=moves[-1]["event"],
                            since_move_s=(self.trainer_start - float(moves[-1]["time"])))


def _params_digest(model) -> str:
    import hashlib
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 3 and argv[0] == "--after-failure":
        try:
            spec = spec_from_file(argv[2])
            job_id = SlurmEnv().job_id or ""
            if job_id:
                resubmit_after_failure(spec, job_id, int(argv[1]))
        except (JabasError, ValueError) as e:
            log.error("resubmission after the failure not done: %s", e)
            return 2
        return 0
    if len(argv) != 1:
        log.error("usage: python -m hpc_jabas.runtime.job.launch SPEC.json|JOB.toml")
        return 2
    try:
        out = run_job(spec_from_file(argv[0]))
    except JabasError as e:
        if not e.quiet:                        # rank 0 has said it already
            log.error("%s", e)
        return 2
    if out and (out.get("requeue") or {}).get("message"):
        return 1                               # stopped for good (too many time-outs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
