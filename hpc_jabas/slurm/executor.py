"""Submit one job of a resubmission chain onto a mix of Slurm partitions.

    from hpc_jabas.slurm.executor import submit_job
    job_id = submit_job(spec)                    # spec.method: "submitit" (default) or "sbatch"

Every rank of the job runs :data:`hpc_jabas.slurm.sbatch.JOB_ENTRY` ("hpc_jabas.runtime.job.launch:run_job"),
imported by name inside the job. The components of the mix (one plain job, or one heterogeneous job
for several partitions) are :mod:`hpc_jabas.slurm.components`; the script text is
:mod:`hpc_jabas.slurm.sbatch`; sbatch runs through :mod:`hpc_jabas.slurm.proc` in
:func:`~hpc_jabas.slurm.sbatch.submission_env` (callable from inside a running job: rank 0
resubmits at an epoch end).

Two methods:

* ``submitit``: :class:`JabasSlurmExecutor`, a :class:`submitit.SlurmExecutor` configured through
  its public parameters. A heterogeneous job's components 1..k ride in submitit's ``setup`` lines
  (``#SBATCH`` lines before the first command still count), and its het step is the ``python``
  command with ``use_srun=False`` (:func:`~hpc_jabas.slurm.sbatch.het_srun_python`). Results, logs
  and state come back through submitit's usual objects (``job.result()``, ``job.state``,
  ``job.stdout()``), for hetjobs too: inside a heterogeneous step every rank sees the leader's id in
  ``SLURM_JOB_ID`` and a global ``SLURM_PROCID`` (verified on Slurm 22.05), so submitit's
  ``<id>_<rank>_*`` file names hold. Folder: ``<chain_dir>/jobs/submitit``.
* ``sbatch``: a job script ``<chain_dir>/jobs/<n>.sbatch`` running ``srun [--het-group=..] --mpi=pmix
  <python> -u -m hpc_jabas.runtime.job.launch <chain_dir>/jobs/<n>.json``, submitted with
  ``sbatch --parsable``; its output goes to ``<chain_dir>/jobs/<n>-<jobid>.out``.

Optional Slurm options, ``spec.slurm`` (:class:`~hpc_jabas.core.config.jobspec.SlurmRequest`): ``mem_per_task_mb``
(512),
``job_name`` ("hpc-jabas"), ``account``, ``qos``, ``sbatch_args`` (list of extra ``--flag=value`` strings, every
component), and the [slurm] keys ``time_min``, ``signal_lead_s``, ``max_timeouts`` (else the job config's:
:class:`~hpc_jabas.slurm.components.SlurmOptions`).

Preemption and time limits: a job told to stop (USR1/USR2/TERM) checkpoints at the next safe point
(runtime/safepoint.py); a submitit job then requeues through submitit (``EntryPoint.checkpoint``, at most
``max_timeouts`` time-outs), a method-"sbatch" job submits its successor (runtime/job/launch.py).
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import re
import shlex
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import submitit
from submitit.core.utils import JobPaths, UncompletedJobError
from submitit.slurm.slurm import SlurmInfoWatcher

from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.core.config.loader import load_callable
from hpc_jabas.errors import ConfigError, JabasError, SlurmError
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.slurm import proc
from hpc_jabas.slurm.components import (
    Component,
    SlurmOptions,
    check_extra,
    components,
    extra_args,
    partition_view,
    per_component_options,
)
from hpc_jabas.slurm.env import SlurmEnv
from hpc_jabas.slurm.node_entry import NODE_ENTRY
from hpc_jabas.slurm.nodepaths import check_job_environment
from hpc_jabas.slurm.sbatch import (
    JOB_ENTRY,
    SRUN_ARGS,
    failure_teardown,
    het_block,
    het_srun_python,
    normalize,
    render_sbatch,
    setup_lines,
    submission_env,
    workdir,
)
from hpc_jabas.slurm.text import parse_sbatch_id
from hpc_jabas.slurm.watch import fold_state
from hpc_jabas.trust import check_dir, make_private, open_trusted, private_dir, trust_group

SBATCH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EntryPoint:
    """A picklable callable naming its target as "module:callable"; the import happens when it is
    called (inside the job), so submitting never imports the job's code."""
    target: str = JOB_ENTRY

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return load_callable(self.target, "job entry", JOB_ENTRY)(*args, **kwargs)

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """submitit's requeue: the job entry again, with the same spec. Called by rank 0 once every rank
        has checkpointed at a safe point (runtime/job/launch.py), never inside a signal handler: the run
        resumes from that checkpoint."""
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def run_sbatch(script: str | Path, env: Mapping[str, str], extra_args: list[str] | None = None) -> str:
    """``sbatch --parsable SCRIPT`` in ``env`` -> job id (the leader's for a heterogeneous job)."""
    name = Path(script).name
    out = proc.run(["sbatch", "--parsable", *(extra_args or []), str(script)], env, timeout=SBATCH_TIMEOUT_S,
                   refused=f"sbatch refused {name}")
    jid = parse_sbatch_id(out)
    if jid is None:
        raise SlurmError(f"sbatch gave no job id for {name}: {proc.first_line(out)!r}")
    return jid


# ---- method "submitit" -------------------------------------------------------------------------
class HetSlurmInfoWatcher(SlurmInfoWatcher):
    """submitit's sacct watcher; sacct lists a heterogeneous job as ``<id>+0``, ``<id>+1``...:
    those records are folded into ``<id>`` (state by :func:`hpc_jabas.slurm.watch.fold_state`)."""

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        info = super().read_info(string)
        comps: dict[str, list[tuple[int, dict[str, str]]]] = {}
        for key, stats in info.items():
            m = re.fullmatch(r"(\d+)\+(\d+)", key)
            if m:
                comps.setdefault(m.group(1), []).append((int(m.group(2)), stats))
        for jid, items in comps.items():
            items.sort(key=lambda x: x[0])
            merged = {**items[0][1], "JobID": jid, "State": fold_state(s.get("State", "") for _, s in items),
                      "NodeList": ",".join(s["NodeList"] for _, s in items if s.get("NodeList"))}
            info[jid] = merged
        return info


class JabasSlurmJob(submitit.SlurmJob):
    """submitit's SlurmJob; ``result()`` of a multi-rank job is global rank 0's result (the others
    return None from run_job); ``results()`` still gives every rank's."""
    watcher = HetSlurmInfoWatcher(delay_s=600)

    def result(self) -> Any:
        if self.num_tasks > 1:
            return self.results()[0]
        return super().result()

    # PRIVATE submitit API (1.5.4): the one method that unpickles a task's result file (``results()`` and
    # ``exception()`` call it). A pickle is code: this one waits for the file as 1.5.4's does, then opens it
    # and checks what it opened (owner, mode, a regular file, its directories: trust.open_trusted) and
    # unpickles from that same open file. A missing file is never passed unchecked, and nothing that appears
    # after the check is read.
    def _get_outcome_and_result(self) -> tuple[str, Any]:
        assert not self._sub_jobs, "This should not be called for a meta-job"
        rp, folder = self.paths.result_pickle, self.paths.folder
        timeout = self._results_timeout_s
        try:
            folder.chmod(folder.stat().st_mode)   # as submitit: refreshes a network file system's cache
        except PermissionError:
            timeout *= 2
        except OSError:
            pass
        start = time.time()
        while not rp.exists() and time.time() - start < timeout:
            time.sleep(1)
        for attempt in (1, 2):
            try:
                with open_trusted(rp, "submitit result") as f:
                    return cast(tuple[str, Any], pickle.load(f))
            except FileNotFoundError:
                log = self.stderr()
                raise UncompletedJobError(
                    f"Job {self.job_id} (task: {self.task_id}) with path {rp}\nhas not produced any output "
                    f"(state: {self.state})" + (f"\nError stream produced:\n{'-' * 40}\n{log}" if log else
                                                f"\nNo error stream produced: look at {self.paths.stdout}")) from None
            except EOFError:                      # as submitit: a file still being written, once more in 2 s
                if attempt == 2:
                    raise
                time.sleep(2)
        raise AssertionError("not reached")


class JabasSlurmExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor whose sbatch runs through :mod:`hpc_jabas.slurm.proc` in ``env``
    (default :func:`submission_env`), and whose jobs have ``num_tasks`` tasks (every rank of every
    component). Everything else is set through ``update_parameters``: see :func:`make_executor`."""

    def __init__(self, folder: str | Path, *, num_tasks: int, env: Mapping[str, str] | None = None,
                 python: str | None = None, max_num_timeout: int = 3) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout, python=python)
        self.num_tasks = int(num_tasks)
        self.submit_env = submission_env() if env is None else dict(env)

    # ---- PRIVATE submitit API (submitit==1.5.4, pinned in pyproject.toml): the one place ----------
    # ``PicklingExecutor._submit_command`` is the hook an executor implements to submit one job
    # script; submitit's own runs sbatch in os.environ (inside a job that still holds the job's
    # SLURM_*/PMIX_* variables) and builds the job with ``_num_tasks()`` (nodes x ntasks_per_node,
    # wrong for a heterogeneous job). This one does what 1.5.4's does otherwise: renders the file
    # with ``_make_submission_file_text`` (submitit's template from the public parameters) and moves
    # it to ``<id>_submission.sh`` (public JobPaths methods). Review on any submitit upgrade.
    def _submit_command(self, command: str) -> JabasSlurmJob:
        folder = JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        uid = uuid.uuid4().hex
        path = folder / f".submission_file_{uid}.sh"
        path.write_text(self._make_submission_file_text(command, uid))
        job = JabasSlurmJob(folder=self.folder, job_id=run_sbatch(path, self.submit_env),
                            tasks=list(range(self.num_tasks)))
        job.paths.move_temporary_file(path, "submission_file", keep_as_symlink=True)
        return job

    # The command each rank runs (submitit 1.5.4: ``<python> -u -m submitit.core._submit <folder>``): the same
    # through hpc_jabas/slurm/node_entry.py, which checks the submitted pickle's owner and mode (and its
    # directories') before submitit unpickles it.
    @property
    def _submitit_command_str(self) -> str:
        return " ".join([self.python, "-u -m", NODE_ENTRY, shlex.quote(str(self.folder))])
    # ---- end of private submitit API --------------------------------------------------------------


def make_executor(spec: JobSpec, comps: list[Component], env: Mapping[str, str] | None = None,
                  spec_path: str | Path | None = None) -> JabasSlurmExecutor:
    """A configured :class:`JabasSlurmExecutor` for the spec's mix (folder <chain_dir>/jobs/submitit).

    Component 0 is submitit's own block (job name, time, signal, output files); components 1..k
    follow as ``#SBATCH hetjob`` blocks at the head of the setup lines, and the het step runs
    every rank with per-rank log files. With ``spec_path`` (the spec as a JSON file), a failed step (a
    killed rank, a lost node) is resubmitted from the last good checkpoint by submitit's ``teardown`` lines
    (:func:`~hpc_jabas.slurm.sbatch.failure_teardown`), as a method-"sbatch" job script does."""
    folder = private_dir(Path(spec.chain_dir) / "jobs" / "submitit")
    python = shlex.quote(spec.python or sys.executable)
    het = len(comps) > 1
    if het:
        python = het_srun_python(comps, python, folder)
    opts = SlurmOptions.of(spec)
    ex = JabasSlurmExecutor(folder, num_tasks=sum(c.ntasks for c in comps), env=env, python=python,
                            max_num_timeout=opts.max_timeouts)
    c0 = comps[0]
    add: dict[str, object] = {"chdir": str(workdir(spec))}
    for k, v in per_component_options(spec).items():
        if k != "time":
            add[k] = v
    for a in extra_args(spec):
        k, _, v = a.lstrip("-").partition("=")
        add[k] = v if v else True
    params: dict[str, Any] = dict(
        partition=c0.partition, mem=f"{c0.mem_mb}M", nodes=c0.nodes,
        signal_delay_s=opts.signal_lead_s, time=opts.time_min, job_name=opts.job_name,
        setup=(het_block(spec, comps[1:]) if het else []) + setup_lines(spec))
    if spec_path is not None:
        params["teardown"] = failure_teardown(spec, spec_path)
    if het:
        params["use_srun"] = False
    else:
        params["srun_args"] = list(SRUN_ARGS)
    if c0.nodes == 1:
        params.update(ntasks_per_node=c0.ntasks, gres=f"gpu:{c0.gpu_spec}{c0.ntasks}")
    else:
        add.update({"ntasks": str(c0.ntasks), "gpus-per-task": f"{c0.gpu_spec}1"})
    params["additional_parameters"] = add
    ex.update_parameters(**params)
    return ex


# ---- method "sbatch" ---------------------------------------------------------------------------
def _next_job_file(jobs: Path) -> tuple[int, Path]:
    private_dir(jobs)
    n = 1 + max((int(p.stem) for p in jobs.glob("*.sbatch") if p.stem.isdigit()), default=0)
    while True:
        p = jobs / f"{n}.sbatch"
        try:
            fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.close(fd)
            return n, p
        except FileExistsError:
            n += 1


def _submit_sbatch(spec: JobSpec, comps: list[Component], env: Mapping[str, str]) -> tuple[str, Path, Path]:
    jobs = Path(spec.chain_dir) / "jobs"
    n, script = _next_job_file(jobs)
    spec_path = make_private(spec.save(jobs / f"{n}.json"))
    script.write_text(render_sbatch(spec, comps, spec_path, jobs / f"{n}-%j.out"))
    return run_sbatch(script, env), script, spec_path


# ---- entry points -----------------------------------------------------------------------------
@dataclass
class Submission:
    job_id: str
    method: str
    mix: dict[str, int]
    job: JabasSlurmJob | None = None      # the submitit Job (method submitit)
    script: Path | None = None           # the job script (method sbatch)


def submit(spec: JobSpec, *, method: str | None = None, view: Any = None,
           env: Mapping[str, str] | None = None) -> Submission:
    """Submit ``run_job(spec)`` onto ``spec.mix``; append a ``submit`` event to the chain. Refused in one line
    before Slurm sees it: bad Slurm options, a chain directory another user can write, and (outside a job) a
    python environment or code that the nodes cannot see (slurm/nodepaths.py ``check_job_environment``)."""
    spec = normalize(spec, method)
    check_extra(spec)                    # account, qos, sbatch_args and the numbers: refused before Slurm sees them
    check_chain_dirs(spec.chain_dir)     # what the job will run is read from there: only this user may write it
    if not SlurmEnv().job_id:            # its nodes see its python and its code (a job resubmitting itself runs there)
        check_job_environment(spec, os.environ if env is None else env)
    sub_env = submission_env(env)
    proc.require(("sbatch", "srun"), sub_env)
    pt = (spec.config.get("autoscale") or {}).get("partition_types") if isinstance(spec.config, dict) else None
    if view is None:
        view = partition_view(pt)
    comps = components(spec.mix, view, mem_per_task_mb=SlurmOptions.of(spec).mem_per_task_mb)
    spec = dataclasses.replace(spec, mix={c.partition: c.ntasks for c in comps})
    job: JabasSlurmJob | None = None
    script: Path | None = None
    if spec.method == "submitit":
        # the spec as submitted, for whoever re-plans a job that pends on unavailable nodes (slurm/replan.py)
        spec_dir = private_dir(Path(spec.chain_dir) / "jobs" / "submitit")
        spec_path = make_private(spec.save(spec_dir / f"spec-{uuid.uuid4().hex[:12]}.json"))
        old_umask = os.umask(0o077)      # the pickle and script submitit writes: no group/world write (node_entry)
        os.umask(old_umask | (0o002 if trust_group() else 0o022))
        try:
            job = cast(JabasSlurmJob, make_executor(spec, comps, sub_env, spec_path).submit(EntryPoint(), spec))
        except JabasError:
            raise
        except Exception as e:   # submitit's own errors (bad parameters, submission failures)
            raise SlurmError("submitit could not submit the job: "
                             f"{proc.first_line(str(e)) or type(e).__name__}") from None
        finally:
            os.umask(old_umask)
        job_id = str(job.job_id)
    else:
        job_id, script, spec_path = _submit_sbatch(spec, comps, sub_env)
    inside = SlurmEnv().job_id
    chainlog.append(spec.chain_dir, "submit", job_id=job_id, mix=spec.mix, method=spec.method,
                    by=f"job {inside}" if inside else "user", spec=str(spec_path),
                    script=str(script) if script else str(job.paths.submission_file) if job else "")
    return Submission(job_id, spec.method, dict(spec.mix), job=job, script=script)


def check_chain_dirs(chain_dir: str | Path) -> None:
    """Refuse (UntrustedFileError, one line naming the directory) a chain directory, its ``jobs/`` or its
    ``jobs/submitit/`` that another user owns or can write, or one with such a directory above it (up to the
    home directory, else ``/``; hpc_jabas/trust.py): the job specs, job scripts and the pickle submitit runs on
    the node are written there and read back by the job."""
    c = Path(chain_dir)
    for d, what in ((c, "chain directory"), (c / "jobs", "job directory"),
                    (c / "jobs" / "submitit", "submitit directory")):
        check_dir(d, what)


def submit_job(spec: JobSpec, *, method: str | None = None) -> str:
    """Submit ``hpc_jabas.runtime.job.launch.run_job(spec)`` onto ``spec.mix``; returns the (leader) job id."""
    return submit(spec, method=method).job_id


def submitit_job(chain_dir: str | Path, job_id: str) -> JabasSlurmJob:
    """The submitit Job object of a chain's job submitted with method submitit (e.g. by rank 0 of an
    earlier job): ``.result()``, ``.state``, ``.stdout()`` as usual."""
    folder = Path(chain_dir).resolve() / "jobs" / "submitit"
    ev = [e for e in chainlog.read(chain_dir) if e.get("event") == "submit" and str(e.get("job_id")) == str(job_id)]
    if not ev or ev[-1].get("method") != "submitit":
        raise ConfigError(f"job {job_id} was not submitted with submitit in chain {str(chain_dir)!r}")
    n = sum(int(v) for v in (ev[-1].get("mix") or {}).values())
    return JabasSlurmJob(folder=folder, job_id=str(job_id), tasks=list(range(max(1, n))))
