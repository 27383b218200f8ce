"""Shared test set-up: tests/ on sys.path, the Slurm fixtures, and the markers (mpi, slurm)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from slurm_env import slurm_cluster, slurm_tmp  # noqa: E402,F401  (fixtures shared by the Slurm tests)


def pytest_configure(config):
    config.addinivalue_line("markers", "mpi: starts several Horovod ranks (mpirun or horovodrun --gloo)")
    config.addinivalue_line("markers", "slurm: needs the local Slurm cluster (started by the fixture)")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs ``-n 2 --dist loadgroup``) every test that uses the local Slurm
    cluster goes to one worker, in file order: they share one cluster, and some drain nodes or fill
    partitions on purpose. The other worker takes the rest (unit, hypothesis and multi-rank tests)."""
    import pytest
    slurm = [it for it in items if "slurm_cluster" in getattr(it, "fixturenames", ())]
    for item in slurm:
        item.add_marker(pytest.mark.xdist_group("slurm"))
    # the Slurm group is the longest unit of work: collected first, so one worker starts on it at once
    # (their relative order, and the other tests' order, stay as collected)
    ids = {id(it) for it in slurm}
    items[:] = slurm + [it for it in items if id(it) not in ids]


# ---- optional: CPU seconds per test (HPC_JABAS_TEST_CPU=FILE appends one JSON line per test) ------
# The test process's own CPU plus that of the children it waited for (mpirun and its ranks, CLI
# subprocesses); a Slurm job's ranks run under slurmd and are not counted. For sizing the suite.
_CPU_FILE = os.environ.get("HPC_JABAS_TEST_CPU")
if _CPU_FILE:
    import json
    import resource
    import time

    import pytest

    def _cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        c0, t0 = _cpu(), time.time()
        yield
        with open(_CPU_FILE, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu() - c0, 2),
                                "wall_s": round(time.time() - t0, 2)}) + "\n")
