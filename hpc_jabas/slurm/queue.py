"""Expected queue wait of a candidate mix, asked of Slurm itself: ``sbatch --test-only``.

``sbatch --test-only`` submits nothing: the controller answers when and where a job with these options
would start, e.g. (on stderr)::

    sbatch: Job 123 to start at 2026-12-01T10:00:00 using 4 processors on nodes gpuv1 in partition v100

A heterogeneous job (one component per partition of the mix, ``:`` between them) prints one such line
per component and starts when its last component does. The job options are those the chain's real
job gets (:mod:`hpc_jabas.slurm.components`: partition, nodes, tasks, typed GPUs, memory, time limit,
account, qos, the user's sbatch_args), so the estimate accounts for the same limits. A mix that Slurm
refuses (more GPUs than the partition has, a limit) has no start: None. The parsing is pure
(:func:`parse_test_only`).
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.errors import ConfigError, SlurmError
from hpc_jabas.log import get_logger
from hpc_jabas.slurm import proc
from hpc_jabas.slurm.cluster import ClusterView
from hpc_jabas.slurm.components import (
    DEFAULT_MEM_PER_TASK_MB,
    components,
    extra_args,
    per_component_options,
    slurm_option,
)
from hpc_jabas.slurm.sbatch import submission_env

log = get_logger(__name__)

_START = re.compile(r"Job\s+(?P<job>\d+)\s+to\s+start\s+at\s+(?P<start>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)"
                    r"(?:\s+using\s+(?P<procs>\d+)\s+processors)?(?:\s+on\s+nodes?\s+(?P<nodes>\S+))?"
                    r"(?:\s+in\s+partition\s+(?P<part>\S+))?")
SCRIPT = "#!/bin/sh\ntrue\n"


@dataclass(frozen=True)
class StartEstimate:
    """One ``to start at`` line: job id, start (Slurm's local time, ISO), processors, nodes, partition."""
    job: str
    start: str
    processors: int | None = None
    nodes: str | None = None
    partition: str | None = None


def parse_test_only(text: str) -> list[StartEstimate]:
    """Every ``Job N to start at T ...`` line of ``sbatch --test-only`` output, in order."""
    out = []
    for m in _START.finditer(text or ""):
        out.append(StartEstimate(m.group("job"), m.group("start"),
                                 int(m.group("procs")) if m.group("procs") else None, m.group("nodes"),
                                 m.group("part")))
    return out


def start_epoch(start: str) -> float:
    """Slurm's '2026-12-01T10:00:00' (the controller's local time zone, as here) -> epoch seconds."""
    return time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))


def wait_from_output(text: str, now: float) -> float | None:
    """Seconds from ``now`` until the last component starts (0 when it could start now); None: no estimate."""
    est = parse_test_only(text)
    if not est:
        return None
    return max(0.0, max(start_epoch(e.start) for e in est) - now)


def test_only_args(mix: Mapping[str, int], view: ClusterView, spec: JobSpec | None = None) -> list[str]:
    """``sbatch --test-only`` with the options of the chain's job on ``mix``, components split by ':'."""
    comps = components(dict(mix), view, mem_per_task_mb=slurm_option(spec, "mem_per_task_mb")
                       if spec is not None else DEFAULT_MEM_PER_TASK_MB)
    more = per_component_options(spec) if spec is not None else {}
    user = extra_args(spec) if spec is not None else []        # sbatch_args: every component, as in the job
    args = ["sbatch", "--test-only", "--job-name=hpc-jabas-probe"]
    for k, c in enumerate(comps):
        if k:
            args.append(":")
        args += [f"--{o}={v}" for o, v in {**c.sbatch_options(), **more}.items()] + user
    return args


def expected_wait(mix: Mapping[str, int], view: ClusterView, spec: JobSpec | None = None,
                  env: Mapping[str, str] | None = None, now: float | None = None) -> float | None:
    """Expected queue wait (s) of a job on ``mix`` with the chain's options; None when Slurm gives no start
    (it refuses the job, or prints no estimate). SlurmError when Slurm cannot be asked at all. sbatch runs in
    :func:`hpc_jabas.slurm.sbatch.submission_env` (nothing of the current job's allocation leaks in)."""
    try:
        args = test_only_args(mix, view, spec)
    except ConfigError as e:
        log.info("no queue estimate for %s: %s", dict(mix), e)
        return None
    rc, out, err = proc.run_status(args, submission_env(env), stdin=SCRIPT)
    t0 = time.time() if now is None else now
    wait = wait_from_output(err + "\n" + out, t0)
    if rc != 0 or wait is None:
        log.info("no queue estimate for %s: %s", dict(mix), proc.first_line(err) or f"exit {rc}")
        return None
    return wait


def wait_estimator(view: ClusterView, spec: JobSpec | None = None,
                   env: Mapping[str, str] | None = None) -> Callable[[dict[str, int]], float | None]:
    """``wait_fn`` for ``mixsearch.search`` / ``scaler.choose``: :func:`expected_wait` on this view. A
    Slurm that cannot be asked (SlurmError) gives no estimate (None: the mix is not chosen)."""
    def wait_fn(mix: dict[str, int]) -> float | None:
        try:
            return expected_wait(mix, view, spec, env)
        except SlurmError as e:
            log.warning("queue estimate failed for %s: %s", mix, e)
            return None
    return wait_fn


def capacity(view: ClusterView, available: Mapping[str, int]) -> dict[str, int]:
    """partition -> GPUs a queued job could get once running jobs end: every GPU on the partition's nodes
    that can take a job (not down, drained, ...), at least ``available`` (free now plus this job's own).
    The candidates of a queue-aware decision: the queue wait, not the free count, says when they start."""
    out = dict(available)
    for p in available:
        pv = getattr(view, "partitions", {}).get(p)
        if pv is None or pv.state != "up":
            continue
        usable = sum(view.nodes[n].gpus_total for n in pv.nodes if n in view.nodes and view.nodes[n].usable)
        out[p] = max(out[p], usable)
    return out
