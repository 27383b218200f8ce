"""`hpc-jabas cancel CHAIN_DIR`: end a chain on purpose.

The running job stops at its next safe point with a checkpoint and submits no successor; a pending job is
cancelled; nothing later in the chain (a move, a requeue, a resubmission after a failure) submits another job
(hpc_jabas/slurm/cancel.py). A plain ``scancel`` of a chain's job ends the chain too; Slurm's own preemption and
time limit do not (they requeue). ``--wait S`` waits up to S seconds for the running job to record its end.
Submitting into the same chain_dir again later starts a new chain, which resumes from the checkpoint.
"""
from __future__ import annotations

import argparse

from hpc_jabas.errors import ConfigError


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cancel", help="end a chain: its running job stops at its next safe point with a "
                              "checkpoint, no successor is submitted",
                              description="End the chains of a chain directory: the running job checkpoints at "
                              "its next safe point and ends, a pending job is cancelled, no successor is submitted.")
    p.add_argument("chain_dir", metavar="CHAIN_DIR", help="the chain directory ([job] chain_dir)")
    p.add_argument("--wait", type=float, metavar="S", help="wait up to S seconds until the running job has ended; "
                   "exit 1 when it has not")
    p.add_argument("--trust-group", action="store_true", help="read a chain.jsonl its group may write (a shared "
                   "project directory; the job's trust_group = true); else it is refused")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    if args.wait is not None and args.wait < 0:
        raise ConfigError(f"--wait {args.wait:g} must be >= 0 seconds")
    if getattr(args, "trust_group", False):
        from hpc_jabas.trust import set_trust_group
        set_trust_group(True)
    from hpc_jabas.slurm.cancel import cancel_chain, wait_ended
    out = cancel_chain(args.chain_dir)
    parts = [f"job {j} stops at its next safe point with a checkpoint" for j in out["running"]]
    parts += [f"job {j} is starting and stops at its first safe point" for j in out["starting"]]
    parts += [f"pending job {j} cancelled" for j in out["pending"]]
    print(f"chain {args.chain_dir}: cancelled; " + ("; ".join(parts) if parts else "no job was running or pending")
          + "; no successor will be submitted")
    live = out["running"] + out["starting"]
    if args.wait is None or not live:
        return 0
    ended = wait_ended(args.chain_dir, live, args.wait)
    for j, st in ended.items():
        print(f"job {j}: {st}")
    return 0 if all(st != "running" for st in ended.values()) else 1
