"""Issue 58, item 3: a hung rank (SIGSTOP: a stopped process, as a frozen node or a stuck host thread looks to the
others) is named within seconds by the others' heartbeat watchdog, not after the collective timeout (300 s).

A training run (tests/workers/dead_rank_worker.py) under torchrun, mpirun (torch and Horovod backends) and srun;
once every rank trained 12 iterations and a checkpoint exists, one rank gets SIGSTOP. Then:

* exactly one ``hpc-jabas: error:`` line comes, naming the stopped rank and no other, within the bound (the
  default heartbeat, 20 s, in one mpirun case: the issue's <= 30 s; a short one elsewhere, to keep the file quick);
* the line says what happens next: nothing restarts a plain run, so "rerun the same command";
* the launcher exits non-zero, and the stopped process is gone with it (no orphan);
* the last checkpoint still loads.
"""
import re
from pathlib import Path

import pytest
from mpi_util import PY, ROOT, mpi_env
from support.rank_runs import EXIT_BOUND_S, NAMED_BOUND_S
from support.rank_runs import our_lines as _ours
from support.rank_runs import stop_one as _stop_one

from hpc_jabas.runtime.persist.checkpoint import load_latest


def _check(res: dict, out: Path, n: int, stop: int, bound: float = NAMED_BOUND_S) -> str:
    err = res["err"]
    lines = _ours(err)
    assert res["named_s"] is not None and res["named_s"] <= bound, (res["named_s"], err[-3000:])
    assert len(lines) == 1, err[-3000:]
    named = [int(r) for r in re.findall(r"rank (\d+) of", lines[0])]
    assert named == [stop], lines
    assert f"rank {stop} of {n} hung" in lines[0] and "rerun the same command" in lines[0], lines
    assert res["rc"] not in (0, None) and res["exit_s"] <= bound + EXIT_BOUND_S, (res["rc"], res["exit_s"])
    assert not res["orphan"], "the stopped rank outlived its launcher"
    # no traceback of ours: the only Python frames allowed are torchrun's own report (ChildFailedError)
    frames = [ln.strip() for ln in err.splitlines() if ln.strip().startswith('File "')]
    assert all("bin/torchrun" in f or "/torch/distributed/" in f for f in frames), err[-3000:]
    latest = load_latest(out / "run" / "checkpoints")
    assert latest is not None and latest[0]["iteration"] >= 5, latest
    return lines[0]


def _env(**extra: str) -> dict:
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("PMI", "SLURM_", "HPC_JABAS_"))}
    env.update(extra)
    return env


@pytest.mark.mpi
def test_stopped_rank_named_under_torchrun(tmp_path):
    """torchrun ends the stopped worker 30 s after the line (its SIGTERM waits for a process that runs)."""
    env = {k: v for k, v in _env(HPC_JABAS_HEARTBEAT_S="6").items() if not k.startswith("OMPI_")}
    res = _stop_one([str(Path(PY).parent / "torchrun"), "--standalone", "--nproc-per-node=2"], tmp_path, env, 2, 1)
    _check(res, tmp_path, 2, 1, bound=20)


@pytest.mark.mpi
@pytest.mark.parametrize("n,stop,backend,hb", [(3, 0, "torch", "6"), (2, 1, "horovod", "6")])
def test_stopped_rank_named_under_mpirun(tmp_path, n, stop, backend, hb):
    """(3, 0): rank 0 hosts the store (torch) and is the one stopped: rank 1 names it. (2, 1, horovod): Horovod's
    own stall check only warns; the watchdog names the rank. Neither the stopped rank, nor a rank that mpirun ends,
    blames a live one. The default heartbeat (20 s; the issue's goal: named within 30 s) is bench.faults'
    ``hung_rank_named_s`` on every launcher (a sweep: not repeated here)."""
    res = _stop_one(["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", PY], tmp_path,
                    _env(**({"HPC_JABAS_HEARTBEAT_S": hb} if hb else {})), n, stop, backend)
    _check(res, tmp_path, n, stop, bound=NAMED_BOUND_S if not hb else 20)


@pytest.mark.slurm
@pytest.mark.parametrize("mpi,backend", [("none", "torch")])
def test_stopped_rank_named_under_srun(slurm_cluster, slurm_tmp, mpi, backend):
    """Two nodes of the local cluster, as the job files run srun (--kill-on-bad-exit=1). (Horovod under srun takes
    the same path as under mpirun: bench.faults runs it.)"""
    cmd = ["srun", "-p", "v100", "-N", "2", "-n", "2", f"--mpi={mpi}", "--kill-on-bad-exit=1", "-t", "3",
           f"--chdir={ROOT}", f"--export=ALL,PYTHONPATH={ROOT},OMP_NUM_THREADS=1,HPC_JABAS_HEARTBEAT_S=6", PY]
    res = _stop_one(cmd, slurm_tmp, dict(slurm_cluster.env), 2, 1, backend)
    _check(res, slurm_tmp, 2, 1, bound=20)
