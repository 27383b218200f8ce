"""Submit one job of a resubmission chain onto a mix of Slurm partitions.

    from hpc_jabas.slurm.executor import submit_job
    job_id = submit_job(spec)                    # spec.method: "submitit" (default) or "sbatch"

The job runs :func:`hpc_jabas.runtime.launch.run_job` on every rank. A mix of one partition is a plain
Slurm job; a mix of several partitions is ONE heterogeneous job, one component per partition in
sorted partition order (the rank order :func:`hpc_jabas.runtime.lifecycle.expand_mix` assumes), started
with ``srun --het-group=0,..,k --mpi=pmix`` so that one MPI/Horovod world spans all components.

Per component: ``--partition``, ``--ntasks`` = GPUs (one rank per GPU), the partition's typed GPUs
(``--gres=gpu:<type>:<n>`` on one node; ``--nodes=N --gpus-per-task=<type>:1`` when the count needs
more GPUs than one node of the partition holds), ``--mem`` (so that jobs share nodes).

Two methods:

* ``submitit``: :class:`JabasSlurmExecutor`, a :class:`submitit.SlurmExecutor` that also writes
  heterogeneous jobs and submits with a clean environment. Results, logs and state come back
  through submitit's usual objects (``job.result()``, ``job.state``, ``job.stdout()``), for
  hetjobs too: inside a heterogeneous step every rank sees the leader's id in ``SLURM_JOB_ID``
  and a global ``SLURM_PROCID`` (verified on Slurm 22.05), so submitit's ``<id>_<rank>_*`` file
  names hold; the per-rank logs are redirected by the rank itself (srun's ``%t`` in a het step
  is not the global rank) and sacct's ``<id>+<k>`` component records are folded into ``<id>``.
  Folder: ``<chain_dir>/jobs/submitit``.
* ``sbatch``: a job script ``<chain_dir>/jobs/<n>.sbatch`` running
  ``srun [--het-group=..] --mpi=pmix <python> -u -m hpc_jabas.runtime.launch <chain_dir>/jobs/<n>.json``,
  submitted with ``sbatch --parsable``; its output goes to ``<chain_dir>/jobs/<n>-<jobid>.out``.

Callable from inside a running job (rank 0 resubmits at an epoch end): the submission's
environment drops the current job's SLURM_*/SBATCH_*/SRUN_* variables (SLURM_CONF kept) and,
inside a job, its MPI/PMIx/Horovod/submitit variables, so nothing of the old allocation (e.g.
``SLURM_JOB_NODELIST_HET_GROUP_1``) leaks into the next one.

Optional ``spec.extra`` keys: ``mem_per_task_mb`` (512), ``time_min`` (60), ``job_name``
("hpc-jabas"), ``account``, ``qos``, ``signal_delay_s`` (60), ``sbatch_args`` (list of extra
``--flag=value`` strings, every component).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpc_jabas.core.jobspec import JobSpec
from hpc_jabas.errors import ConfigError, JabasError, SlurmError
from hpc_jabas.slurm import chain as chainlog

METHODS = ("submitit", "sbatch")
ROOT = Path(__file__).resolve().parents[2]        # the directory holding the hpc_jabas package
SBATCH_TIMEOUT_S = 60.0
DEFAULT_MEM_PER_TASK_MB = 512
DEFAULT_TIME_MIN = 60
ROOT_VARS = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


# ---- the environment of a submission ----------------------------------------------------------
_SLURM_PREFIXES = ("SLURM_", "SLURMD_", "SBATCH_", "SALLOC_", "SRUN_", "SPANK_")
_JOB_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "HOROVOD_", "SUBMITIT_", "OPAL_", "ORTE_", "PRTE_")
_JOB_VARS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


def _inside_job(env: Mapping[str, str]) -> bool:
    return any(k in env for k in ("SLURM_JOB_ID", "SLURM_JOBID", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                                  "HOROVOD_RANK", "SUBMITIT_FOLDER"))


def submission_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for sbatch: the current one without the variables of the current job.

    Always dropped: SLURM_* (except SLURM_CONF), SLURMD_*, SBATCH_*, SALLOC_*, SRUN_*. Inside a job
    (or an MPI rank) also: OMPI_* (except OMPI_ALLOW_RUN_AS_ROOT*), PMIX_*, PMI_*, HOROVOD_*,
    SUBMITIT_* and the GPU visibility variables that Slurm set for this allocation.
    """
    env = dict(os.environ if env is None else env)
    inside = _inside_job(env)
    out = {}
    for k, v in env.items():
        if k == "SLURM_CONF":
            out[k] = v
            continue
        if k.startswith(_SLURM_PREFIXES):
            continue
        if inside and (k.startswith(_JOB_PREFIXES) or k in _JOB_VARS) and not k.startswith("OMPI_ALLOW_RUN_AS_ROOT"):
            continue
        out[k] = v
    return out


def _first_line(text: str | None) -> str:
    return next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")


def _require_sbatch(env: Mapping[str, str]) -> None:
    for cmd in ("sbatch", "srun"):
        if shutil.which(cmd, path=env.get("PATH")) is None:
            raise SlurmError(f"no Slurm here: {cmd} not found on PATH; install the Slurm client commands "
                             "(apt-get install slurm-client, or `module load slurm`), or start the local "
                             "cluster: slurm/local/up.sh && source slurm/local/env.sh")
    conf = env.get("SLURM_CONF")
    if conf and not os.path.exists(conf):
        raise SlurmError(f"Slurm controller unreachable: SLURM_CONF={conf} does not exist "
                         "(local cluster: slurm/local/up.sh && source slurm/local/env.sh)")


def run_sbatch(script: str | Path, env: Mapping[str, str], extra_args: list[str] | None = None) -> str:
    """``sbatch --parsable SCRIPT`` -> job id (the leader's for a heterogeneous job)."""
    args = ["sbatch", "--parsable", *(extra_args or []), str(script)]
    try:
        r = subprocess.run(args, capture_output=True, text=True, env=dict(env), timeout=SBATCH_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmError("no Slurm here: sbatch not found on PATH; "
                         "start the local cluster: slurm/local/up.sh") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"Slurm controller unreachable: sbatch gave no answer in {SBATCH_TIMEOUT_S:g} s") from None
    if r.returncode != 0:
        msg = _first_line(r.stderr) or _first_line(r.stdout) or f"exit {r.returncode}"
        raise SlurmError(f"sbatch refused {Path(script).name}: {msg}")
    jid = _first_line(r.stdout).split(";")[0].strip()
    if not re.fullmatch(r"\d+", jid):
        raise SlurmError(f"sbatch gave no job id for {Path(script).name}: {_first_line(r.stdout)!r} "
                         f"{_first_line(r.stderr)!r}")
    return jid


# ---- what each component asks for -------------------------------------------------------------
@dataclass(frozen=True)
class Component:
    """One partition of a mix: ntasks ranks, one GPU each, on `nodes` nodes."""
    partition: str
    ntasks: int
    nodes: int = 1
    gres_type: str | None = None      # the typed-GRES name on the partition's nodes ("a100"); None: untyped
    mem_mb: int = DEFAULT_MEM_PER_TASK_MB

    @property
    def gpu_spec(self) -> str:
        return f"{self.gres_type}:" if self.gres_type else ""

    def sbatch_options(self) -> dict[str, str]:
        """sbatch long options (name -> value) for this component."""
        o = {"partition": self.partition, "nodes": str(self.nodes), "ntasks": str(self.ntasks),
             "mem": f"{self.mem_mb}M"}
        if self.nodes == 1:
            o["gres"] = f"gpu:{self.gpu_spec}{self.ntasks}"
        else:
            o["gpus-per-task"] = f"{self.gpu_spec}1"
        return o

    def sbatch_line(self, more: Mapping[str, str] | None = None) -> str:
        """One ``#SBATCH`` line; ``more``: options every component repeats (time, account, qos)."""
        o = {**self.sbatch_options(), **dict(more or {})}
        return "#SBATCH " + " ".join(f"--{k}={shlex.quote(v)}" for k, v in o.items())


def _partition_view(partition_types=None):
    from hpc_jabas.slurm.cluster import read_cluster
    return read_cluster(partition_types)


def components(mix: Mapping[str, int], view=None, *, partition_types=None,
               mem_per_task_mb: int = DEFAULT_MEM_PER_TASK_MB) -> list[Component]:
    """One component per partition of the mix, sorted by partition name.

    ``view``: a :class:`hpc_jabas.slurm.cluster.ClusterView` (read from Slurm when None). Each component
    gets the partition's typed GPUs and the fewest nodes that hold its GPUs (largest node first).
    Unknown partitions, partitions without GPUs or counts above the partition's GPUs: ConfigError.
    """
    if not mix:
        raise ConfigError("empty mix; give partition -> GPU count, e.g. {'v100': 2}")
    if view is None:
        view = _partition_view(partition_types)
    out = []
    for part in sorted(mix):
        n = mix[part]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"mix {dict(mix)!r}: count {n!r} for {part!r} must be an integer >= 1")
        pv = view.partitions.get(part)
        if pv is None:
            raise ConfigError(f"unknown partition {part!r} in mix {dict(mix)!r}; partitions here: "
                              f"{', '.join(sorted(view.partitions)) or 'none'}")
        if not pv.gpus_total:
            raise ConfigError(f"partition {part!r} has no GPUs; GPU partitions here: "
                              f"{', '.join(sorted(p for p, v in view.partitions.items() if v.gpus_total)) or 'none'}")
        if n > pv.gpus_total:
            raise ConfigError(f"mix asks {n} GPUs of partition {part!r}, which has {pv.gpus_total} in all")
        per_node = sorted((view.nodes[nd].gpus_total for nd in pv.nodes if nd in view.nodes), reverse=True)
        nodes, held = 0, 0
        for g in per_node:
            if held >= n:
                break
            nodes += 1
            held += g
        nodes = max(1, nodes)
        gtype = pv.gres_types[0] if len(pv.gres_types) == 1 else None
        tasks_per_node = math.ceil(n / nodes)
        out.append(Component(part, n, nodes, gtype, int(mem_per_task_mb) * tasks_per_node))
    return out


def _extra(spec: JobSpec, key: str, default=None):
    return (spec.extra or {}).get(key, default)


def _per_component_options(spec: JobSpec) -> dict[str, str]:
    """Options each component of a heterogeneous job needs for itself."""
    o = {"time": str(int(_extra(spec, "time_min", DEFAULT_TIME_MIN)))}
    for k in ("account", "qos"):
        if _extra(spec, k):
            o[k] = str(_extra(spec, k))
    return o


def _extra_args(spec: JobSpec) -> list[str]:
    a = _extra(spec, "sbatch_args", []) or []
    if isinstance(a, str):
        a = shlex.split(a)
    return [str(x) for x in a]


def het_groups(comps: list[Component]) -> str:
    return ",".join(str(k) for k in range(len(comps)))


def _workdir(spec: JobSpec) -> Path:
    """Where the job runs: the submitter's directory, unless that is node-private (/tmp)."""
    cwd = Path.cwd().resolve()
    if str(cwd) == "/tmp" or str(cwd).startswith("/tmp/"):
        return Path(spec.chain_dir)
    return cwd


def job_pythonpath(spec: JobSpec) -> list[str]:
    """What the job puts first on PYTHONPATH: spec.pythonpath, the hpc_jabas root, its workdir."""
    paths = [str(Path(p).resolve()) for p in spec.pythonpath]
    for p in (str(ROOT), str(_workdir(spec))):
        if p not in paths:
            paths.append(p)
    return paths


#: Slurm 22.05: srun of a heterogeneous step can hang for ever in the PMIx plugin's abort agent
#: (pmixp_abort_agent_stop joining its thread) after every task has exited and slurmctld has
#: recorded the step COMPLETED; seen here about one run in eight. hj_srun runs srun in the
#: background and, once slurmctld lists no running step of this job for HJ_SRUN_GRACE_S, stops
#: it and returns the steps' own outcome (0 when every step of the job COMPLETED).
HJ_SRUN = r"""hj_srun() {
  "$@" &
  local pid=$! seen=0 gone=0 grace=${HJ_SRUN_GRACE_S:-6}
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -vqE '\.(batch|extern|interactive)$'; then
      seen=1; gone=0
    elif ((seen)); then
      gone=$((gone + 1))
      if ((gone >= grace)); then
        echo "hpc-jabas: srun still running ${grace} s after its step ended (Slurm het-step PMIx hang); stopping it" >&2
        kill "$pid" 2>/dev/null || true; sleep 1; kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
        sacct -n -P -j "$SLURM_JOB_ID" -o JobID,State | grep -E '\.[0-9]+\|' | grep -vq '|COMPLETED$' && return 1
        return 0
      fi
    fi
  done
  wait "$pid"
}"""


def _setup_lines(spec: JobSpec) -> list[str]:
    pp = ":".join(shlex.quote(p) for p in job_pythonpath(spec))
    return [f"export {k}={v}" for k, v in ROOT_VARS.items()] + [
        f'export PYTHONPATH={pp}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"',
        # Horovod's background thread polls MPI every cycle; on nodes with fewer cores than ranks
        # (the local emulated cluster) a busy-polling rank halves everyone's startup speed.
        'export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"',
        "export PYTHONUNBUFFERED=1",
        HJ_SRUN,
    ]


def _normalize(spec: JobSpec, method: str | None) -> JobSpec:
    method = method or spec.method
    if method not in METHODS:
        raise ConfigError(f"method {method!r} is unknown; valid: {', '.join(METHODS)}")
    return dataclasses.replace(spec, method=method, chain_dir=str(Path(spec.chain_dir).resolve()),
                               pythonpath=[str(Path(p).resolve()) for p in spec.pythonpath],
                               python=spec.python or sys.executable)


# ---- method "sbatch": a job script -------------------------------------------------------------
def render_sbatch(spec: JobSpec, comps: list[Component], spec_path: str | Path, output: str | Path) -> str:
    """Job script text: #SBATCH blocks (``#SBATCH hetjob`` between components), srun of launch."""
    lines = ["#!/bin/bash", f"# hpc-jabas chain {spec.chain_dir}: mix "
             + ", ".join(f"{c.partition}:{c.ntasks}" for c in comps)]
    lines.append(f"#SBATCH --job-name={shlex.quote(str(_extra(spec, 'job_name', 'hpc-jabas')))}")
    lines.append(f"#SBATCH --output={shlex.quote(str(output))}")
    lines.append(f"#SBATCH --chdir={shlex.quote(str(_workdir(spec)))}")
    for i, c in enumerate(comps):
        if i:
            lines.append("#SBATCH hetjob")
        lines.append(c.sbatch_line(_per_component_options(spec)))
        if _extra_args(spec):
            lines.append("#SBATCH " + " ".join(shlex.quote(a) for a in _extra_args(spec)))
    lines += _setup_lines(spec)
    het = [f"--het-group={het_groups(comps)}"] if len(comps) > 1 else []
    srun = ["srun", *het, "--mpi=pmix", "--kill-on-bad-exit=1", spec.python or sys.executable, "-u", "-m",
            "hpc_jabas.runtime.launch", str(spec_path)]
    lines.append(("hj_srun " if het else "") + " ".join(shlex.quote(a) for a in srun))
    return "\n".join(lines) + "\n"


def _next_job_file(jobs: Path) -> tuple[int, Path]:
    jobs.mkdir(parents=True, exist_ok=True)
    n = 1 + max((int(p.stem) for p in jobs.glob("*.sbatch") if p.stem.isdigit()), default=0)
    while True:
        p = jobs / f"{n}.sbatch"
        try:
            fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.close(fd)
            return n, p
        except FileExistsError:
            n += 1


def _submit_sbatch(spec: JobSpec, comps: list[Component], env: dict) -> tuple[str, Path]:
    jobs = Path(spec.chain_dir) / "jobs"
    n, script = _next_job_file(jobs)
    spec_path = spec.save(jobs / f"{n}.json")
    script.write_text(render_sbatch(spec, comps, spec_path, jobs / f"{n}-%j.out"))
    return run_sbatch(script, env), script


# ---- method "submitit": SlurmExecutor + heterogeneous jobs -------------------------------------
def _submitit():
    try:
        import submitit
        from submitit.slurm import slurm as sslurm
    except ImportError:
        raise ConfigError("method 'submitit' needs the submitit package (pip install submitit); "
                          "or use method='sbatch'") from None
    return submitit, sslurm


def _het_classes():
    """Built lazily (submitit is an optional import)."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    submitit, sslurm = _submitit()
    from submitit.core import utils as sutils

    class HetSlurmInfoWatcher(sslurm.SlurmInfoWatcher):
        """sacct lists a heterogeneous job as ``<id>+0``, ``<id>+1``...: fold them into ``<id>``."""

        def read_info(self, string):
            info = super().read_info(string)
            comps: dict[str, list[tuple[int, dict]]] = {}
            for key, stats in info.items():
                m = re.fullmatch(r"(\d+)\+(\d+)", key)
                if m:
                    comps.setdefault(m.group(1), []).append((int(m.group(2)), stats))
            for jid, items in comps.items():
                items.sort(key=lambda x: x[0])
                states = [s.get("State", "").split()[0] if s.get("State") else "" for _, s in items]
                merged = dict(items[0][1])
                merged["JobID"] = jid
                active = [s for s in states if s in ("PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED",
                                                     "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING")]
                bad = [s for s in states if s and s != "COMPLETED"]
                merged["State"] = active[0] if active else (bad[0] if bad else states[0])
                merged["NodeList"] = ",".join(s.get("NodeList", "") for _, s in items if s.get("NodeList"))
                info[jid] = merged
            return info

    class JabasSlurmJob(sslurm.SlurmJob):
        """submitit's SlurmJob; ``result()`` of a multi-rank job is global rank 0's result (the
        others return None from run_job); ``results()`` still gives every rank's."""
        watcher = HetSlurmInfoWatcher(delay_s=600)

        def result(self):
            if self._sub_jobs:
                return self.results()[0]
            return super().result()

    class JabasSlurmExecutor(submitit.SlurmExecutor):
        """submitit's SlurmExecutor for a mix of partitions.

        ``components``: one per partition. One component: the usual submitit job (its parameters
        set through ``update_parameters``). Several: a heterogeneous job; the first component's
        block is submitit's own (job name, time, signal, output files), the others follow after
        ``#SBATCH hetjob``, and the task runs as ``srun --het-group=0,..,k --mpi=pmix ... python -u
        -m submitit.core._submit <folder>`` with each rank writing its own ``<id>_<rank>_log.*``.
        ``env``: the environment sbatch runs in (default: :func:`submission_env`).
        """
        job_class = JabasSlurmJob

        def __init__(self, folder, components=(), env=None, python=None, max_num_timeout=0):
            super().__init__(folder, max_num_timeout=max_num_timeout, python=python)
            self.components = list(components)
            self.submit_env = submission_env() if env is None else dict(env)
            self.het_extra_lines: list[str] = []     # more #SBATCH lines for components 1..k
            self.het_options: dict[str, str] = {}    # options each component 1..k repeats (time, ...)

        def _num_tasks(self) -> int:
            if self.components:
                return sum(c.ntasks for c in self.components)
            return super()._num_tasks()

        def _het_srun_command(self) -> str:
            folder = shlex.quote(str(self.folder))
            log = f'{folder}/"$SLURM_JOB_ID"_"$SLURM_PROCID"_log'
            inner = f"exec {self.python} -u -m submitit.core._submit {folder} >>{log}.out 2>>{log}.err"
            srun_args = list(self.parameters.get("srun_args") or [])
            srun = ["srun", "--unbuffered", f"--het-group={het_groups(self.components)}", *srun_args]
            return "hj_srun " + " ".join(shlex.quote(a) for a in srun) + " bash -c " + shlex.quote(inner)

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            if len(self.components) <= 1:
                return super()._make_submission_file_text(command, uid)
            params = dict(self.parameters)
            params.pop("srun_args", None)
            text = sslurm._make_sbatch_string(command=self._het_srun_command(), folder=self.folder,
                                              use_srun=False, **params)
            lines = text.split("\n")
            last = max(i for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
            block = []
            for c in self.components[1:]:
                block += ["#SBATCH hetjob", c.sbatch_line(self.het_options), *self.het_extra_lines]
            return "\n".join(lines[:last + 1] + block + lines[last + 1:])

        def _submit_command(self, command: str):
            """submitit's _submit_command, with sbatch run in the clean submission environment."""
            import uuid
            tmp_uuid = uuid.uuid4().hex
            folder = sutils.JobPaths.get_first_id_independent_folder(self.folder)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f".submission_file_{tmp_uuid}.sh"
            path.write_text(self._make_submission_file_text(command, tmp_uuid))
            job_id = run_sbatch(path, self.submit_env)
            job = self.job_class(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
            job.paths.move_temporary_file(path, "submission_file", keep_as_symlink=True)
            self._write_job_id(job.job_id, tmp_uuid)
            self._set_job_permissions(job.paths.folder)
            return job

    _CLASSES = (JabasSlurmExecutor, JabasSlurmJob, HetSlurmInfoWatcher)
    return _CLASSES


_CLASSES = None


def make_executor(spec: JobSpec, comps: list[Component], env: dict | None = None):
    """A configured :class:`JabasSlurmExecutor` for the spec's mix (folder <chain_dir>/jobs/submitit)."""
    Executor = _het_classes()[0]
    folder = Path(spec.chain_dir) / "jobs" / "submitit"
    folder.mkdir(parents=True, exist_ok=True)
    ex = Executor(folder, components=comps, env=env, python=shlex.quote(spec.python or sys.executable))
    c0 = comps[0]
    add: dict[str, object] = {"chdir": str(_workdir(spec))}
    for k in ("account", "qos"):
        if _extra(spec, k):
            add[k] = str(_extra(spec, k))
    for a in _extra_args(spec):
        k, _, v = a.lstrip("-").partition("=")
        add[k] = v if v else True
    params = dict(partition=c0.partition, mem=f"{c0.mem_mb}M", nodes=c0.nodes,
                  srun_args=["--mpi=pmix", "--kill-on-bad-exit=1"],
                  signal_delay_s=int(_extra(spec, "signal_delay_s", 60)),
                  time=int(_extra(spec, "time_min", DEFAULT_TIME_MIN)),
                  job_name=str(_extra(spec, "job_name", "hpc-jabas")), setup=_setup_lines(spec))
    if c0.nodes == 1:
        params.update(ntasks_per_node=c0.ntasks, gres=f"gpu:{c0.gpu_spec}{c0.ntasks}")
    else:
        add.update({"ntasks": str(c0.ntasks), "gpus-per-task": f"{c0.gpu_spec}1"})
    params["additional_parameters"] = add
    ex.update_parameters(**params)
    ex.het_options = _per_component_options(spec)
    if _extra_args(spec):
        ex.het_extra_lines = ["#SBATCH " + " ".join(shlex.quote(a) for a in _extra_args(spec))]
    return ex


def _submit_submitit(spec: JobSpec, comps: list[Component], env: dict):
    from hpc_jabas.runtime.launch import run_job
    return make_executor(spec, comps, env).submit(run_job, spec)


# ---- entry points -----------------------------------------------------------------------------
@dataclass
class Submission:
    job_id: str
    method: str
    mix: dict
    job: object = None            # the submitit Job (method submitit)
    script: Path | None = None    # the job script (method sbatch)


def submit(spec: JobSpec, *, method: str | None = None, view=None, env: Mapping[str, str] | None = None) -> Submission:
    """Submit ``run_job(spec)`` onto ``spec.mix``; append a ``submit`` event to the chain."""
    spec = _normalize(spec, method)
    env = submission_env(env)
    _require_sbatch(env)
    pt = (spec.config.get("autoscale") or {}).get("partition_types") if isinstance(spec.config, dict) else None
    if view is None:
        view = _partition_view(pt)
    mem = int(_extra(spec, "mem_per_task_mb", DEFAULT_MEM_PER_TASK_MB))
    comps = components(spec.mix, view, mem_per_task_mb=mem)
    spec = dataclasses.replace(spec, mix={c.partition: c.ntasks for c in comps})
    job, script = None, None
    if spec.method == "submitit":
        try:
            job = _submit_submitit(spec, comps, env)
        except JabasError:
            raise
        except Exception as e:   # submitit's own errors (bad parameters, submission failures)
            raise SlurmError(f"submitit could not submit the job: {_first_line(str(e)) or type(e).__name__}") from None
        job_id = str(job.job_id)
    else:
        job_id, script = _submit_sbatch(spec, comps, env)
    inside = os.environ.get("SLURM_HET_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    chainlog.append(spec.chain_dir, "submit", job_id=job_id, mix=spec.mix, method=spec.method,
                    by=f"job {inside}" if inside else "user",
                    script=str(script) if script else str(job.paths.submission_file))
    return Submission(job_id, spec.method, dict(spec.mix), job=job, script=script)


def submit_job(spec: JobSpec, *, method: str | None = None) -> str:
    """Submit ``hpc_jabas.runtime.launch.run_job(spec)`` onto ``spec.mix``; returns the (leader) job id."""
    return submit(spec, method=method).job_id


def submitit_job(chain_dir: str | Path, job_id: str):
    """The submitit Job object of a chain's job submitted with method submitit (e.g. by rank 0 of an
    earlier job): ``.result()``, ``.state``, ``.stdout()`` as usual."""
    JabasSlurmJob = _het_classes()[1]
    folder = Path(chain_dir).resolve() / "jobs" / "submitit"
    ev = [e for e in chainlog.read(chain_dir) if e.get("event") == "submit" and str(e.get("job_id")) == str(job_id)]
    if not ev or ev[-1].get("method") != "submitit":
        raise ConfigError(f"job {job_id} was not submitted with submitit in chain {str(chain_dir)!r}")
    n = sum(int(v) for v in (ev[-1].get("mix") or {}).values())
    return JabasSlurmJob(folder=folder, job_id=str(job_id), tasks=list(range(max(1, n))))


def parse_mix(text: str) -> dict[str, int]:
    """'a100:1,v100:2' -> {'a100': 1, 'v100': 2}."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        part, sep, n = item.partition(":")
        if not sep or not part or not n.strip().isdigit() or int(n) < 1:
            raise ConfigError(f"mix {text!r} is invalid: {item!r} must be PARTITION:COUNT with COUNT >= 1, "
                              "e.g. a100:1,v100:2")
        if part in out:
            raise ConfigError(f"mix {text!r} names partition {part!r} twice")
        out[part.strip()] = int(n)
    if not out:
        raise ConfigError(f"mix {text!r} is empty; give PARTITION:COUNT[,...], e.g. a100:1,v100:2")
    return dict(sorted(out.items()))


# ---- following a chain ------------------------------------------------------------------------
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                      "BOOT_FAIL", "DEADLINE", "REVOKED"})


def sacct_states(job_ids, env: Mapping[str, str] | None = None) -> dict[str, dict]:
    """sacct's view of jobs: id -> {State, Start, End, Partition, NodeList}; a heterogeneous job's
    ``<id>+<k>`` components are folded into ``<id>`` (state: a failed/active component wins;
    Start: the earliest, End: the latest; Partition: comma-joined). SlurmError when sacct fails."""
    ids = sorted({str(j) for j in job_ids if str(j).strip()})
    if not ids:
        return {}
    env = dict(os.environ if env is None else env)
    if shutil.which("sacct", path=env.get("PATH")) is None:
        raise SlurmError("no Slurm here: sacct not found on PATH")
    args = ["sacct", "-X", "-n", "-P", "-o", "JobID,State,Start,End,Partition,NodeList", "-j", ",".join(ids)]
    try:
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=30)
    except subprocess.TimeoutExpired:
        raise SlurmError("sacct gave no answer in 30 s") from None
    if r.returncode != 0:
        raise SlurmError(f"sacct failed: {_first_line(r.stderr) or r.returncode}")
    comps: dict[str, list[tuple[int, dict]]] = {}
    for ln in r.stdout.splitlines():
        cols = ln.split("|")
        if len(cols) < 6 or not cols[0].strip():
            continue
        jid, _, k = cols[0].strip().partition("+")
        if "." in jid or "_" in jid:
            continue
        rec = {"State": (cols[1].split() or [""])[0], "Start": cols[2], "End": cols[3], "Partition": cols[4],
               "NodeList": cols[5]}
        comps.setdefault(jid, []).append((int(k) if k.isdigit() else 0, rec))
    out = {}
    for jid, items in comps.items():
        items.sort(key=lambda x: x[0])
        states = [rec["State"] for _, rec in items]
        active = [s for s in states if s not in TERMINAL]
        bad = [s for s in states if s != "COMPLETED"]
        starts = [rec["Start"] for _, rec in items if rec["Start"] not in ("Unknown", "None", "")]
        ends = [rec["End"] for _, rec in items if rec["End"] not in ("Unknown", "None", "")]
        out[jid] = {"State": active[0] if active else (bad[0] if bad else states[0]),
                    "Start": min(starts) if starts else "Unknown",
                    "End": max(ends) if ends and not active else "Unknown",
                    "Partition": ",".join(rec["Partition"] for _, rec in items),
                    "NodeList": ",".join(rec["NodeList"] for _, rec in items),
                    "components": len(items)}
    return out


def wait_chain(chain_dir: str | Path, job_id: str, timeout: float | None = None, poll_s: float = 1.0,
               on_event=None, grace_s: float = 10.0) -> dict:
    """Follow a chain from ``job_id`` through its moves until a job finishes the training or fails.

    Returns {"ok": bool, "job_id": last job, "state": "finished" | Slurm state | "timeout",
    "jobs": [ids followed]}. ``on_event(e)`` sees every new chain event.
    """
    import time
    t0 = time.time()
    cur, jobs, seen, terminal_since = str(job_id), [str(job_id)], 0, None
    while True:
        ev = chainlog.read(chain_dir)
        if on_event:
            for e in ev[seen:]:
                on_event(e)
        seen = len(ev)
        end = next((e for e in ev if e["event"] == "end" and str(e.get("job_id")) == cur), None)
        mv = next((e for e in ev if e["event"] == "move" and str(e.get("from_job")) == cur), None)
        if end is not None and end.get("state") == "finished":
            return {"ok": True, "job_id": cur, "state": "finished", "jobs": jobs}
        if mv is not None and end is not None:
            cur, terminal_since = str(mv["to_job"]), None
            jobs.append(cur)
            continue
        try:
            st = sacct_states([cur]).get(cur, {}).get("State", "")
        except SlurmError:
            st = ""
        if st in TERMINAL:
            terminal_since = terminal_since or time.time()
            if time.time() - terminal_since > grace_s:   # the end event would be there by now
                return {"ok": False, "job_id": cur, "state": st, "jobs": jobs}
        if timeout is not None and time.time() - t0 > timeout:
            return {"ok": False, "job_id": cur, "state": "timeout", "jobs": jobs}
        time.sleep(poll_s)
