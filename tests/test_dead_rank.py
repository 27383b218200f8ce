"""A dead rank never leaves the others with a traceback: kill -9 of one rank of a torch-backend training
run under torchrun, mpirun and srun; the survivor ends with exactly one line naming the lost rank (no
traceback), the launcher exits non-zero, and the last checkpoint still loads. On the Horovod backend the launcher
itself ends the job (mpirun's own message, srun's --kill-on-bad-exit, each naming the rank)."""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mpi_util import PY, ROOT, WORKERS, mpi_env
from reference import make_model

from hpc_jabas.runtime.persist.checkpoint import load_latest

#: the survivors' exit, from the kill: a bound, not a timing (today's cause of a hang is the collective timeout)
BOUND_S = 60


def _checkpoints(out: Path) -> list[Path]:
    d = out / "run" / "checkpoints"
    return sorted(d.glob("ckpt-*.pt")) if d.is_dir() else []


def _launch(cmd: list[str], out: Path, env: dict, n: int = 2, kill: int = 1,
            backend: str = "torch") -> tuple[int, str, float]:
    """Start the run, kill -9 rank ``kill`` once every rank trained 12 iterations and a checkpoint exists; return
    (rc, stderr, seconds from the kill to the launcher's exit)."""
    (out / "spec.json").write_text(json.dumps({"out_dir": str(out), "plan": "b=4 n=" + ",".join(["1"] * n),
                                               "backend": backend}))
    with open(out / "stderr", "w") as err:
        p = subprocess.Popen(cmd + [str(WORKERS / "dead_rank_worker.py"), str(out / "spec.json")], env=env,
                             stdout=subprocess.DEVNULL, stderr=err, cwd=str(ROOT))
        try:
            end = time.monotonic() + 240
            while not all((out / f"pid{r}").exists() for r in range(n)) or not _checkpoints(out):
                assert p.poll() is None and time.monotonic() < end, (out / "stderr").read_text()[-3000:]
                time.sleep(0.1)
            time.sleep(0.5)
            os.kill(int((out / f"pid{kill}").read_text()), signal.SIGKILL)
            t0 = time.monotonic()
            rc = p.wait(timeout=BOUND_S + 30)
            return rc, (out / "stderr").read_text(), time.monotonic() - t0
        finally:
            if p.poll() is None:
                p.kill()


def _check(rc: int, err: str, elapsed: float, out: Path, n: int = 2, kill: int = 1) -> None:
    assert rc != 0
    assert elapsed < BOUND_S, elapsed
    ours = [ln for ln in err.splitlines() if ln.startswith("hpc-jabas: error:")]
    speaker = 1 if kill == 0 else 0                 # the lowest surviving rank
    # what happens next: nothing restarts a plain run (torchrun without --max-restarts, mpirun, a bare srun)
    assert len(ours) == 1 and ours[0].startswith(
        f"hpc-jabas: error: rank {kill} of {n} gone (killed, node lost, or no answer within "
        f"HPC_JABAS_TORCH_TIMEOUT_S=300 s); rank {speaker} stops too: nothing restarts it here") and ours[0].endswith(
        "rerun the same command to resume from the last checkpoint"), err
    # no traceback of ours: the only Python frames allowed are torchrun's own agent report (ChildFailedError,
    # which torchrun prints for any failed child, after naming our line as rank 0's error)
    frames = [ln.strip() for ln in err.splitlines() if ln.strip().startswith('File "')]
    assert all("bin/torchrun" in f or "/torch/distributed/" in f for f in frames), err[-3000:]
    assert "RuntimeError" not in err, err[-3000:]
    if kill != 0:        # rank 0 hosts the store: when it dies, torch's C++ layer may warn first (its own lines)
        assert "[rank" not in err and "frame #" not in err, err[-3000:]
    _check_checkpoint(out, kill)


def _check_checkpoint(out: Path, kill: int = 1) -> None:
    """The newest checkpoint loads. Only rank 0 writes: when rank 0 itself is killed, the kill may land between
    the payload's rename and its integrity record's, and then the newest file counts as incomplete and the one
    before it (5 iterations earlier) is what loads; nothing else may be lost."""
    files = _checkpoints(out)
    latest = load_latest(out / "run" / "checkpoints")
    assert latest is not None
    state, path = latest
    torn = kill == 0 and not files[-1].with_name(files[-1].name + ".sha256").exists()
    expected = files[-2] if torn and len(files) > 1 else files[-1]
    assert path == expected and state["iteration"] >= 5 and state["iteration"] % 5 == 0, (path, files)
    make_model().load_state_dict(state["model"])          # the model's weights load into a fresh model


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_kill_9_under_torchrun(tmp_path, n):
    """Three ranks: the survivors agree on the store (torchrun's agent holds it) who is gone; rank 0 says it."""
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_"))}
    rc, err, elapsed = _launch([str(Path(PY).parent / "torchrun"), "--standalone", f"--nproc-per-node={n}"],
                               tmp_path, env, n)
    _check(rc, err, elapsed, tmp_path, n)


@pytest.mark.mpi
@pytest.mark.parametrize("n,kill", [(2, 1), (3, 0)])
def test_kill_9_under_mpirun(tmp_path, n, kill):
    """(3, 0): rank 0 holds the rendezvous store; the survivors find it gone and name rank 0."""
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("PMI", "SLURM_", "HPC_JABAS_"))}
    rc, err, elapsed = _launch(["mpirun", "-np", str(n), "--oversubscribe", PY], tmp_path, env, n, kill)
    _check(rc, err, elapsed, tmp_path, n, kill)


@pytest.mark.mpi
def test_kill_9_on_horovod_under_mpirun(tmp_path):
    """The Horovod backend: Open MPI's mpirun ends the whole job when a rank dies (its own message names the
    rank; the survivors are killed before they could say anything), within the bound, with no traceback of
    ours, and the last checkpoint loads."""
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("PMI", "SLURM_", "HPC_JABAS_"))}
    rc, err, elapsed = _launch(["mpirun", "-np", "2", "--oversubscribe", PY], tmp_path, env, 2, 1, "horovod")
    assert rc != 0 and elapsed < BOUND_S, (rc, elapsed)
    assert "process rank 1" in err and "signal 9" in err, err[-3000:]
    assert "Traceback" not in err and not [ln for ln in err.splitlines() if ln.strip().startswith('File "')], err
    _check_checkpoint(tmp_path)


@pytest.mark.slurm
def test_kill_9_under_srun(slurm_cluster, slurm_tmp):
    """The torch backend under srun on the local Slurm cluster, two nodes, no MPI plugin: the survivor says the
    one line, srun adds its own and exits non-zero, and the last checkpoint loads."""
    cmd = ["srun", "-p", "v100", "-N", "2", "-n", "2", "--mpi=none", "-t", "3", f"--chdir={ROOT}",
           f"--export=ALL,PYTHONPATH={ROOT},OMP_NUM_THREADS=1", PY]
    rc, err, elapsed = _launch(cmd, slurm_tmp, dict(slurm_cluster.env), 2, 1)
    assert re.search(r"srun: error: \S+: task 1: Killed", err), err[-3000:]
    _check(rc, err, elapsed, slurm_tmp)


@pytest.mark.slurm
def test_kill_9_on_horovod_under_srun(slurm_cluster, slurm_tmp):
    """The Horovod backend under srun with the PMIx plugin and --kill-on-bad-exit=1 (as the job files run it), on
    two nodes: srun names the killed task and ends the other, within the bound, with no traceback of ours, and the
    last checkpoint loads."""
    cmd = ["srun", "-p", "v100", "-N", "2", "-n", "2", "--mpi=pmix", "--kill-on-bad-exit=1", "-t", "3",
           f"--chdir={ROOT}", f"--export=ALL,PYTHONPATH={ROOT},OMP_NUM_THREADS=1", PY]
    rc, err, elapsed = _launch(cmd, slurm_tmp, dict(slurm_cluster.env), 2, 1, "horovod")
    assert rc != 0 and elapsed < BOUND_S, (rc, elapsed, err[-3000:])
    assert re.search(r"srun: error: \S+: task 1: Killed", err), err[-3000:]
    assert "Traceback" not in err and not [ln for ln in err.splitlines() if ln.strip().startswith('File "')], err
    _check_checkpoint(slurm_tmp)
