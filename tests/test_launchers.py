"""runtime/comm/launchers.py: one class per launcher, each detecting itself in a synthetic environment and giving
its rank, local rank, world size and rank 0's address; the detection order where several launchers' variables
are present at once (torchrun in an srun step, mpirun in an allocation, srun with an MPI plugin)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm import launchers as L

TORCHRUN = {"TORCHELASTIC_RUN_ID": "r1", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n1",
            "MASTER_PORT": "29400", "TORCHELASTIC_ERROR_FILE": "/tmp/e.json"}
OMPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
HVD = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "1"}
SRUN = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "2", "SLURM_PROCID": "4", "SLURM_STEP_NUM_TASKS": "6",
        "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "gpuv[2-3],gpua1"}
PMI = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}
PKG = Path(__file__).resolve().parents[1] / "hpc_jabas"
BATCH_SHELL = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "batch", "SLURM_PROCID": "0", "SLURM_NTASKS": "3"}


def _values(ln: L.Launcher) -> tuple:
    return (type(ln).__name__, ln.name, ln.rank, ln.local_rank, ln.world_size, ln.master_addr, ln.master_port)


@pytest.mark.parametrize("env,want", [
    (TORCHRUN, ("Torchrun", "torchrun", 3, 1, 4, "n1", 29400)),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},   # env:// without torchrun
     ("Torchrun", "torchrun", 0, 0, 2, "h", 1)),
    (OMPI, ("OpenMPI", "mpirun", 2, 1, 3, None, None)),
    (HVD, ("Horovodrun", "horovodrun", 1, 1, 3, None, None)),
    (SRUN, ("Srun", "srun", 4, 1, 6, "gpuv2", 20000 + (1234 * 31 + 2) % 20000)),
    (PMI, ("MpichPmi", "mpirun", 1, 1, 2, None, None)),
    (BATCH_SHELL, ("Single", "single", 0, 0, 1, None, None)),
    ({}, ("Single", "single", 0, 0, 1, None, None)),
])
def test_each_launcher_detected_with_its_values(env, want):
    assert _values(L.detect(env)) == want
    assert [c.__name__ for c in L.ORDER if c.detect(env)][0] == want[0]


@pytest.mark.parametrize("env,want", [
    ({**SRUN, **TORCHRUN}, "Torchrun"),           # torchrun inside an srun step: its workers' numbering
    ({**OMPI, **TORCHRUN}, "Torchrun"),           # torchrun started by mpirun
    ({**SRUN, **OMPI}, "OpenMPI"),                 # mpirun inside an allocation (SLURM_* inherited)
    ({**SRUN, **HVD}, "Horovodrun"),               # horovodrun --gloo inside an allocation
    ({**OMPI, **HVD}, "OpenMPI"),                  # horovodrun on mpirun: the two agree, Open MPI's is read
    ({**SRUN, **PMI}, "Srun"),                     # srun --mpi=pmi2 sets PMI_* too: srun's say more
    ({**HVD, "HOROVOD_SIZE": "1"}, "Single"),      # a world of one Horovod rank is no launcher
])
def test_detection_order_where_variables_overlap(env, want):
    assert type(L.detect(env)).__name__ == want


def test_only_the_single_process_detects_in_an_empty_environment():
    assert [c.__name__ for c in L.ORDER if c.detect({})] == ["Single"]
    assert [c.__name__ for c in L.ORDER if c.detect({**SRUN, **OMPI, **TORCHRUN, **HVD, **PMI})] == \
        ["Torchrun", "OpenMPI", "Horovodrun", "Srun", "MpichPmi", "Single"]


def test_srun_heterogeneous_step_and_mpi_plugin():
    het = L.detect({**SRUN, "SLURM_HET_SIZE": "2", "PMIX_RANK": "4"})
    assert isinstance(het, L.Srun)
    assert (het.heterogeneous, het.mpi_plugin, het.master_addr) == (True, True, None)
    plain = L.detect(SRUN)
    assert isinstance(plain, L.Srun) and (plain.heterogeneous, plain.mpi_plugin) == (False, False)


def test_torchrun_error_file_and_defaults():
    ln = L.detect({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "1"})
    assert isinstance(ln, L.Torchrun)
    assert (ln.local_rank, ln.master_addr, ln.master_port, ln.error_file) == (0, None, None, None)
    ln2 = L.detect(TORCHRUN)
    assert isinstance(ln2, L.Torchrun) and ln2.error_file == "/tmp/e.json"


@pytest.mark.parametrize("env,shown", [
    ({**OMPI, "OMPI_COMM_WORLD_SIZE": "three"}, "OMPI_COMM_WORLD_SIZE='three'"),
    ({**TORCHRUN, "RANK": "-1"}, "RANK='-1'"),
    ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2"}, "RANK=''"),
    ({**HVD, "HOROVOD_LOCAL_RANK": "x"}, "HOROVOD_LOCAL_RANK='x'"),
])
def test_a_garbled_variable_is_one_line_naming_it(env, shown):
    ln = L.detect(env)
    with pytest.raises(ConfigError) as ei:
        print(ln.rank, ln.local_rank, ln.world_size)
    assert str(ei.value) == f"{shown} in the environment is invalid; it must be an integer >= 0"


LAUNCHER_VAR = re.compile(r"(RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_\w*|OMPI_COMM_WORLD_\w*"
                          r"|HOROVOD_(RANK|SIZE|LOCAL_RANK)|PMI_RANK|PMI_SIZE|PMI_FD|PMIX_RANK|PMIX_SIZE|MPI_LOCALRANKID)")
#: reads left outside launchers.py, each with its reason: (file, variable)
ELSEWHERE = {
    # slurm/ sits below runtime/ (tests/test_layers.py): whether a submission comes from inside a job or an MPI
    # rank, to drop the launcher's variables from the job's environment
    ("hpc_jabas/slurm/sbatch.py", "OMPI_COMM_WORLD_SIZE"), ("hpc_jabas/slurm/sbatch.py", "PMIX_RANK"),
    ("hpc_jabas/slurm/sbatch.py", "HOROVOD_RANK"),
    # whether mpirun's own stdout is a terminal (an MPI launcher of any kind, PMIx's included)
    ("hpc_jabas/runtime/progress.py", "OMPI_COMM_WORLD_SIZE"), ("hpc_jabas/runtime/progress.py", "PMIX_RANK"),
    ("hpc_jabas/runtime/progress.py", "PMI_RANK"),
}


def launcher_reads(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    doc = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                doc.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in doc and LAUNCHER_VAR.fullmatch(n.value)]


def test_only_launchers_reads_launcher_variables():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel in ("hpc_jabas/runtime/comm/launchers.py", "hpc_jabas/slurm/env.py"):
            continue
        found += [f"{rel}:{line}: {name}" for line, name in launcher_reads(path.read_text())
                  if (rel, name) not in ELSEWHERE]
    assert found == [], "read the launcher's variables through hpc_jabas.runtime.comm.launchers:\n" + "\n".join(found)
