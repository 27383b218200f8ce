"""`hpc-jabas status CHAIN_DIR`: the chains of a chain directory, their jobs and where each stands.

A chain is a first job and the jobs its epoch-end moves, requeues and re-plans started; jobs not linked
so (two ``sbatch`` by hand with the same chain_dir) are separate chains (watch.split_chains). One row per
job: id, method, mix, ranks, epochs, ``elapsed_s`` (Slurm's elapsed time from sacct: queue-free wall
time of the allocation, start-up, Horovod init, checkpoints, exit), ``train_s`` (the trainer's own
time, from the chain log), cost (Slurm billing units x elapsed hours; the chain's figure without
sacct), iterations lost, our state and sacct's state. A job Slurm ran more than once (requeued in
place: ``sacct -D``) lists every run below it. Then the chain's totals (failed, timed-out and cancelled
runs included) and current state, and for a running chain its progress (epoch k of E, samples/s, ETA;
from the run directory's progress.json). ``--json`` prints the same as one JSON object.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from hpc_jabas.errors import ConfigError, JabasError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("status", help="show a chain directory: chains, jobs, mixes, epochs, elapsed time, "
                              "cost, progress", description="Show the chains of a chain directory (chain.jsonl) "
                              "with Slurm's view (sacct) and, for a running chain, its progress.")
    p.add_argument("chain_dir", metavar="CHAIN_DIR", help="the chain directory ([job] chain_dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-sacct", action="store_true", help="do not ask Slurm (elapsed_s then unknown)")
    p.add_argument("--trust-group", action="store_true", help="read a chain.jsonl its group may write (a shared "
                   "project directory; the job's trust_group = true); else it is refused")
    p.add_argument("--wait", type=float, metavar="S",
                   help="first wait up to S seconds until every chain in CHAIN_DIR has finished or stopped (the "
                        "directory may not exist yet: a job submitted by hand writes it when it starts); "
                        "exit 1 when a chain did not finish")
    p.set_defaults(func=run)
    return p


def _current(last: dict | None, cancel: dict | None = None, end: dict | None = None) -> str:
    """The chain's state in words; ``cancel``: its ``cancel`` event (hpc-jabas cancel), ``end``: the last job's
    last ``end`` event."""
    if last is None:
        return "unknown"
    st, sl = last.get("state"), last.get("slurm")
    from hpc_jabas.slurm.watch import is_terminal
    if st == "finished":
        return f"finished (job {last['job_id']}, epoch {last.get('epochs')})"
    if st == "cancelled":
        by = (end or {}).get("cancelled_by") or "cancelled"
        if (end or {}).get("iteration") is None:      # it failed or was killed before a safe point
            return (f"cancelled ({by}): job {last['job_id']} ended before a safe point"
                    + (f" ({sl} in Slurm)" if sl else "") + "; no successor (submit again to resume)")
        return (f"cancelled ({by}): job {last['job_id']} stopped at iteration {(end or {}).get('iteration')}, epoch "
                f"{last.get('epochs')}, with its checkpoint; no successor (submit again to resume)")
    if cancel is not None and (st == "submitted" or (sl and is_terminal(sl))):
        return f"cancelled (hpc-jabas cancel): job {last['job_id']} is {sl or st}; no successor"
    bs = last.get("before_start")
    if bs and sl and is_terminal(sl) and st in ("submitted", "failed"):
        why = ", ".join(x for x in (f"Slurm's reason: {bs['reason']}" if bs.get("reason") not in (None, "None") else "",
                                    f"exit code {bs['exit_code']}" if bs.get("exit_code") else "") if x)
        out = bs.get("output")
        where = ("no output file known" if not out else f"sbatch output: {out}" if bs.get("output_exists")
                 else f"sbatch output: {out} (missing: the job's nodes may not see that directory)")
        if bs.get("log_line"):
            where = f"the last line of its log {bs['log']}: {bs['log_line']}"
        return f"stopped: job {last['job_id']} is {sl} in Slurm before it started" + (f" ({why})" if why else "") \
            + f"; {where}"
    if sl and is_terminal(sl) and st in ("submitted", "running"):
        return f"stopped: job {last['job_id']} is {sl} in Slurm without finishing the training"
    if st == "failed":            # its batch shell recorded the failure (method sbatch's, submitit's teardown)
        if sl and not is_terminal(sl):
            return f"failing: job {last['job_id']} failed, {sl} in Slurm: its batch shell may still resubmit it"
        msg = (end or {}).get("message")
        return (f"stopped: job {last['job_id']} failed" + (f" ({sl} in Slurm)" if sl else "")
                + (f": {msg}" if msg else "") + "; no successor")
    if st == "submitted":
        return f"waiting: job {last['job_id']} submitted" + (f", {sl} in Slurm" if sl else "")
    if st == "running":
        return f"running: job {last['job_id']} from epoch {last.get('start_epoch')}"
    if st == "moved":
        return f"moving: job {last['job_id']} moved to job {last.get('next')}"
    return str(st)


def _progress(chain_dir: Path, last: dict | None, now: float) -> dict | None:
    """The running job's progress.json (written by rank 0 every few seconds), if it is that job's."""
    if last is None or last.get("state") != "running":
        return None
    from hpc_jabas.runtime.progress import read
    p = read(chain_dir / "run")
    if p is None or str(p.get("job_id")) != str(last["job_id"]):
        return None
    p["age_s"] = max(0.0, now - float(p.get("time", now)))
    return p


def _attempts(r: dict, evs: list[dict], runs: list[dict]) -> None:
    """One job's row gets every run Slurm made of it (``attempts``: a requeued job runs again under the same id;
    failed, timed-out and cancelled runs too), each with its elapsed time, cost (billing units x hours) and the
    iterations lost (from the chain's ``end`` events, in order: a failure's are counted by the resubmission);
    the row's elapsed time, cost and lost iterations are their sums. Without sacct: the chain's own figures."""
    ends = [e for e in evs if e["event"] == "end" and str(e.get("job_id")) == r["job_id"]]
    r["train_s"], r["train_cost"] = r.get("wall_s"), r.get("cost")
    atts = []
    for i, a in enumerate(runs):
        e = ends[i] if i < len(ends) else None
        atts.append({"attempt": i + 1, "slurm": a["State"], "start": a.get("Start"),
                     "elapsed_s": float(a["ElapsedRaw"]) if a.get("ElapsedRaw") is not None else None,
                     "billing": a.get("billing"), "cost": a.get("cost"),
                     "lost_iterations": e.get("lost_iterations") if e else None})
    if not atts and ends:
        atts = [{"attempt": i + 1, "slurm": None, "elapsed_s": None, "billing": None, "cost": e.get("cost"),
                 "lost_iterations": e.get("lost_iterations")} for i, e in enumerate(ends)]
    r["attempts"] = atts
    r["slurm"] = runs[-1]["State"] if runs else None
    el = [a["elapsed_s"] for a in atts if a["elapsed_s"] is not None]
    r["elapsed_s"] = sum(el) if runs and el else None
    costs = [a["cost"] for a in atts if a.get("billing") is not None and a["cost"] is not None]
    r["cost"] = sum(costs) if costs else r["train_cost"]
    lost = [int(e["lost_iterations"]) for e in ends if e.get("lost_iterations") is not None]
    r["lost_iterations"] = sum(lost) if lost else None
    r["wall_s"] = r["elapsed_s"] if r["elapsed_s"] is not None else r["train_s"]


def _before_start(r: dict, evs: list[dict], chain_dir: Path) -> None:
    """A job that Slurm ended before it wrote its start event (its nodes could not see the chain directory, its
    python environment is missing there...) wrote no log of ours: the row gets Slurm's reason and exit code
    (scontrol, while the controller still holds the job), the path of its sbatch output and, when its ranks wrote a
    log on the node, that log's path and the line that says why (``before_start``; watch.node_log)."""
    from hpc_jabas.slurm.watch import is_terminal, job_details, node_log, script_output
    if not is_terminal(r["slurm"]) or r["slurm"] == "COMPLETED":
        return
    sub = next((e for e in reversed(evs) if e["event"] == "submit" and str(e.get("job_id")) == r["job_id"]), None)
    d = job_details(r["job_id"])
    out = d.get("StdOut") or (script_output(sub["script"], r["job_id"]) if sub and sub.get("script") else None)
    r["before_start"] = {"reason": d.get("Reason"), "exit_code": d.get("ExitCode"), "output": out,
                         "output_exists": out is not None and Path(out).exists()}
    nl = node_log(chain_dir, r["job_id"], evs, d)
    if nl is not None:
        r["before_start"].update(log=nl["log"], log_line=nl["line"])


#: what sacct may still say for a while about a job whose chain has recorded its end (sacct lags)
_LAGGING = ("RUNNING", "COMPLETING", "PENDING", "REQUEUED", "RESIZING", "SUSPENDED")


def _reconcile(r: dict) -> None:
    """The chain's own records win over a lagging sacct: a job that recorded its end (finished, or moved
    to its successor) is never shown as RUNNING; the column says "finishing (Slurm still reports RUNNING)"."""
    if r.get("state") in ("finished", "moved") and r.get("slurm") in _LAGGING:
        r["slurm"] = f"finishing (Slurm still reports {r['slurm']})"


def _chain(events: list[dict], ids: list[str], chain_dir: Path, slurm: dict, now: float) -> dict[str, Any]:
    from hpc_jabas.slurm import chain as chainlog
    mine = set(ids)
    evs = [e for e in events if str(e.get("job_id") if e.get("job_id") is not None else e.get("from_job")) in mine]
    rows = chainlog.summarize(evs)
    methods = {str(e.get("job_id")): e.get("method") for e in evs if e["event"] == "submit"}
    restarts = {str(e.get("job_id")): e for e in evs if e["event"] == "restart"}
    for r in rows:
        r["method"] = methods.get(r["job_id"], "by hand")
        rs = restarts.get(r["job_id"])
        if rs:
            r["restart_overhead_s"] = rs.get("overhead_s")
        _attempts(r, evs, slurm.get(r["job_id"]) or [])
        _reconcile(r)
        if r.get("slurm") and (r.get("state") == "submitted" or (r.get("state") == "failed" and not any(
                e["event"] == "start" and str(e.get("job_id")) == r["job_id"] for e in evs))):
            _before_start(r, evs, chain_dir)          # it ended before it started training
    last = rows[-1] if rows else None
    from hpc_jabas.slurm.cancel import chain_cancel
    cancel = chain_cancel(events, ids[0]) if ids else None
    end = next((e for e in reversed(evs) if e["event"] == "end" and last and str(e.get("job_id")) == last["job_id"]),
               None)
    ovh = [e.get("overhead_s") for e in evs if e["event"] == "restart" and e.get("overhead_s") is not None]
    return {"jobs": rows, "current": _current(last, cancel, end), "progress": _progress(chain_dir, last, now),
            "total_elapsed_s": (sum(r["elapsed_s"] for r in rows if r["elapsed_s"] is not None)
                                if any(r["elapsed_s"] is not None for r in rows) else None),
            "total_train_s": sum(r["train_s"] or 0.0 for r in rows),
            "total_cost": sum(r["cost"] or 0.0 for r in rows), "restarts": len(ovh), "restart_overhead_s": ovh,
            "attempts": sum(max(1, len(r["attempts"])) for r in rows),
            "total_lost_iterations": sum(r["lost_iterations"] or 0 for r in rows),
            "moves": sum(1 for e in evs if e["event"] == "move"),
            "ended_jobs": sum(1 for e in evs if e["event"] == "end")}


def status(chain_dir: str | Path, use_sacct: bool = True) -> dict:
    from hpc_jabas.slurm import chain as chainlog
    from hpc_jabas.slurm.watch import split_chains
    d = Path(chain_dir)
    if not d.is_dir():
        raise ConfigError(f"chain directory {str(chain_dir)!r} " + ("is a file, not a directory" if d.exists()
                                                                    else "does not exist"))
    events = chainlog.read(d)
    if not events and (d / "metrics.jsonl").is_file():
        return run_status(d)          # a run directory of mpirun, horovodrun or one process: no chain
    if not events:
        raise ConfigError(f"{str(chain_dir)!r} holds no chain (no events in {chainlog.path(d)}) and no run "
                          "(no metrics.jsonl); give the chain_dir of a submitted job or a run directory")
    groups = split_chains(events)
    slurm: dict = {}
    slurm_error = None
    if use_sacct:
        from hpc_jabas.slurm.watch import sacct_attempts
        try:
            slurm = sacct_attempts([j for g in groups for j in g if j.isdigit()])
        except JabasError as e:
            slurm_error = str(e)
    now = time.time()
    chains = [_chain(events, g, d, slurm, now) for g in groups]
    jobs = [r for c in chains for r in c["jobs"]]
    return {"chain_dir": str(d.resolve()), "chains": chains, "jobs": jobs,
            "current": chains[-1]["current"] if chains else "unknown",
            "total_wall_s": sum(r["wall_s"] or 0.0 for r in jobs),
            "total_elapsed_s": sum(c["total_elapsed_s"] or 0.0 for c in chains),
            "total_train_s": sum(c["total_train_s"] for c in chains),
            "total_cost": sum(c["total_cost"] for c in chains),
            "restarts": sum(c["restarts"] for c in chains), "moves": sum(c["moves"] for c in chains),
            "attempts": sum(c["attempts"] for c in chains),
            "total_lost_iterations": sum(c["total_lost_iterations"] for c in chains),
            "slurm_error": slurm_error}


def run_status(run_dir: Path) -> dict:
    """A run directory that no chain owns (mpirun, horovodrun, one process; a chain's is ``<chain_dir>/run``): its
    jobs' starts and resumes, the epoch and iteration reached, B, the last evaluation and how it ended, from its
    metrics.jsonl; its progress.json while it runs (the directory's lock held by a live process)."""
    from collections import Counter

    from hpc_jabas.cli.report import load_metrics
    from hpc_jabas.core.autoscale.scaler import mix_label
    from hpc_jabas.runtime.persist.dirlock import DirLock
    from hpc_jabas.runtime.progress import read
    recs = load_metrics(run_dir)
    starts = [r for r in recs if r.get("type") == "start"]
    its = [r for r in recs if r.get("type") == "iteration"]
    ends = [r for r in recs if r.get("type") == "epoch_end"]
    last_start = starts[-1] if starts else {}
    epochs = (last_start.get("config") or {}).get("epochs")
    after = [r for r in recs[recs.index(last_start):]] if last_start else recs
    holder = DirLock(run_dir, "run directory").locked_by_other()
    stop = next((r for r in reversed(after) if r.get("type") in ("safe_point_stop", "nonfinite_stop")), None)
    done = 1 + max([int(r["epoch"]) for r in ends] or [-1])
    if epochs is not None and done >= int(epochs):
        current = f"finished (epoch {done} of {epochs}, iteration {ends[-1]['it']})"
    elif holder is not None:
        current = f"running (pid {holder.get('pid')})"
    elif stop is not None and stop["type"] == "safe_point_stop":
        current = (f"stopped at a safe point after iteration {stop.get('it')} ({stop.get('signal')}), checkpoint "
                   f"{stop.get('checkpoint')}; run the same command again to resume")
    elif stop is not None:
        current = f"stopped: the loss of iteration {stop.get('it')} was not finite on {stop.get('ranks')} rank(s)"
    else:
        current = "not running, not finished (ended without a safe point: killed, or an error; see its output)"
    prog = read(run_dir) if holder is not None else None
    if prog is not None:
        prog["age_s"] = max(0.0, time.time() - float(prog.get("time", time.time())))
    return {"run_dir": str(run_dir.resolve()), "kind": "run", "world": last_start.get("world"),
            "mix": mix_label(Counter(last_start.get("gpu_types") or [])) if last_start else None,
            "starts": len(starts), "resumes": sum(1 for r in recs if r.get("type") == "resume"),
            "epochs": epochs, "epochs_done": done, "iteration": (its[-1]["it"] + 1) if its else 0,
            "B": its[-1]["B"] if its else last_start.get("B"), "B_first": its[0]["B"] if its else None,
            "eval": ends[-1].get("eval") if ends else None, "eval_epoch": done if ends else None,
            "progress": prog, "current": current}


def render_run(st: dict) -> str:
    from hpc_jabas.runtime.evaluate import epoch_line
    out = [f"run {st['run_dir']} (no chain: started by mpirun, horovodrun or as one process): {st['world']} "
           f"rank(s) {st['mix']}, {st['starts']} start(s), {st['resumes']} resume(s)",
           f"epochs done: {st['epochs_done']} of {st['epochs']}, iterations: {st['iteration']}, B {st['B_first']} -> "
           f"{st['B']}"]
    if st.get("eval_epoch"):
        out.append("last evaluation: " + epoch_line(st["eval_epoch"] - 1, st["epochs"] or 0, st["iteration"],
                                                    st["B"], st["eval"]))
    if st.get("progress"):
        out.append(progress_line(st["progress"]))
    out.append(f"current: {st['current']}")
    return "\n".join(out)


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def progress_line(p: dict) -> str:
    k, e = int(p.get("epoch", 0)), int(p.get("epochs", 0))
    frac = (p.get("samples_done", 0) / p["samples_total"]) if p.get("samples_total") else None
    out = f"progress: epoch {min(k + 1, e)} of {e}, iteration {p.get('iteration')}, B={p.get('B')}"
    if frac is not None:
        out += f", {frac:.0%} of the samples"
    if p.get("samples_per_s"):
        out += f", {p['samples_per_s']:.0f} samples/s"
    out += f", ETA {_fmt(p.get('eta_s'), '.0f')} s" if p.get("eta_s") is not None else ", ETA unknown"
    return out + f" (as of {p.get('age_s', 0.0):.0f} s ago)"


def _render_chain(c: dict, head: str) -> list[str]:
    from hpc_jabas.core.autoscale.scaler import mix_label
    out = [head]
    hdr = ("job", "method", "mix", "ranks", "epochs", "elapsed_s", "train_s", "cost", "lost", "state", "slurm")
    rows = []
    for r in c["jobs"]:
        e0, e1 = r.get("start_epoch"), r.get("epochs")
        epochs = f"{_fmt(e0, 'd')}->{_fmt(e1, 'd')}" if e0 is not None or e1 is not None else "-"
        rows.append((r["job_id"], r.get("method") or "-", mix_label(r.get("mix") or {}), _fmt(r.get("world"), "d"),
                     epochs, _fmt(r.get("elapsed_s"), ".0f"), _fmt(r.get("train_s"), ".1f"), _fmt(r.get("cost"), ".4g"),
                     _fmt(r.get("lost_iterations"), "d"), r.get("state") or "-", r.get("slurm") or "-"))
        atts = r.get("attempts") or []
        if len(atts) > 1:          # a requeued job: every run, indented (not a job row)
            for a in atts:
                rows.append((f"  run {a['attempt']}/{len(atts)}", "", "", "", "", _fmt(a.get("elapsed_s"), ".0f"), "",
                             _fmt(a.get("cost"), ".4g"), _fmt(a.get("lost_iterations"), "d"), "",
                             a.get("slurm") or "-"))
    w = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    for row in (hdr, *rows):
        out.append("  ".join(str(x).ljust(n) for x, n in zip(row, w)).rstrip())
    tail = (f"total: {c['attempts']} run(s), elapsed {_fmt(c['total_elapsed_s'], '.0f')} s (Slurm), training "
            f"{c['total_train_s']:.1f} s, cost {c['total_cost']:.4g}, {c['total_lost_iterations']} iteration(s) lost")
    if c["restart_overhead_s"]:
        tail += (f"; {len(c['restart_overhead_s'])} restart(s), checkpoint -> first iteration "
                 + ", ".join(f"{x:.1f} s" for x in c["restart_overhead_s"]))
    out.append(tail)
    if c.get("progress"):
        out.append(progress_line(c["progress"]))
    out.append(f"current: {c['current']}")
    return out


def render(st: dict) -> str:
    chains = st["chains"]
    out: list[str] = []
    if st.get("slurm_error"):
        out.append(f"slurm: not asked ({st['slurm_error']})")
    if len(chains) == 1:
        c = chains[0]
        return "\n".join(out + _render_chain(c, f"chain {st['chain_dir']}: {len(c['jobs'])} job(s), "
                                                f"{c['moves']} move(s)"))
    out.append(f"chain directory {st['chain_dir']}: {len(chains)} chains (jobs not linked by a move are "
               "separate chains; give each job its own chain_dir)")
    for i, c in enumerate(chains, 1):
        out.append("")
        out += _render_chain(c, f"chain {i} of {len(chains)} (first job {c['jobs'][0]['job_id']}): "
                                f"{len(c['jobs'])} job(s), {c['moves']} move(s)")
    return "\n".join(out)


def ended(c: dict) -> bool:
    """The chain will not go on by itself (its last job finished the training, or stopped without it) and
    Slurm has let go of its jobs (so their elapsed times are final)."""
    from hpc_jabas.slurm.watch import is_terminal
    return c["current"].startswith(("finished", "stopped", "cancelled")) and all(
        r.get("slurm") is None or is_terminal(r["slurm"]) for r in c["jobs"])


def wait(chain_dir: str | Path, timeout_s: float, use_sacct: bool = True, poll_s: float = 2.0) -> dict:
    """:func:`status` once every chain of ``chain_dir`` has ended, or at ``timeout_s`` (whatever it is then)."""
    deadline = time.time() + timeout_s
    while True:
        try:
            st = status(chain_dir, use_sacct=use_sacct)
            if st.get("kind") == "run":
                if not st["current"].startswith("running") or time.time() >= deadline:
                    return st
            elif all(ended(c) for c in st["chains"]) or time.time() >= deadline:
                return st
        except ConfigError:
            if time.time() >= deadline:
                raise
        time.sleep(poll_s)


def run(args) -> int:
    if args.wait is not None and args.wait < 0:
        raise ConfigError(f"--wait {args.wait:g} must be >= 0 seconds")
    use = not args.no_sacct
    if getattr(args, "trust_group", False):
        from hpc_jabas.trust import set_trust_group
        set_trust_group(True)
    st = wait(args.chain_dir, args.wait, use) if args.wait is not None else status(args.chain_dir, use_sacct=use)
    if args.json:
        print(json.dumps(st, indent=1, default=str))
    else:
        print(render_run(st) if st.get("kind") == "run" else render(st))
    if st.get("kind") == "run":
        return 1 if args.wait is not None and not st["current"].startswith("finished") else 0
    if args.wait is not None and not all(c["current"].startswith("finished") for c in st["chains"]):
        return 1
    return 0
