"""Shared by the benchmarks: re-run the calling benchmark under mpirun with N ranks when needed, and profile a model
before a benchmark's MPI world starts. The benchmarks run from the repository root as ``python -m bench.NAME``; the
ranks they start import ``bench`` and ``hpc_jabas`` from ROOT (on their PYTHONPATH)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def in_mpi_world() -> bool:
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "HOROVOD_RANK" in os.environ


def _mpi_env() -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HPC_JABAS_PROGRESS="0",
               OMPI_MCA_mpi_yield_when_idle="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def self_command() -> list[str]:
    """The arguments after the interpreter that start this process's main module again: ``-m bench.NAME`` when it
    was started as a module (how the benchmarks run), else its script path."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return ["-m", spec.name] if spec is not None and spec.name else [sys.argv[0]]


def _mpirun(n: int) -> list[str]:
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(n), sys.executable]


def ensure_ranks(n: int) -> None:
    """If not already inside an MPI world, re-exec this script as `mpirun -np n` and exit with its code."""
    if in_mpi_world():
        return
    sys.exit(subprocess.call([*_mpirun(n), *self_command(), *sys.argv[1:]], env=_mpi_env()))


def profile_emulated(what: str, model: str, gpu_types: list[str], base_s: float, per_sample_s: float, out: Path,
                     *extra: str) -> None:
    """`hpc-jabas profile --emulate` of MODULE:CALLABLE ``model`` over one rank per GPU type, written to ``out``:
    what a user runs once per model and cluster, so a benchmark plans on a measured profile. Run it before the
    benchmark's own MPI world starts. A failure stops the benchmark with one line naming ``what``."""
    cmd = [*_mpirun(len(gpu_types)), "-m", "hpc_jabas.cli", "profile", "--quiet", "--model", model, "--emulate",
           "--gpu-type", ",".join(gpu_types), "--base-s", str(base_s), "--per-sample-s", str(per_sample_s),
           *extra, "--out", str(out)]
    r = subprocess.run(cmd, env=_mpi_env(), capture_output=True, text=True)
    if r.returncode != 0:
        said = [ln for ln in r.stderr.splitlines() if ln.strip() and set(ln.strip()) != {"-"}]   # not mpirun's rules
        raise SystemExit(f"{Path(sys.argv[0]).stem}: profiling {what} failed (rc={r.returncode}): "
                         f"{' | '.join(said[-3:])}")


def load_note() -> str:
    """This machine's 1-minute load average and core count, for the min/max line (shared machines are noisy)."""
    return f"load1={os.getloadavg()[0]:.1f}/{os.cpu_count()}cores"
