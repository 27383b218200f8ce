"""Rank-level fault runs shared by tests/test_hung_rank.py, tests/test_restarts.py and bench/common/rank_faults.py:
a user's training script under the real launchers (torchrun, mpirun, srun), one rank stopped (SIGSTOP) or killed.
Self-contained (no sibling imported by name), so that the bench imports it as ``tests.support.rank_runs``; what
differs between the two callers (the launch environment, the reference run) is passed in."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "tests" / "workers"
PY = sys.executable

#: how long after the SIGSTOP the others must have named the rank: the issue's goal, with the default heartbeat
NAMED_BOUND_S = 30
#: the launcher's exit after the line (torchrun waits 30 s for a stopped worker before its SIGKILL)
EXIT_BOUND_S = 75


#: torchrun's whole run: 60 iterations of a tiny model and N restarts (each a torch start-up), no wall-time claim
BOUND_S = 300


def checkpoints(out: Path) -> list[Path]:
    d = out / "run" / "checkpoints"
    return sorted(d.glob("ckpt-*.pt")) if d.is_dir() else []


def our_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("hpc-jabas: error:")]


def stop_one(cmd: list[str], out: Path, env: dict, n: int, stop: int, backend: str = "torch") -> dict:
    """Start the run, SIGSTOP rank ``stop`` once every rank trained 12 iterations and a checkpoint exists; return
    rc, stderr, seconds from the stop to our first line (None: none came) and to the launcher's exit, and whether
    the stopped process outlived the launcher."""
    (out / "spec.json").write_text(json.dumps({"out_dir": str(out), "plan": "b=4 n=" + ",".join(["1"] * n),
                                               "backend": backend}))
    pid = None
    with open(out / "stderr", "w") as errf:
        p = subprocess.Popen(cmd + [str(WORKERS / "dead_rank_worker.py"), str(out / "spec.json")], env=env,
                             stdout=subprocess.DEVNULL, stderr=errf, cwd=str(ROOT))
        try:
            end = time.monotonic() + 240
            while not all((out / f"pid{r}").exists() for r in range(n)) or not checkpoints(out):
                assert p.poll() is None and time.monotonic() < end, (out / "stderr").read_text()[-3000:]
                time.sleep(0.1)
            time.sleep(0.5)
            pid = int((out / f"pid{stop}").read_text())
            os.kill(pid, signal.SIGSTOP)
            t0 = time.monotonic()
            named = None
            while p.poll() is None and time.monotonic() < t0 + NAMED_BOUND_S + EXIT_BOUND_S:
                if named is None and our_lines((out / "stderr").read_text()):
                    named = time.monotonic() - t0
                time.sleep(0.1)
            rc = p.poll()                       # None: still running past the bounds
            exit_s = time.monotonic() - t0
            if named is None and our_lines((out / "stderr").read_text()):
                named = exit_s
            time.sleep(1.0)
            orphan = alive(pid)
            return {"rc": rc, "err": (out / "stderr").read_text(), "named_s": named, "exit_s": exit_s,
                    "orphan": orphan}
        finally:
            if p.poll() is None:
                p.kill()
            if pid is not None and alive(pid):
                os.kill(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGCONT)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def run_restarts(out: Path, kills: int, max_restarts: int, env: dict, reference_run: Callable[[dict], dict]) -> dict:
    """Run the worker under torchrun; return rc, stderr, the pids left alive, and the final parameters' relative
    error against the uninterrupted run (inf when none were written). ``env``: the tests' launch environment
    (tests/mpi_util.py ``mpi_env()``); ``reference_run``: tests/reference.py's."""
    (out / "spec.json").write_text(json.dumps({"out_dir": str(out), "kills": kills}))
    env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_"))}
    cmd = [str(Path(PY).parent / "torchrun"), "--standalone", "--nproc-per-node=2", f"--max-restarts={max_restarts}",
           str(WORKERS / "restart_worker.py"), str(out / "spec.json")]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=BOUND_S)
    wall = time.monotonic() - t0
    time.sleep(1.0)
    pids = [int(f.read_text()) for f in out.glob("pid-*")]
    left = [pid for pid in pids if alive(pid)]
    err = float("inf")
    if (out / "final.pt").exists():
        got = torch.load(out / "final.pt")
        ref = reference_run({"optimizer": "adam", "lr": 0.01, "plan": "b=4 n=1,1", "steps": 60, "n": 240})
        err = max(float((got[k] - v).abs().max() / (v.abs().max() + 1e-12)) for k, v in ref.items())
    attempts = len({f.name.split("-")[1] for f in out.glob("pid-*")})
    return {"rc": p.returncode, "stderr": p.stderr, "left": left, "rel_err": err, "attempts": attempts,
            "wall_s": wall, "done": json.loads((out / "done").read_text()) if (out / "done").exists() else None}
