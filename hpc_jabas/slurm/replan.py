"""A chain's job that pends on nodes that are not there (drained, down): cancel it and re-plan its mix.

Whoever waits on a chain (``wait_chain``: ``hpc-jabas submit --wait``, ``hpc-jabas status --wait``, the tests
and benchmarks) calls :meth:`PendingWatch.check` on the job it follows while Slurm keeps it PENDING. The job is
stuck when a partition of its mix cannot hold it on nodes that can take a job (drained, draining, down,
failing...; :mod:`hpc_jabas.slurm.cluster`), or when squeue's reason says its nodes are not available
(ReqNodeNotAvail, PartitionDown, NodeDown...; then the partitions of the named nodes). A stuck job is
cancelled only while still pending (``scancel --state=PENDING``) and its successor is submitted onto the
next-best feasible mix without those partitions (:func:`hpc_jabas.core.autoscale.scaler.replan`: the ranking of the
decision that chose the mix, from the run's metrics; else the most GPUs at the lowest rate). The successor
resumes from the same checkpoint: nothing is dropped. Chain event ``replan`` (from_job, to_job, mix,
excluded, reason, checkpoint_time and ``queued_since``: the queue wait runs from the first submission,
apart from the restart overhead). When no mix is feasible the job stays queued (it starts once its nodes
return), a ``replan_wait`` event and a log line say so, and the next check comes after a backoff
(:func:`backoff_s`).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.config import jsonl
from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.errors import JabasError, SlurmError
from hpc_jabas.log import get_logger
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.slurm import proc
from hpc_jabas.slurm.cluster import read_cluster
from hpc_jabas.slurm.text import expand_hostlist
from hpc_jabas.trust import check_file

log = get_logger(__name__)
#: squeue reasons meaning the job's nodes are not there (Slurm 22.05 names; the head before any ',' or ':')
UNAVAILABLE_REASONS = ("ReqNodeNotAvail", "PartitionDown", "PartitionInactive", "NodeDown", "PartitionNodeLimit",
                       "Nodes_required_for_job_are_DOWN", "BadConstraints")
#: a pending job is first checked after this long (Slurm's scheduler needs a pass to give a reason)
FIRST_CHECK_S = 5.0


def backoff_s(attempt: int) -> float:
    """Seconds before the next check after the ``attempt``-th time no mix was feasible (1, 2, ...)."""
    return min(300.0, 10.0 * 2 ** max(0, attempt - 1))


def pending_info(job_id: str, env: Mapping[str, str] | None = None) -> tuple[str | None, list[str]]:
    """(state, reasons) of a job from squeue (every component of a heterogeneous job); (None, []) when
    squeue does not list it."""
    try:
        text = proc.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%r"], env, timeout=15)
    except SlurmError:
        return None, []
    states, reasons = [], []
    for ln in text.splitlines():
        st, _, why = ln.partition("|")
        if st.strip():
            states.append(st.strip())
            reasons.append(why.strip())
    if not states:
        return None, []
    return ("PENDING" if all(s == "PENDING" for s in states) else states[0]), reasons


def stuck_partitions(mix: Mapping[str, int], view: Any, reasons: list[str]) -> list[str]:
    """The partitions of ``mix`` the job cannot get now: fewer GPUs on nodes that can take a job than it asks
    for (or the partition is not up); when none is, those an unavailable-node reason names (by its
    UnavailableNodes, else every partition of the mix). Pure."""
    out = []
    for part, n in mix.items():
        pv = view.partitions.get(part)
        if pv is None or pv.state != "up":
            out.append(part)
            continue
        cap = sum(view.nodes[x].gpus_total for x in pv.nodes if x in view.nodes and view.nodes[x].usable)
        if cap < int(n):
            out.append(part)
    if out:
        return sorted(out)
    for why in reasons:      # the nodes look usable, but Slurm says they are not there (reservation, race)
        head = why.split(",")[0].split(":")[0].strip().strip("()").replace(" ", "_")
        if head not in UNAVAILABLE_REASONS:
            continue
        named = why.partition("UnavailableNodes:")[2].strip().strip("()")
        nodes = set(expand_hostlist(named)) if named else set()
        for part in mix:
            pv = view.partitions.get(part)
            hit = not nodes or (pv is not None and nodes & set(pv.nodes))
            if hit and part not in out and (nodes or head not in ("ReqNodeNotAvail", "PartitionNodeLimit")):
                out.append(part)
    return sorted(out)


def _spec_of(chain_dir: str | Path, job_id: str, events: list[dict]) -> JobSpec | None:
    sub = next((e for e in reversed(events) if e.get("event") == "submit" and str(e.get("job_id")) == str(job_id)),
               None)
    p = (sub or {}).get("spec")
    if not p or not Path(p).exists():
        return None
    check_file(p, "job spec")           # the successor is built from it
    return JobSpec.load(p)


def _last_table(spec: JobSpec, mix: Mapping[str, int]) -> list[dict] | None:
    """The priced candidates of the last decision that chose ``mix`` (the run's metrics.jsonl)."""
    p = Path(spec.run_dir) / "metrics.jsonl"
    if not p.exists():
        return None
    check_file(p, "metrics record")     # its priced table picks the next mix
    table = None
    want = autoscale.mix_key(mix)
    for n, ln in enumerate(p.read_text().splitlines(), 1):
        if '"autoscale"' not in ln:
            continue
        try:
            r = json.loads(ln)
        except ValueError:              # torn bytes with a record glued after them: that record, said
            g = jsonl.glued_record(ln)
            log.warning("%s line %d is %s", p, n, "torn: the record after the torn bytes read" if g
                        else "not a JSON record: left out")
            if g is None:
                continue
            r = g[1]
        if r.get("type") == "autoscale" and r.get("table") and autoscale.mix_key(r.get("choice") or {}) == want:
            table = r["table"]
    return table


@dataclass
class PendingWatch:
    """Re-plans one chain's pending jobs; call :meth:`check` with the followed job id while it pends."""
    chain_dir: str | Path
    submit_fn: Callable[[JobSpec], str]                     # hpc_jabas.slurm.executor.submit_job
    env: Mapping[str, str] | None = None
    view_fn: Callable[[Any], Any] | None = None             # partition_types -> ClusterView (default read_cluster)
    clock: Callable[[], float] = time.time
    first_check_s: float = FIRST_CHECK_S
    _next: dict[str, float] = field(default_factory=dict)
    _waits: dict[str, int] = field(default_factory=dict)
    _seen: dict[str, float] = field(default_factory=dict)

    def check(self, job_id: str) -> str | None:
        """The new job id when ``job_id`` was stuck and has been re-planned; else None (not pending, not
        stuck, not due for a check, or no feasible mix: it waits)."""
        job_id = str(job_id)
        now = self.clock()
        self._seen.setdefault(job_id, now)
        if now < max(self._next.get(job_id, 0.0), self._seen[job_id] + self.first_check_s):
            return None
        state, reasons = pending_info(job_id, self.env)
        if state != "PENDING":
            return None
        events = chainlog.read(self.chain_dir)
        spec = _spec_of(self.chain_dir, job_id, events)
        if spec is None:
            self._next[job_id] = now + backoff_s(1)
            return None
        cfg = spec.config.get("autoscale") if isinstance(spec.config, dict) else None
        cfg = cfg if isinstance(cfg, dict) else {}
        try:
            if self.view_fn is not None:
                view = self.view_fn(cfg.get("partition_types"))
            else:
                view = read_cluster(cfg.get("partition_types"), env=self.env)
        except JabasError as e:
            log.warning("cannot read the cluster to check pending job %s: %s", job_id, e)
            self._next[job_id] = now + backoff_s(1)
            return None
        bad = stuck_partitions(spec.mix, view, reasons)
        if not bad:
            self._next[job_id] = now + self.first_check_s
            return None
        # the partitions of the pending job's own mix are not counted as free: it holds nothing yet
        mix = autoscale.replan(spec.mix, view.free, view.types, bad, table=_last_table(spec, spec.mix),
                               rates=view.billing, objective=str(cfg.get("objective", "time")),
                               max_gpus=cfg.get("max_gpus"), max_partitions=cfg.get("max_partitions", 2))
        why = "; ".join(r for r in reasons if r) or "no usable nodes"
        if mix is None:
            n = self._waits[job_id] = self._waits.get(job_id, 0) + 1
            wait = backoff_s(n)
            self._next[job_id] = now + wait
            msg = (f"job {job_id} pends on {', '.join(bad)} ({why}) and no other mix is feasible now: it stays "
                   f"queued with its checkpoint; next check in {wait:.0f} s")
            log.warning("%s", msg)
            chainlog.append(self.chain_dir, "replan_wait", job_id=job_id, excluded=bad, reason=why, attempt=n,
                            next_check_s=wait, message=msg)
            return None
        try:      # only while still pending: a job that has just started is left alone
            proc.run(["scancel", "--state=PENDING", job_id], self.env, timeout=15)
        except SlurmError as e:
            log.warning("could not cancel pending job %s: %s", job_id, e)
            return None
        st, _ = pending_info(job_id, self.env)
        if st not in (None, "CANCELLED"):
            self._next[job_id] = now + self.first_check_s
            return None
        linked = next((e for e in reversed(events) if e.get("event") in ("move", "requeue", "replan")
                       and str(e.get("to_job")) == job_id), None)
        sub: dict = next((e for e in reversed(events) if e.get("event") == "submit"
                          and str(e.get("job_id")) == job_id), {})
        new_id = str(self.submit_fn(spec.with_mix(mix)))
        queued_since = float((linked or {}).get("queued_since") or (linked or sub or {}).get("time") or now)
        chainlog.append(self.chain_dir, "replan", from_job=job_id, to_job=new_id, mix=mix, excluded=bad,
                        reason=why, epoch=(linked or {}).get("epoch"), iteration=(linked or {}).get("iteration"),
                        checkpoint_time=float((linked or {}).get("checkpoint_time") or queued_since),
                        queued_since=queued_since, by=f"pid {os.getpid()}")
        log.warning("job %s pended on %s (%s): cancelled; its successor %s runs on %s", job_id, ", ".join(bad), why,
                    new_id, autoscale.mix_label(mix))
        return new_id
