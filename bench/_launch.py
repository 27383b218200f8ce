"""Shared by the benchmarks: re-run the calling script under mpirun with N ranks when needed."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ensure_ranks(n: int) -> None:
    """If not already inside an MPI world, re-exec this script as `mpirun -np n` and exit with its code."""
    if "OMPI_COMM_WORLD_SIZE" in os.environ or "HOROVOD_RANK" in os.environ:
        return
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HPC_JABAS_PROGRESS="0",
               OMPI_MCA_mpi_yield_when_idle="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(n), sys.executable, sys.argv[0], *sys.argv[1:]]
    sys.exit(subprocess.call(cmd, env=env))


def load_note() -> str:
    """This machine's 1-minute load average and core count, for the min/max line (shared machines are noisy)."""
    return f"load1={os.getloadavg()[0]:.1f}/{os.cpu_count()}cores"
