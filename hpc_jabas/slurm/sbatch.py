"""The job scripts hpc-jabas writes, pure text: nothing here runs a command.

* :func:`render_sbatch`: the job script of method "sbatch": ``#SBATCH`` blocks (``#SBATCH hetjob``
  between components, ``--signal=B:USR1@<signal_lead_s>``), the set-up lines, the signal traps
  (:data:`HJ_TRAPS`), and ``hj_srun srun [--het-group=0,..,k] --mpi=pmix <python> -u -m
  hpc_jabas.runtime.job.launch SPEC.json``.
* :func:`het_block` and :func:`het_srun_python`: what method "submitit" adds to submitit's own script
  for a heterogeneous job (components 1..k, and the srun line of the het step).
* :func:`submission_env`: the environment sbatch runs in: the current one without the variables of
  the current job, so nothing of an old allocation (``SLURM_JOB_NODELIST_HET_GROUP_1``...) leaks into
  the next one when rank 0 resubmits from inside a job.

The job's entry point is named by a string, :data:`JOB_ENTRY`, and imported only inside the job:
the Slurm layer imports nothing of ``hpc_jabas.runtime``.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.core.config.sections import flatten
from hpc_jabas.errors import ConfigError
from hpc_jabas.slurm.components import (
    Component,
    SlurmOptions,
    extra_args,
    het_groups,
    per_component_options,
    slurm_option,
)
from hpc_jabas.slurm.env import SlurmEnv
from hpc_jabas.trust import TRUST_GROUP_ENV, refuse_control_chars

METHODS = ("submitit", "sbatch")
ROOT = Path(__file__).resolve().parents[2]        # the directory holding the hpc_jabas package
#: what every rank of a job runs, "module:callable" (the module also runs as ``python -m module SPEC``)
JOB_ENTRY = "hpc_jabas.runtime.job.launch:run_job"
ROOT_VARS = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
SRUN_ARGS = ("--mpi=pmix", "--kill-on-bad-exit=1")


# ---- the environment of a submission ----------------------------------------------------------
_JOB_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "HOROVOD_", "SUBMITIT_", "OPAL_", "ORTE_", "PRTE_")
_JOB_VARS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


def inside_job(env: Mapping[str, str]) -> bool:
    """The environment is a Slurm job's or an MPI rank's."""
    return SlurmEnv(env).inside or any(k in env for k in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "HOROVOD_RANK",
                                                          "SUBMITIT_FOLDER"))


def submission_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for sbatch: the current one without the variables of the current job.

    Always dropped: SLURM_* (except SLURM_CONF), SLURMD_*, SBATCH_*, SALLOC_*, SRUN_*. Inside a job
    (or an MPI rank) also: OMPI_* (except OMPI_ALLOW_RUN_AS_ROOT*), PMIX_*, PMI_*, HOROVOD_*,
    SUBMITIT_* and the GPU visibility variables that Slurm set for this allocation.
    """
    env = dict(os.environ if env is None else env)
    inside = inside_job(env)
    out = {}
    for k, v in env.items():
        if SlurmEnv.job_variable(k):            # SLURM_* but SLURM_CONF, SLURMD_*, SBATCH_*, ... (slurm/env.py)
            continue
        if inside and (k.startswith(_JOB_PREFIXES) or k in _JOB_VARS) and not k.startswith("OMPI_ALLOW_RUN_AS_ROOT"):
            continue
        out[k] = v
    return out


# ---- where and how the job runs ---------------------------------------------------------------
def workdir(spec: JobSpec) -> Path:
    """Where the job runs: the submitter's directory, unless that is node-private (/tmp)."""
    cwd = Path.cwd().resolve()
    if str(cwd) == "/tmp" or str(cwd).startswith("/tmp/"):
        return Path(spec.chain_dir)
    return cwd


def job_pythonpath(spec: JobSpec) -> list[str]:
    """What the job puts first on PYTHONPATH: spec.pythonpath, the hpc_jabas root, its workdir."""
    paths = [str(Path(p).resolve()) for p in spec.pythonpath]
    for p in (str(ROOT), str(workdir(spec))):
        if p not in paths:
            paths.append(p)
    return paths


def normalize(spec: JobSpec, method: str | None) -> JobSpec:
    """The spec with its method checked and its paths and interpreter made absolute. Every path and name that
    goes into a job script (chain_dir, pythonpath, python, the working directory, job_name) is refused in one
    line when it holds a control character: a newline would end the ``# hpc-jabas chain ...`` comment or an
    ``#SBATCH`` line and start a shell command."""
    method = method or spec.method
    if method not in METHODS:
        raise ConfigError(f"method {method!r} is unknown; valid: {', '.join(METHODS)}")
    refuse_control_chars(str(spec.chain_dir), "chain_dir")
    for p in spec.pythonpath:
        refuse_control_chars(str(p), "pythonpath entry")
    refuse_control_chars(spec.python or sys.executable, "python")
    out = dataclasses.replace(spec, method=method, chain_dir=str(Path(spec.chain_dir).resolve()),
                              pythonpath=[str(Path(p).resolve()) for p in spec.pythonpath],
                              python=spec.python or sys.executable)
    refuse_control_chars(str(out.chain_dir), "chain_dir (resolved)")
    refuse_control_chars(str(workdir(out)), "the working directory")
    refuse_control_chars(SlurmOptions.of(out).job_name, "job_name")
    return out


#: Slurm 22.05: srun of a heterogeneous step can hang for ever in the PMIx plugin's abort agent
#: (pmixp_abort_agent_stop joining its thread) after every task has exited and slurmctld has
#: recorded the step COMPLETED; seen here about one run in twelve. hj_srun runs srun in the
#: background and, once slurmctld lists no running step of this job for HJ_SRUN_GRACE_S, stops
#: it and returns the steps' own outcome from sacct: 0 when every step of the job COMPLETED, 1 when
#: one did not, and 1 too when sacct cannot tell within HJ_SRUN_ACCT_S (never a guessed success).
HJ_SRUN = r"""hj_srun() {
  "$@" &
  local pid=$! seen=0 gone=0 grace=${HJ_SRUN_GRACE_S:-6} rows i
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -vqE '\.(batch|extern|interactive)$'; then
      seen=1; gone=0
    elif ((seen)); then
      gone=$((gone + 1))
      if ((gone >= grace)); then
        echo "hpc-jabas: srun still running ${grace} s after its step ended (Slurm het-step PMIx hang); stopping it" >&2
        kill "$pid" 2>/dev/null || true; sleep 1; kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
        for ((i = 0; i < ${HJ_SRUN_ACCT_S:-20}; i++)); do
          rows=$(sacct -n -P -j "$SLURM_JOB_ID" -o JobID,State 2>/dev/null | grep -E '\.[0-9]+\|') || rows=""
          if [[ -n $rows ]] && ! grep -qE '\|(PENDING|RUNNING|COMPLETING|SUSPENDED|REQUEUED)' <<<"$rows"; then
            grep -vq '|COMPLETED$' <<<"$rows" && return 1
            return 0
          fi
          sleep 1
        done
        echo "hpc-jabas: sacct does not tell how the steps of job $SLURM_JOB_ID ended; counting it as failed" >&2
        return 1
      fi
    fi
  done
  wait "$pid"
}"""


#: The batch shell of a method-"sbatch" job: Slurm's ``--signal=B:USR1@<lead>`` (time limit) reaches only the
#: batch shell, which passes it on to every rank (``scancel --signal`` reaches the steps, not the batch shell:
#: no loop); a TERM (preemption, scancel) reaches the steps from Slurm itself, and the trap keeps the shell
#: alive meanwhile so that the ranks can checkpoint. The srun runs in the background (``hj_srun``): bash runs a
#: trap only between commands.
HJ_TRAPS = r"""hj_forward() { scancel --signal="$1" "$SLURM_JOB_ID" >/dev/null 2>&1 || true; }
trap 'hj_forward USR1' USR1
trap 'hj_forward USR2' USR2
trap 'hj_forward TERM' TERM"""


def setup_lines(spec: JobSpec) -> list[str]:
    """Shell lines every job script runs before its srun (environment, the hj_srun function)."""
    pp = ":".join(shlex.quote(p) for p in job_pythonpath(spec))
    return [f"export {k}={v}" for k, v in ROOT_VARS.items()] + [
        f'export PYTHONPATH={pp}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"',
        # Horovod's background thread polls MPI every cycle; on nodes with fewer cores than ranks
        # (the local emulated cluster) a busy-polling rank halves everyone's startup speed.
        'export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"',
        "export PYTHONUNBUFFERED=1",
        # a hung rank: Horovod warns after 60 s and shuts the job down after 300 s (it then fails and the
        # chain resubmits it from the last checkpoint) instead of holding the allocation for ever
        'export HOROVOD_STALL_CHECK_TIME_SECONDS="${HOROVOD_STALL_CHECK_TIME_SECONDS:-60}"',
        'export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="${HOROVOD_STALL_SHUTDOWN_TIME_SECONDS:-300}"',
        HJ_SRUN,
    ] + ([f"export {TRUST_GROUP_ENV}=1"] if _trusts_group(spec) else [])


def _trusts_group(spec: JobSpec) -> bool:
    """The job's ``trust_group = true``: its launcher then accepts the group-writable job spec and chain record it
    reads before the config (hpc_jabas/trust.py). The script is the user's, written by submit; Slurm keeps a copy."""
    cfg = spec.config if isinstance(spec.config, Mapping) else {}
    return flatten(cfg)[0].get("trust_group") is True


# ---- #SBATCH blocks ---------------------------------------------------------------------------
def component_lines(spec: JobSpec, comp: Component) -> list[str]:
    """The ``#SBATCH`` lines of one component: its own options, then ``sbatch_args`` (if any)."""
    lines = [comp.sbatch_line(per_component_options(spec))]
    if extra_args(spec):
        lines.append("#SBATCH " + " ".join(shlex.quote(a) for a in extra_args(spec)))
    return lines


def het_block(spec: JobSpec, comps: Sequence[Component]) -> list[str]:
    """``#SBATCH hetjob`` + the lines of each of ``comps`` (the components after the first)."""
    out: list[str] = []
    for c in comps:
        out += ["#SBATCH hetjob", *component_lines(spec, c)]
    return out


def render_sbatch(spec: JobSpec, comps: list[Component], spec_path: str | Path, output: str | Path) -> str:
    """Job script text (method "sbatch"): #SBATCH blocks, set-up lines, srun of the job entry module."""
    lines = ["#!/bin/bash", f"# hpc-jabas chain {spec.chain_dir}: mix "
             + ", ".join(f"{c.partition}:{c.ntasks}" for c in comps)]
    lines.append(f"#SBATCH --job-name={shlex.quote(SlurmOptions.of(spec).job_name)}")
    lines.append(f"#SBATCH --output={shlex.quote(str(output))}")
    lines.append(f"#SBATCH --chdir={shlex.quote(str(workdir(spec)))}")
    lines.append(f"#SBATCH --signal=B:USR1@{slurm_option(spec, 'signal_lead_s')}")
    lines += component_lines(spec, comps[0]) + het_block(spec, comps[1:])
    lines += setup_lines(spec) + HJ_TRAPS.splitlines()
    het = [f"--het-group={het_groups(comps)}"] if len(comps) > 1 else []
    srun = ["srun", *het, *SRUN_ARGS, spec.python or sys.executable, "-u", "-m",
            JOB_ENTRY.partition(":")[0], str(spec_path)]
    # a failed step (a killed rank, a lost node): the batch shell resubmits from the last good checkpoint
    lines.append("hj_srun " + shlex.join(srun) + ' || { rc=$?; ' + after_failure(spec, spec_path) + '; exit "$rc"; }')
    return "\n".join(lines) + "\n"


def after_failure(spec: JobSpec, spec_path: str | Path, rc: str = '"$rc"') -> str:
    """The batch shell's command after a failed step: ``<python> -u -m hpc_jabas.runtime.job.launch --after-failure
    RC SPEC`` (resubmits from the last good checkpoint, bounded, backoff, failed nodes excluded)."""
    after = [spec.python or sys.executable, "-u", "-m", JOB_ENTRY.partition(":")[0], "--after-failure"]
    return shlex.join(after) + f" {rc} " + shlex.quote(str(spec_path))


def failure_teardown(spec: JobSpec, spec_path: str | Path) -> list[str]:
    """What method "submitit" adds after submitit's own srun line (its ``teardown``): the same recovery as
    a method-"sbatch" job script, keeping the step's exit status as the job's."""
    return ['hj_rc=$?', 'if [ "$hj_rc" -ne 0 ]; then ' + after_failure(spec, spec_path, '"$hj_rc"') + '; fi',
            'exit "$hj_rc"']


def het_srun_python(comps: Sequence[Component], python: str, folder: str | Path,
                    srun_args: Sequence[str] = SRUN_ARGS) -> str:
    """The "python" command that submitit runs for a heterogeneous job (``use_srun=False``):
    ``hj_srun srun --unbuffered --het-group=0,..,k <srun_args> bash -c '<exec, logs per rank>' <python>``;
    the executor appends ``-u -m hpc_jabas.slurm.node_entry <folder>`` (executor.py). Each rank writes its own
    ``<folder>/<job id>_<global rank>_log.{out,err}``, the names submitit reads (srun's ``%t`` in a
    het step is the rank inside the component, not the global one). ``python``: one shell word."""
    log = shlex.quote(str(folder)) + '/"$SLURM_JOB_ID"_"$SLURM_PROCID"_log'
    inner = f'exec "$0" "$@" >>{log}.out 2>>{log}.err'
    srun = ["srun", "--unbuffered", f"--het-group={het_groups(list(comps))}", *srun_args]
    return f"hj_srun {shlex.join(srun)} bash -c {shlex.quote(inner)} {python}"
