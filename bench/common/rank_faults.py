"""The rank-level fault cases of bench/faults.py, run as tests/test_hung_rank.py and tests/test_restarts.py run
them (their helpers: a user's training script under the real launchers, no mocks):

* hung: SIGSTOP of one rank of a training run (tests/workers/dead_rank_worker.py) once it trained 12 iterations
  and a checkpoint exists, under torchrun, mpirun (torch, the store's host stopped, on 3 ranks; Horovod) and srun
  (two nodes of the local cluster), with the default heartbeat (HPC_JABAS_HEARTBEAT_S unset: 20 s): the seconds
  from the stop to the line, and whether the line named the stopped rank and no other, said once, the launcher
  ended and the stopped process with it;
* restarts: torchrun --max-restarts=3 with one rank killed in each of the first 3 attempts
  (tests/workers/restart_worker.py): exact when the final parameters equal the uninterrupted run's (1e-9), every
  attempt's processes are gone, and each failure's line names the rank killed and torchrun's restarts left.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict:
    from tests.mpi_util import mpi_env
    return {k: v for k, v in mpi_env().items() if not k.startswith(("PMI", "SLURM_", "HPC_JABAS_"))}


def hung_case(work: Path, how: str, slurm_env: dict | None = None) -> dict:
    """One SIGSTOP case (module docstring); ``how``: torchrun | mpirun-torch | mpirun-horovod | srun."""
    from tests.support.rank_runs import PY
    from tests.support.rank_runs import our_lines as _ours
    from tests.support.rank_runs import stop_one as _stop_one
    out = work / f"hung-{how}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, mode=0o777)
    env = _env()
    n, stop, backend = {"torchrun": (2, 1, "torch"), "mpirun-torch": (3, 0, "torch"),
                        "mpirun-horovod": (2, 1, "horovod"), "srun": (2, 1, "torch")}[how]
    if how == "torchrun":
        env = {k: v for k, v in env.items() if not k.startswith("OMPI_")}
        cmd = [str(Path(PY).parent / "torchrun"), "--standalone", "--nproc-per-node=2"]
    elif how.startswith("mpirun"):
        cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", PY]
    else:
        assert slurm_env is not None
        env = dict(slurm_env)
        cmd = ["srun", "-p", "v100", "-N", "2", "-n", "2", "--mpi=none", "--kill-on-bad-exit=1", "-t", "3",
               f"--chdir={ROOT}", f"--export=ALL,PYTHONPATH={ROOT},OMP_NUM_THREADS=1", PY]
    try:
        r = _stop_one(cmd, out, env, n, stop, backend)
    except AssertionError as e:                     # the run never reached the point of the stop
        return {"how": how, "ok": False, "named_s": None, "why": str(e)[-300:]}
    lines = _ours(r["err"])
    named = [int(x) for x in re.findall(r"rank (\d+) of", lines[0])] if lines else []
    right = len(lines) == 1 and named == [stop] and f"rank {stop} of {n} hung" in lines[0]
    ok = right and r["rc"] not in (0, None) and not r["orphan"]
    why = "" if ok else f"lines={lines} rc={r['rc']} orphan={r['orphan']}"
    shutil.rmtree(out, ignore_errors=True)
    return {"how": how, "ok": ok, "right_rank": right, "named_s": r["named_s"], "exit_s": r["exit_s"],
            "line": lines[0] if lines else "", "why": why}


def restarts_case(work: Path, restarts: int = 3) -> dict:
    """torchrun --max-restarts=``restarts`` through ``restarts`` failures (module docstring)."""
    from tests.mpi_util import mpi_env
    from tests.reference import reference_run
    from tests.support.rank_runs import run_restarts
    out = work / "restarts"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    r = run_restarts(out, restarts, restarts, mpi_env(), reference_run)
    ours = [ln for ln in r["stderr"].splitlines() if ln.startswith("hpc-jabas: error:")]
    lines_ok = len(ours) == restarts and all(
        f"torchrun restarts the workers ({restarts - i} of --max-restarts={restarts} left)" in ln
        for i, ln in enumerate(ours))
    ok = (r["rc"] == 0 and r["attempts"] == restarts + 1 and r["rel_err"] <= 1e-9 and not r["left"] and lines_ok)
    shutil.rmtree(out, ignore_errors=True)
    return {"ok": ok, "restarts": restarts, "rel_err": r["rel_err"], "attempts": r["attempts"], "left": r["left"],
            "wall_s": r["wall_s"], "why": "" if ok else f"rc={r['rc']} lines={ours[:4]} {r['stderr'][-300:]}"}
