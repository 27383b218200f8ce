"""Following jobs and chains: sacct's states, one state per (heterogeneous) job, wait_chain.

A heterogeneous job is listed by sacct as ``<id>+0``, ``<id>+1``...; :func:`fold_state` turns its
components' states into one job state, and every place that needs a job's state (``sacct_states``,
the submitit watcher of :mod:`hpc_jabas.slurm.executor`, ``hpc-jabas status``) uses it:
the first component still active (any state not in :data:`TERMINAL`) gives the state; else the
first component that did not complete; else COMPLETED.
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from hpc_jabas.errors import SlurmError
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.slurm import proc
from hpc_jabas.slurm.text import SacctRow, base_state, parse_sacct

#: states after which a job (or component) never runs again
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                      "BOOT_FAIL", "DEADLINE", "REVOKED"})
SACCT_TIMEOUT_S = 30.0
_UNSET = ("Unknown", "None", "")


def is_terminal(state: str) -> bool:
    return base_state(state) in TERMINAL


def fold_state(states: Iterable[str]) -> str:
    """One state for the components' states, in component order ('CANCELLED by 0' counts as CANCELLED):
    the first not terminal; else the first not COMPLETED; else COMPLETED. No states: UNKNOWN."""
    s = [base_state(x) for x in states]
    s = [x for x in s if x]
    if not s:
        return "UNKNOWN"
    active = [x for x in s if x not in TERMINAL]
    if active:
        return active[0]
    return next((x for x in s if x != "COMPLETED"), "COMPLETED")


def fold_rows(rows: Iterable[SacctRow]) -> dict[str, dict[str, Any]]:
    """sacct rows -> job id -> {State, ElapsedRaw, Start, End, Partition, NodeList, components}, steps ignored.

    A heterogeneous job's ``<id>+<k>`` rows fold into ``<id>``: State by :func:`fold_state`, Start the
    earliest, End the latest (Unknown while a component is active), ElapsedRaw (Slurm's elapsed seconds,
    so far while it runs) the longest component's (None when not asked), Partition and NodeList joined
    with ',' in component order. Right after a het job ends slurmdbd may still list it as plain
    ``<id>``; once component rows are there, they win.
    """
    jobs: dict[str, list[SacctRow]] = {}
    for r in rows:
        if r.step is None:
            jobs.setdefault(r.job, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for jid, items in jobs.items():
        comps = [r for r in items if r.component is not None]
        items = sorted(comps, key=lambda r: r.component or 0) if comps else items[:1]
        state = fold_state(r.state for r in items)
        starts = [r.fields.get("Start", "") for r in items if r.fields.get("Start", "") not in _UNSET]
        ends = [r.fields.get("End", "") for r in items if r.fields.get("End", "") not in _UNSET]
        elapsed = [int(r.fields["ElapsedRaw"]) for r in items if str(r.fields.get("ElapsedRaw", "")).isdigit()]
        out[jid] = {"State": state, "ElapsedRaw": max(elapsed) if elapsed else None,
                    "Start": min(starts) if starts else "Unknown",
                    "End": max(ends) if ends and state in TERMINAL else "Unknown",
                    "Partition": ",".join(r.fields.get("Partition", "") for r in items),
                    "NodeList": ",".join(r.fields.get("NodeList", "") for r in items),
                    "components": len(items)}
    return out


def sacct_states(job_ids: Iterable[str | int], env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """sacct's view of jobs: id -> {State, ElapsedRaw, Start, End, Partition, NodeList, components} (see
    :func:`fold_rows`); jobs sacct does not list are missing. SlurmError when sacct fails."""
    ids = sorted({str(j).strip() for j in job_ids if str(j).strip()})
    if not ids:
        return {}
    env = dict(os.environ if env is None else env)
    proc.require(("sacct",), env)
    fields = ("JobID", "State", "ElapsedRaw", "Start", "End", "Partition", "NodeList")
    text = proc.run(["sacct", "-X", "-n", "-P", "-o", ",".join(fields), "-j", ",".join(ids)], env,
                    timeout=SACCT_TIMEOUT_S)
    return fold_rows(parse_sacct(text, fields))


def job_details(job_id: str | int, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the controller says of a job while it still holds it (``MinJobAge`` seconds after its end):
    {"JobState", "Reason", "StdOut", "ExitCode", ...} from ``scontrol show job -o`` (a heterogeneous job's first
    component); {} when it no longer does or Slurm does not answer. sacct keeps neither the reason
    (JobLaunchFailure...) nor the output path."""
    import re
    env = dict(os.environ if env is None else env)
    try:
        text = proc.run(["scontrol", "show", "job", "-o", str(job_id)], env, timeout=SACCT_TIMEOUT_S)
    except SlurmError:
        return {}
    line = (text.strip().splitlines() or [""])[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"(\w+)=(\S*)", line)}


def script_output(script: str | Path, job_id: str) -> str | None:
    """The output file a job script names (``#SBATCH --output=``/``-o``, ``%j``/``%A`` the job id, ``%t`` rank 0),
    None when it names none or cannot be read."""
    try:
        lines = Path(script).read_text(errors="replace").splitlines()
    except OSError:
        return None
    for ln in lines:
        w = ln.split()
        if len(w) >= 2 and w[0] == "#SBATCH":
            for i, a in enumerate(w[1:], 1):
                val = a.split("=", 1)[1] if a.startswith("--output=") else (
                    w[i + 1] if a in ("-o", "--output") and i + 1 < len(w) else None)
                if val:
                    return (val.strip("'\"").replace("%j", str(job_id)).replace("%A", str(job_id))
                            .replace("%t", "0").replace("%%", "%"))
    return None


#: a line that says why a process ended: a Python exception's (the last of a traceback, "ModuleNotFoundError: No
#: module named 'numpy'", in a log record too) or hpc-jabas's own error line ("hpc-jabas: error: ...")
_EXCEPTION_LINE = re.compile(r"^(hpc-jabas\[\d+\] )?[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b"
                             r"|^hpc-jabas(\[\d+\])?(: error:| ERROR:)")
#: what Slurm's own commands add to a job's output ("srun: error: gpur1: ...: Exited with exit code 1")
_SLURM_LINE = re.compile(r"^(srun|sbatch|salloc|slurmstepd(-[\w.-]+)?):")
_LOG_TAIL_BYTES = 65536


def log_line(path: str | Path) -> str | None:
    """The line of a node log that says why its job ended: the last exception or hpc-jabas error line in it (a
    traceback's last line), else its last non-empty line that is not Slurm's own, else its last line; None when
    the file is missing, empty or unreadable (its last 64 KiB are read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _LOG_TAIL_BYTES))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    if not lines:
        return None
    return next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)),
                next((ln for ln in reversed(lines) if not _SLURM_LINE.match(ln)), lines[-1]))


def job_logs(chain_dir: str | Path, job_id: str, events: list[dict] | None = None,
             details: Mapping[str, str] | None = None) -> list[Path]:
    """The files a job's ranks wrote on its nodes, most telling first: method submitit's per-rank stderr, then
    stdout (``<chain_dir>/jobs/submitit/<id>_<rank>_log.{err,out}``), the job script's output (method sbatch:
    ``#SBATCH --output``, stderr included), then what the controller names (``details``: StdErr, StdOut of
    :func:`job_details`). Only files that exist."""
    folder = Path(chain_dir) / "jobs" / "submitit"

    def rank(p: Path) -> int:
        r = p.name.split("_")[1] if p.name.count("_") >= 2 else ""
        return int(r) if r.isdigit() else 1 << 30
    out = [p for ext in ("err", "out") for p in sorted(folder.glob(f"{job_id}_*_log.{ext}"), key=rank)]
    if events is None:
        events = chainlog.read(chain_dir)
    sub = next((e for e in reversed(events) if e.get("event") == "submit" and str(e.get("job_id")) == str(job_id)),
               None)
    if sub is not None and sub.get("script") and sub.get("method") == "sbatch":
        o = script_output(sub["script"], str(job_id))
        if o:
            out.append(Path(o))
    for k in ("StdErr", "StdOut"):
        named = (details or {}).get(k)
        if named:
            out.append(Path(named))
    return [p for i, p in enumerate(out) if p not in out[:i] and p.is_file()]


def node_log(chain_dir: str | Path, job_id: str, events: list[dict] | None = None,
             details: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """{"log": path, "line": line} of the job's node log that says why it ended (:func:`job_logs`, :func:`log_line`):
    the first whose telling line is an exception's, else the first with any line; None when none has one."""
    found: list[tuple[Path, str]] = []
    for p in job_logs(chain_dir, job_id, events, details):
        ln = log_line(p)
        if ln:
            found.append((p, ln))
    if not found:
        return None
    p, ln = next(((p, ln) for p, ln in found if _EXCEPTION_LINE.match(ln)), found[0])
    return {"log": str(p), "line": ln}


#: chain events that hand the training from one job to the next (a requeue in place has to_job == from_job)
LINKS = ("move", "requeue", "replan")


ATTEMPT_FIELDS = ("JobID", "State", "ElapsedRaw", "Start", "End", "Partition", "NodeList", "AllocTRES")


def _billing(tres: str) -> float | None:
    """``billing=4,cpu=2,gres/gpu=2,...`` (sacct AllocTRES) -> 4.0; None when not there."""
    for item in (tres or "").split(","):
        k, _, v = item.partition("=")
        if k.strip() == "billing":
            try:
                return float(v)
            except ValueError:
                return None
    return None


def fold_attempts(rows: Iterable[SacctRow]) -> dict[str, list[dict[str, Any]]]:
    """``sacct -D`` rows (every run of a requeued job: an earlier run is REQUEUED, PREEMPTED, NODE_FAIL...)
    -> job id -> its attempts in order, each as :func:`fold_rows` folds one run (the k-th row of each
    het component is attempt k), plus ``billing`` (Slurm billing units of the allocation, summed over the
    components; None when sacct gives none) and ``cost`` (billing x elapsed hours). Steps are ignored."""
    runs: dict[str, list[list[SacctRow]]] = {}
    seen: dict[tuple[str, int | None], int] = {}
    for r in rows:
        if r.step is not None:
            continue
        k = seen[(r.job, r.component)] = seen.get((r.job, r.component), -1) + 1
        lst = runs.setdefault(r.job, [])
        while len(lst) <= k:
            lst.append([])
        lst[k].append(r)
    out: dict[str, list[dict[str, Any]]] = {}
    for jid, attempts in runs.items():
        for i, items in enumerate(attempts):
            one = fold_rows(items)[jid]
            bills = [b for b in (_billing(r.fields.get("AllocTRES", "")) for r in items) if b is not None]
            one["billing"] = sum(bills) if bills else None
            el = one.get("ElapsedRaw")
            one["cost"] = one["billing"] * el / 3600.0 if one["billing"] is not None and el is not None else None
            one["attempt"] = i + 1
            out.setdefault(jid, []).append(one)
    return out


def sacct_attempts(job_ids: Iterable[str | int], env: Mapping[str, str] | None = None
                   ) -> dict[str, list[dict[str, Any]]]:
    """Every run of the jobs (``sacct -D``: requeues included), see :func:`fold_attempts`. SlurmError when
    sacct fails."""
    ids = sorted({str(j).strip() for j in job_ids if str(j).strip()})
    if not ids:
        return {}
    env = dict(os.environ if env is None else env)
    proc.require(("sacct",), env)
    text = proc.run(["sacct", "-D", "-X", "-n", "-P", "-o", ",".join(ATTEMPT_FIELDS), "-j", ",".join(ids)], env,
                    timeout=SACCT_TIMEOUT_S)
    return fold_attempts(parse_sacct(text, ATTEMPT_FIELDS))


def split_chains(events: list[dict]) -> list[list[str]]:
    """The chains in one chain directory's events: job ids in order, a chain being a first job and the
    jobs its moves, requeues onto a successor and re-plans started. Jobs not linked so (two ``sbatch``
    by hand into the same chain_dir) are separate chains, in the order of their first event."""
    order: list[str] = []
    nxt: dict[str, str] = {}
    moved_in: set[str] = set()
    for e in events:
        for k in ("job_id", "from_job", "to_job"):
            j = e.get(k)
            if j is not None and str(j) and str(j) not in order:
                order.append(str(j))
        if e.get("event") in LINKS and e.get("from_job") is not None and e.get("to_job") is not None \
                and str(e["to_job"]) != str(e["from_job"]):
            nxt[str(e["from_job"])] = str(e["to_job"])
            moved_in.add(str(e["to_job"]))
    chains: list[list[str]] = []
    for root in (j for j in order if j not in moved_in):
        chain, cur = [root], root
        while cur in nxt and nxt[cur] not in chain:
            cur = nxt[cur]
            chain.append(cur)
        chains.append(chain)
    return chains


def wait_chain(chain_dir: str | Path, job_id: str, timeout: float | None = None, poll_s: float = 1.0,
               on_event: Callable[[dict], None] | None = None, grace_s: float = 10.0,
               on_pending: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """Follow a chain from ``job_id`` through its moves until a job finishes the training or fails.

    Returns {"ok": bool, "job_id": last job, "state": "finished" | "cancelled" | Slurm state | "timeout",
    "jobs": [ids followed]}; a job that Slurm ended before it started training (no ``start`` event: its python
    environment missing on the node, an import error...) adds ``before_start``: {"log", "line"} of its node log
    (:func:`node_log`; {} when it left none). ``on_event(e)`` sees every new chain event. ``on_pending(job_id)`` is
    called while the followed job is PENDING (slurm/replan.py's ``PendingWatch.check``): a new job id returned
    replaces it (it was cancelled and re-planned; the chain has a ``replan`` event).
    """
    t0 = time.time()
    cur, jobs, seen = str(job_id), [str(job_id)], 0
    terminal_since: float | None = None
    while True:
        ev = chainlog.read(chain_dir)
        if on_event:
            for e in ev[seen:]:
                on_event(e)
        seen = len(ev)
        # the last end: a job requeued in place (submitit) ends once per run; a requeue onto a successor
        # (method sbatch) is followed like a move
        end = next((e for e in reversed(ev) if e["event"] == "end" and str(e.get("job_id")) == cur), None)
        mv = next((e for e in ev if e["event"] in ("move", "requeue") and str(e.get("from_job")) == cur
                   and str(e.get("to_job")) != cur), None)
        if end is not None and end.get("state") == "finished":
            return {"ok": True, "job_id": cur, "state": "finished", "jobs": jobs}
        if end is not None and end.get("state") == "cancelled":      # ended on purpose: no successor follows
            return {"ok": False, "job_id": cur, "state": "cancelled", "jobs": jobs}
        rp = next((e for e in ev if e["event"] == "replan" and str(e.get("from_job")) == cur), None)
        if (mv is not None and end is not None) or rp is not None:
            cur, terminal_since = str((rp or mv or {})["to_job"]), None
            jobs.append(cur)
            continue
        try:
            st = sacct_states([cur]).get(cur, {}).get("State", "")
        except SlurmError:
            st = ""
        if on_pending is not None and st == "PENDING":
            new = on_pending(cur)
            if new is not None:
                continue            # its replan event is read on the next pass
        if st in TERMINAL:
            terminal_since = terminal_since or time.time()
            if time.time() - terminal_since > grace_s:   # the end event would be there by now
                res: dict[str, Any] = {"ok": False, "job_id": cur, "state": st, "jobs": jobs}
                if not any(e["event"] == "start" and str(e.get("job_id")) == cur for e in ev):
                    res["before_start"] = node_log(chain_dir, cur, ev, job_details(cur)) or {}
                return res
        if timeout is not None and time.time() - t0 > timeout:
            return {"ok": False, "job_id": cur, "state": "timeout", "jobs": jobs}
        time.sleep(poll_s)
