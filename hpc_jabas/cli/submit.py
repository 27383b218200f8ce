"""`hpc-jabas submit`: start a resubmission chain on a mix of Slurm partitions.

    hpc-jabas submit JOB.toml --mix a100:1,v100:2 [--method submitit|sbatch] [--wait]

JOB.toml: a [job] table (task = "module:callable", chain_dir, method, optional pythonpath, python,
mix = {partition = count}) plus the training configuration (JobConfig keys) and an [autoscale]
table (see slurm/digits.toml). The first job runs on --mix (or [job] mix); at epoch ends the job
may move itself to another mix. --wait follows the chain (every event printed) until a job
finishes the training (exit 0) or a job ends without finishing it (exit 1).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

from hpc_jabas.errors import ConfigError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "submit", help="submit a training job (a resubmission chain) onto a mix of Slurm partitions",
        description="Submit JOB.toml's task onto a mix of Slurm partitions (one heterogeneous job for "
                    "several partitions). The job auto-scales at epoch ends by resubmitting itself.")
    p.add_argument("job", metavar="JOB.toml", help="job file: [job] task/chain_dir/method + config + [autoscale]")
    p.add_argument("--mix", metavar="PART:N[,...]", help="partitions and GPU counts, e.g. a100:1,v100:2 "
                   "(default: the [job] mix table of JOB.toml)")
    p.add_argument("--method", choices=("submitit", "sbatch"),
                   help="how this and later jobs are submitted (default: [job] method, else sbatch)")
    p.add_argument("--wait", action="store_true", help="follow the chain until the training ends")
    p.add_argument("--timeout", type=float, metavar="S", help="with --wait: give up after S seconds (exit 1)")
    for f in _slurm_fields():         # one flag per [slurm] key, from its field (JobConfig's)
        p.add_argument("--" + f.name.replace("_", "-"), type=int, metavar="N",
                       help=f"{f.metadata['help']} (default: [slurm] {f.name} of JOB.toml, else {f.default})")
    p.add_argument("--no-dry-run", action="store_true", help="do not call the task builder before submitting "
                   "(by default it runs once here, to catch a task that returns the wrong thing)")
    p.set_defaults(func=run)
    return p


def _check_job_table(path: str) -> dict:
    """The raw [job] table, checked (core/jobspec.check_job_table: unknown keys, values of the wrong type)."""
    from hpc_jabas.core.config.sections import read_toml
    job = read_toml(path, "job file").get("job") or {}    # unreadable, not UTF-8, not TOML: one line
    from hpc_jabas.core.config.jobspec import check_job_table
    return check_job_table(job, path)


def _check_dirs(spec) -> None:
    """The chain directory and its run directory exist or can be made (a file there, /proc, no permission:
    one line); nothing is made here."""
    from hpc_jabas.cli.paths import probe_dir
    probe_dir(spec.chain_dir, "chain_dir")
    probe_dir(spec.run_dir, "run directory (<chain_dir>/run)")


def _check_spec(spec) -> None:
    """Fail early, with one line, on what the job itself would only find out on the cluster."""
    from hpc_jabas.core.config.sections import AutoscaleConfig, JobConfig
    cfg = dict(spec.config)
    cfg.pop("job", None)
    JobConfig.from_dict(cfg)
    AutoscaleConfig.from_dict(cfg.get("autoscale"))      # one clear line on a bad [autoscale] table
    from hpc_jabas.slurm.sbatch import job_pythonpath
    mod = spec.task.partition(":")[0]
    added = [p for p in job_pythonpath(spec) if p not in sys.path]
    sys.path[:0] = added
    try:
        found = importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        for p in added:
            sys.path.remove(p)
    if not found:
        raise ConfigError(f"task module {mod!r} of task {spec.task!r} is not importable from here; "
                          "add its directory to [job] pythonpath or PYTHONPATH")


def _check_node_visible(spec) -> None:
    """The chain directory, the task's module, the job's python environment and its code are not in a node-local
    directory (/tmp, /var/tmp, /dev/shm, unless HPC_JABAS_SHARED_TMP or the local cluster declares them shared): the
    nodes could not see them (slurm/nodepaths.py)."""
    from hpc_jabas.slurm.nodepaths import check_job_environment, check_node_visible
    from hpc_jabas.slurm.sbatch import job_pythonpath
    check_node_visible(spec.chain_dir, "chain_dir")
    mod = spec.task.partition(":")[0]
    added = [p for p in job_pythonpath(spec) if p not in sys.path]
    sys.path[:0] = added
    try:
        found = importlib.util.find_spec(mod)
    except (ImportError, ValueError):
        found = None
    finally:
        for p in added:
            sys.path.remove(p)
    if found is not None and found.origin and found.has_location:
        check_node_visible(found.origin, f"task module {mod!r} of task {spec.task!r}, at")
    check_job_environment(spec)


def _trust_group(spec) -> None:
    """The job's trust_group (group-writable chain records and checkpoints accepted) for what submit reads."""
    from hpc_jabas.core.config.sections import flatten
    from hpc_jabas.trust import set_trust_group
    flat, _ = flatten(spec.config or {})
    set_trust_group(flat.get("trust_group") is True)


def _check_code(spec) -> None:
    """The code the job file names (pythonpath directories, the task's module file, the python interpreter) is
    trust-checked on the login node before it is imported (runtime/job/launch.py ``check_code``; the launcher checks
    it again on the compute node), on the path the job imports it from."""
    from hpc_jabas.runtime.job.launch import check_code
    from hpc_jabas.slurm.sbatch import job_pythonpath
    check_code(spec, search=[*job_pythonpath(spec), *sys.path, str(Path.cwd())])


def _check_task(spec, dry_run: bool = True) -> None:
    """The task callable resolves and (dry run) returns a valid hpc_jabas.Task (or the older dict): the
    same check (runtime/job/task.py, ``Task.from_parts``) as the job's launcher makes."""
    from hpc_jabas.core.config.loader import load_callable, one_line
    from hpc_jabas.slurm.sbatch import job_pythonpath
    added = [p for p in job_pythonpath(spec) if p not in sys.path]
    sys.path[:0] = added
    try:
        fn = load_callable(spec.task, "task")
        if not dry_run:
            return
        from hpc_jabas.runtime.job.task import call_task
        try:
            parts = call_task(fn, spec.config, spec.run_dir)
        except ConfigError:
            raise
        except Exception as e:          # the user's builder: any failure is reported in one line
            raise ConfigError(f"task {spec.task!r} failed when called: {one_line(e)}") from None
    finally:
        for p in added:
            sys.path.remove(p)
    from hpc_jabas.runtime.job.task import Task
    Task.from_parts(parts, spec.task)


def _check_mix(spec, view) -> None:
    """Every partition of the mix holds GPUs of one known type, and micro_batch fits their memory."""
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.perf.perfmodel import job_perf_model
    from hpc_jabas.runtime.calibrate import check_calibration
    types = {part: view.gpu_partition(part).gpu_type for part in spec.mix}      # ConfigError: unknown, untyped
    cfgd = dict(spec.config)
    cfgd.pop("job", None)
    cfg = JobConfig.from_dict(cfgd)
    if cfg.micro_batch:
        check_calibration(cfg)           # job_perf_model (pure) reads the run's calibration.json: checked here
        model = job_perf_model(cfg, sorted(set(types.values())))
        for part, g in sorted(types.items()):
            cap = model.profile(g).max_b
            if cap is not None and cfg.micro_batch > cap:
                raise ConfigError(f"micro_batch={cfg.micro_batch} does not fit the memory of partition {part!r} "
                                  f"({g}: at most {cap} samples per micro-batch); lower micro_batch or leave it unset")


def _autoscale(spec):
    from hpc_jabas.core.config.sections import AutoscaleConfig
    return AutoscaleConfig.from_dict((spec.config or {}).get("autoscale"))


def _check_autoscale_bounds(spec) -> None:
    """The starting mix is one the auto-scaler may choose: its GPU count within [autoscale] min_gpus..max_gpus."""
    from hpc_jabas.core.autoscale.scaler import mix_label
    a = _autoscale(spec)
    n = sum(int(v) for v in spec.mix.values())
    if a.enabled and not a.min_gpus <= n <= a.max_gpus:
        raise ConfigError(f"the starting mix {mix_label(spec.mix)} has {n} GPU(s), outside autoscale.min_gpus="
                          f"{a.min_gpus}..max_gpus={a.max_gpus}: the auto-scaler could never choose it; start on "
                          f"{a.min_gpus} to {a.max_gpus} GPUs, or change min_gpus/max_gpus")


def _check_autoscale_names(spec, view) -> None:
    """Every name in [autoscale] allowed is a partition with GPUs of this cluster or the GPU type of one."""
    a = _autoscale(spec)
    if not a.enabled or a.allowed is None:
        return
    parts = [p for p in view.partitions.values() if p.has_gpus]
    valid = {p.name for p in parts} | {p.gpu_type for p in parts if p.gpu_type}
    unknown = [x for x in a.allowed if x not in valid]
    if unknown:
        raise ConfigError(f"autoscale.allowed names {', '.join(map(repr, unknown))}: not a partition with GPUs of "
                          f"this cluster, nor the GPU type of one; valid: {', '.join(sorted(valid)) or 'none'}")


def _slurm_fields() -> list[dataclasses.Field]:
    from hpc_jabas.core.config.sections import section_fields
    return section_fields("slurm")


def _slurm_extra(args) -> dict:
    """The [slurm] keys given as flags (they override JOB.toml's), checked against their fields' bounds."""
    from hpc_jabas.core.config.validate import integer
    out = {}
    for f in _slurm_fields():
        v = getattr(args, f.name, None)
        if v is None:
            continue
        try:
            out[f.name] = integer(v, f.name, lo=f.metadata["lo"])
        except ConfigError:
            raise ConfigError(f"--{f.name.replace('_', '-')} {v} must be >= {f.metadata['lo']}") from None
    return out


def _check_time_options(spec) -> None:
    """The signal lead must be well below the time limit (at most half of it): else every job is told to stop
    at its first iteration and the chain spends its time-outs without training."""
    from hpc_jabas.slurm.components import slurm_option
    limit_s = 60 * slurm_option(spec, "time_min")
    lead = slurm_option(spec, "signal_lead_s")
    if lead > limit_s // 2:
        raise ConfigError(f"the signal lead signal_lead_s={lead} s must be well below the time limit time_min="
                          f"{slurm_option(spec, 'time_min')} min ({limit_s} s): at most half of it, {limit_s // 2} s; "
                          "else every job stops at its first iteration as a time-out. Raise --time-min or lower "
                          "--signal-lead-s")


def _check_ranks(spec) -> None:
    """A gpu_types list names one type per rank of the mix."""
    from hpc_jabas.core.config.sections import JobConfig
    cfgd = dict(spec.config)
    cfgd.pop("job", None)
    types = JobConfig.from_dict(cfgd).gpu_types
    ranks = sum(int(n) for n in spec.mix.values())
    if types and len(types) != ranks:
        mix = ",".join(f"{p}:{n}" for p, n in spec.mix.items())
        raise ConfigError(f"gpu_types lists {len(types)} types but the mix {mix} "
                          f"has {ranks} ranks; give one type per rank, or leave gpu_types unset under Slurm")


def _check_not_finished(spec) -> None:
    """A chain whose last job finished the configured epochs is not submitted again (it would only refuse
    inside Slurm, after queueing), unless resume_finished is set."""
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.slurm import chain as chainlog
    cfgd = dict(spec.config)
    cfgd.pop("job", None)
    cfg = JobConfig.from_dict(cfgd)
    if cfg.resume_finished:
        return
    ends = [e for e in chainlog.read(spec.chain_dir) if e.get("event") == "end"]
    last = ends[-1] if ends else None
    if last is not None and last.get("state") == "finished" and int(last.get("epochs") or 0) >= cfg.epochs:
        raise ConfigError(f"chain_dir {spec.chain_dir!r} already finished its training (job {last.get('job_id')}, "
                          f"epoch {last.get('epochs')} of {cfg.epochs}); nothing to train. Give another chain_dir, "
                          "more epochs, or resume_finished = true to resume it anyway")


def _check_chain_free(spec) -> None:
    """One writer per chain directory: refused when a job holds its run directory or a job of the chain is
    still queued or running (one line naming it)."""
    from hpc_jabas.errors import SlurmError
    from hpc_jabas.runtime.persist.dirlock import DirLock, holder_text
    from hpc_jabas.slurm import chain as chainlog
    from hpc_jabas.slurm.watch import TERMINAL, sacct_states
    for d, what in ((Path(spec.chain_dir), "chain directory"), (Path(spec.run_dir), "run directory")):
        h = DirLock(d, what).locked_by_other()
        if h is not None:
            raise ConfigError(f"chain_dir {spec.chain_dir!r} is in use by {holder_text(h)} (its {what}); give this "
                              "job its own chain_dir, or wait for that job to end")
    ids = [str(e["job_id"]) for e in chainlog.read(spec.chain_dir) if e.get("event") == "submit" and e.get("job_id")]
    if not ids:
        return
    try:
        states = sacct_states(ids[-5:])
    except SlurmError:
        return
    live = [(j, st["State"]) for j, st in states.items() if st.get("State") not in TERMINAL]
    if live:
        j, st = live[-1]
        raise ConfigError(f"chain_dir {spec.chain_dir!r} has job {j} {st}; wait for it, end it "
                          f"(hpc-jabas cancel {spec.chain_dir}), "
                          "or give this job its own chain_dir")


#: one line per chain event (``_describe``): its format over the event's fields and the derived ones below
EVENT_FORMATS = {
    "submit": "submit  job {job_id} on {mix_label} ({method}, by {by})",
    "start": "start   job {job_id}: {world} ranks {gpus}, epoch {epoch}, iteration {iteration}",
    "move": "move    job {from_job} -> {to_job} on {mix_label} at epoch {epoch}",
    "restart": "restart job {job_id}: {overhead_s:.1f} s from checkpoint to first iteration "
               "(+{queue_wait_s:.1f} s in the queue)",
    "requeue": "requeue job {from_job} -> {to_job}: {reason} ({signal}) at iteration {iteration}, "
               "{lost_iterations} iterations lost",
    "replan": "replan  job {from_job} pended on {excluded_list} ({reason}): cancelled; job {to_job} on {mix_label}",
    "replan_wait": "waiting {message}",
    "error": "error   job {job_id} rank {rank}: {sig_type}: {sig_message} at {sig_where}",
    "end_message": "end     job {job_id}: {state}: {message}",
    "end": "end     job {job_id}: {state} after {wall_s:.1f} s, epochs {epochs}, cost {cost:.4g}",
}


class _Fields(dict):
    def __missing__(self, key: str) -> None:         # a field the event lacks reads as None, as e.get() did
        return None


def _describe(e: dict) -> str:
    from hpc_jabas.core.autoscale.scaler import mix_label
    t = time.strftime("%H:%M:%S", time.localtime(e.get("time", time.time())))
    ev = e.get("event")
    key = "end_message" if ev == "end" and e.get("message") else ev
    if key not in EVENT_FORMATS:
        return f"{t} {ev} {e}"
    sig = e.get("signature") or {}
    f = _Fields({k: 0 for k in ("overhead_s", "queue_wait_s", "lost_iterations", "wall_s", "cost")})
    f.update({k: v for k, v in e.items() if v is not None or k not in f})
    f.update(mix_label=mix_label(e.get("mix") or {}), gpus=",".join(e.get("gpu_types") or []),
             excluded_list=",".join(e.get("excluded") or []), sig_type=sig.get("type"),
             sig_message=sig.get("message"), sig_where=sig.get("where"))
    return f"{t} {EVENT_FORMATS[key].format_map(f)}"


def run(args) -> int:
    from hpc_jabas.core.autoscale.scaler import mix_label
    from hpc_jabas.runtime.job.launch import spec_from_file
    from hpc_jabas.slurm.components import parse_mix
    from hpc_jabas.slurm.executor import submit
    from hpc_jabas.slurm.watch import wait_chain
    job = _check_job_table(args.job)          # before spec_from_file: a [job] value of the wrong type is one line
    spec = spec_from_file(args.job)           # both read the job file once it has passed the trust check
    _trust_group(spec)
    _check_code(spec)                         # before anything of the task is looked up or imported here
    if args.mix:
        mix = parse_mix(args.mix)
    else:
        table = job.get("mix")
        if not table or not isinstance(table, dict):
            raise ConfigError("no mix: give --mix PART:N[,...] (e.g. a100:1,v100:2) or a [job] mix table")
        mix = parse_mix(",".join(f"{k}:{v}" for k, v in table.items()))
    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError(f"--timeout {args.timeout:g} must be > 0 seconds")
    spec = dataclasses.replace(spec, mix=mix, method=args.method or spec.method,
                               slurm=dataclasses.replace(spec.slurm, **_slurm_extra(args)))
    _check_spec(spec)
    _check_time_options(spec)
    _check_ranks(spec)
    _check_autoscale_bounds(spec)
    _check_dirs(spec)
    _check_not_finished(spec)
    _check_node_visible(spec)             # before anything asks Slurm
    _check_chain_free(spec)
    from hpc_jabas.slurm.components import partition_view
    view = partition_view((spec.config.get("autoscale") or {}).get("partition_types"))
    _check_mix(spec, view)
    _check_autoscale_names(spec, view)
    _check_task(spec, dry_run=not args.no_dry_run)
    s = submit(spec, view=view)
    print(f"submitted job {s.job_id} on {mix_label(s.mix)} ({s.method}); chain {spec.chain_dir}")
    print(f"follow it: hpc-jabas status {spec.chain_dir}")
    if not args.wait:
        return 0
    from hpc_jabas.slurm.executor import submit_job
    from hpc_jabas.slurm.replan import PendingWatch
    watch = PendingWatch(spec.chain_dir, submit_job)      # a job pending on drained/down nodes: re-planned
    res = wait_chain(spec.chain_dir, s.job_id, timeout=args.timeout, on_event=lambda e: print(_describe(e), flush=True),
                     on_pending=watch.check)
    if res["ok"]:
        print(f"chain finished: job {res['job_id']} ({len(res['jobs'])} job(s): {', '.join(res['jobs'])})")
        return 0
    print(stopped_line(res, args.timeout, spec.chain_dir), file=sys.stderr)
    return 1


def stopped_line(res: dict, timeout: float | None, chain_dir: str) -> str:
    """What --wait says when it ends without a finished chain: a job that ended (before it started training: with
    the last line of its node log and the log's path), or --timeout reached while the job still runs (or waits in
    the queue)."""
    if res["state"] != "timeout" and "before_start" in res:     # it died on its node before it started training
        bs = res["before_start"]
        why = (f": the last line of its log {bs['log']}: {bs['line']}" if bs.get("line") else
               f"; it left no log under {Path(chain_dir) / 'jobs'}")
        return f"hpc-jabas: chain stopped: job {res['job_id']} is {res['state']} before it started training{why}"
    if res["state"] != "timeout":
        return (f"hpc-jabas: chain stopped: job {res['job_id']} is {res['state']} without finishing the training; "
                f"logs under {Path(chain_dir) / 'jobs'}")
    from hpc_jabas.errors import SlurmError
    from hpc_jabas.slurm.watch import sacct_states
    try:
        st = sacct_states([str(res["job_id"])]).get(str(res["job_id"]), {}).get("State", "")
    except SlurmError:
        st = ""
    now = {"RUNNING": "still running", "PENDING": "still pending in the queue"}.get(st, f"still {st or 'not finished'}")
    return (f"hpc-jabas: --timeout {timeout:g} s reached: job {res['job_id']} is {now} (it was not cancelled); "
            f"follow it with: hpc-jabas status {chain_dir}")
