"""`hpc-jabas status CHAIN_DIR`: the jobs of a resubmission chain and where it stands.

One row per job (chain.summarize): id, method, mix, epochs, wall time, cost, our state and, when
Slurm is reachable, sacct's state; then totals (wall, cost, restart overheads) and the current
state of the chain. ``--json`` prints the same as one JSON object.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hpc_jabas.errors import ConfigError, JabasError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("status", help="show a resubmission chain: jobs, mixes, epochs, wall time, cost",
                              description="Show the jobs of a chain directory (chain.jsonl) with Slurm's view.")
    p.add_argument("chain_dir", metavar="CHAIN_DIR", help="the chain directory ([job] chain_dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-sacct", action="store_true", help="do not ask Slurm")
    p.set_defaults(func=run)
    return p


def status(chain_dir: str | Path, use_sacct: bool = True) -> dict:
    from hpc_jabas.slurm import chain as chainlog
    from hpc_jabas.slurm.watch import is_terminal
    d = Path(chain_dir)
    if not d.is_dir():
        raise ConfigError(f"chain directory {str(chain_dir)!r} does not exist")
    events = chainlog.read(d)
    if not events:
        raise ConfigError(f"{str(chain_dir)!r} holds no chain (no events in {chainlog.path(d)}); "
                          "give the chain_dir of a submitted job")
    rows = chainlog.summarize(events)
    methods = {str(e.get("job_id")): e.get("method") for e in events if e["event"] == "submit"}
    restarts = {str(e.get("job_id")): e for e in events if e["event"] == "restart"}
    for r in rows:
        r["method"] = methods.get(r["job_id"], "by hand")
        rs = restarts.get(r["job_id"])
        if rs:
            r["restart_overhead_s"] = rs.get("overhead_s")
    slurm, slurm_error = {}, None
    if use_sacct:
        from hpc_jabas.slurm.watch import sacct_states
        try:
            slurm = sacct_states([r["job_id"] for r in rows if r["job_id"].isdigit()])
        except JabasError as e:
            slurm_error = str(e)
    for r in rows:
        s = slurm.get(r["job_id"])
        r["slurm"] = s["State"] if s else None
    last = rows[-1] if rows else None
    ends = [e for e in events if e["event"] == "end"]
    current = "unknown"
    if last is not None:
        st, sl = last.get("state"), last.get("slurm")
        if st == "finished":
            current = f"finished (job {last['job_id']}, epoch {last.get('epochs')})"
        elif sl and is_terminal(sl) and st in ("submitted", "running"):
            current = f"stopped: job {last['job_id']} is {sl} in Slurm without finishing the training"
        elif st == "submitted":
            current = f"waiting: job {last['job_id']} submitted" + (f", {sl} in Slurm" if sl else "")
        elif st == "running":
            current = f"running: job {last['job_id']} from epoch {last.get('start_epoch')}"
        elif st == "moved":
            current = f"moving: job {last['job_id']} moved to job {last.get('next')}"
        else:
            current = str(st)
    total_wall = sum(r["wall_s"] or 0.0 for r in rows)
    total_cost = sum(r["cost"] or 0.0 for r in rows)
    ovh = [e.get("overhead_s") for e in events if e["event"] == "restart" and e.get("overhead_s") is not None]
    return {"chain_dir": str(d.resolve()), "jobs": rows, "current": current, "total_wall_s": total_wall,
            "total_cost": total_cost, "restarts": len(ovh), "restart_overhead_s": ovh,
            "moves": sum(1 for e in events if e["event"] == "move"), "ended_jobs": len(ends),
            "slurm_error": slurm_error}


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render(st: dict) -> str:
    from hpc_jabas.core.autoscale import mix_label
    out = [f"chain {st['chain_dir']}: {len(st['jobs'])} job(s), {st['moves']} move(s)"]
    hdr = ("job", "method", "mix", "ranks", "epochs", "wall_s", "cost", "state", "slurm")
    rows = []
    for r in st["jobs"]:
        e0, e1 = r.get("start_epoch"), r.get("epochs")
        epochs = f"{_fmt(e0, 'd')}->{_fmt(e1, 'd')}" if e0 is not None or e1 is not None else "-"
        rows.append((r["job_id"], r.get("method") or "-", mix_label(r.get("mix") or {}), _fmt(r.get("world"), "d"),
                     epochs, _fmt(r.get("wall_s"), ".1f"), _fmt(r.get("cost"), ".4g"), r.get("state") or "-",
                     r.get("slurm") or "-"))
    w = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    for row in (hdr, *rows):
        out.append("  ".join(str(x).ljust(n) for x, n in zip(row, w)).rstrip())
    ovh = st["restart_overhead_s"]
    tail = f"total: wall {st['total_wall_s']:.1f} s, cost {st['total_cost']:.4g}"
    if ovh:
        tail += f"; {len(ovh)} restart(s), checkpoint -> first iteration " + ", ".join(f"{x:.1f} s" for x in ovh)
    out.append(tail)
    if st.get("slurm_error"):
        out.append(f"slurm: not asked ({st['slurm_error']})")
    out.append(f"current: {st['current']}")
    return "\n".join(out)


def run(args) -> int:
    st = status(args.chain_dir, use_sacct=not args.no_sacct)
    if args.json:
        print(json.dumps(st, indent=1, default=str))
    else:
        print(render(st))
    return 0
