"""Shared test set-up: tests/ on sys.path, the Slurm fixtures, and the markers (mpi, slurm)."""
import gc
import os
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from slurm_env import cluster_lock, slurm_cluster, slurm_tmp  # noqa: E402,F401  (fixtures shared by the Slurm tests)

# The test process itself is never ended by Python code under test: an ``os._exit`` called in this process (not
# in a child it forked: DataLoader workers, the fork server's scripts) raises instead, with its traceback (from a
# background thread, pytest reports it as an unhandled thread exception). A pytest-xdist worker that dies is
# "node down: Not properly terminated" with no trace, and the session then waits for it for ever. (The one such
# death found so far was not this: a test shut Horovod down in the test process, which finalised MPI, and the next
# in-process Horovod exited in MPI_Init; tests/test_backend_protocol.py no longer does.)
_TEST_PID, _real_exit = os.getpid(), os._exit


def _exit_in_the_test_process(code: int) -> None:
    if os.getpid() != _TEST_PID:
        _real_exit(code)
    import traceback
    stack = "".join(traceback.format_stack(limit=12))
    sys.stderr.write(f"os._exit({code}) called in the test process:\n{stack}")
    raise SystemError(f"os._exit({code}) called in the test process (tests/conftest.py):\n{stack}")


os._exit = _exit_in_the_test_process


# The test process's cyclic garbage collector: after collection the process holds every test module and torch
# (several hundred thousand objects), and each full collection walked them all: a third of a small session's own
# CPU went to the collector. Off while the test modules import; collected once and frozen after collection, it
# walks only what the tests make.
gc.disable()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()
    gc.enable()


# Every Python process of this environment collects garbage ten times less often while the suite runs. Most of
# the suite's CPU is several hundred rank processes importing torch, and at Python's default (a collection every
# 700 allocations) a fifth of an import was full collections walking what was imported so far (torch,
# torch._dynamo, horovod.torch and hpc_jabas: 2.9 CPU-s at 700, 2.4 at 7,000, the same peak memory). A .pth
# line in the environment's site-packages reaches every process that runs this interpreter: mpirun's and
# torchrun's ranks, the Slurm jobs', the CLIs and the README's, whatever environment their launch builds.
# A test that measures memory collects first (tests/workers/optim_worker.py). The controller writes the file and
# removes it at the end.
_GC_PTH = Path(sysconfig.get_paths()["purelib"]) / "hpc_jabas_test_gc.pth"


def pytest_configure(config):
    if not hasattr(config, "workerinput"):            # the xdist controller, or a run without xdist
        # never through a link someone put in its place
        fd = os.open(_GC_PTH, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write("import gc; gc.set_threshold(7000, 10, 10)\n")
    config.addinivalue_line("markers", "mpi: starts several Horovod ranks (mpirun or horovodrun --gloo)")
    config.addinivalue_line("markers", "slurm: needs the local Slurm cluster (started by the fixture)")
    config.addinivalue_line("markers", "slurm_exclusive: changes what other Slurm tests see (drains, fills or "
                            "preempts a partition, counts free GPUs): holds the cluster's test lock exclusively")


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        _GC_PTH.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _slurm_test_lock(request):
    """Slurm tests share the cluster, on every xdist worker at once: shared lock, or exclusive when marked."""
    if "slurm_cluster" not in request.fixturenames:
        yield
        return
    with cluster_lock(request.getfixturevalue("slurm_cluster"),
                      exclusive=request.node.get_closest_marker("slurm_exclusive") is not None):
        yield


#: the Slurm modules that take longest (minutes), started first
LONGEST_FIRST = {"test_readme": 0, "test_demo": 1, "test_slurm_lifecycle": 2, "test_slurm_failure": 3}


@pytest.hookimpl(tryfirst=True)          # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs ``-n 2 --dist loadgroup``):
    - a module-scoped fixture (one launch or one Slurm chain shared by the module's tests) runs once per worker
      that gets one of its tests, so such a module's tests stay on one worker;
    - the Slurm tests run on both workers under the cluster's test lock (_slurm_test_lock): the shared ones
      first (the longest units of work start at once), the exclusive ones last, in one group, when the shared
      ones are done and so do not leave a worker waiting for the lock; the rest in between."""
    for item in items:
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if any(d.scope == "module" and getattr(d.func, "__module__", None) == item.module.__name__
               for ds in defs.values() for d in ds):
            item.add_marker(pytest.mark.xdist_group(f"module-{item.module.__name__}"))
    uses = [("slurm_cluster" in getattr(it, "fixturenames", ()), it.get_closest_marker("slurm_exclusive") is not None)
            for it in items]
    shared = [it for it, (s, x) in zip(items, uses) if s and not x]
    shared.sort(key=lambda it: LONGEST_FIRST.get(it.module.__name__, len(LONGEST_FIRST)))   # stable
    exclusive = [it for it, (s, x) in zip(items, uses) if s and x]
    for item in exclusive:
        item.add_marker(pytest.mark.xdist_group("slurm-exclusive"))
    items[:] = shared + [it for it, (s, _) in zip(items, uses) if not s] + exclusive


# ---- optional: CPU seconds per test (HPC_JABAS_TEST_CPU=FILE appends one JSON line per test) ------
# The test process's own CPU plus that of the children it waited for (mpirun and its ranks, CLI
# subprocesses); a Slurm job's ranks run under slurmd and are not counted. ``machine_cpu_s`` is the whole
# machine's busy CPU time over the test (/proc/stat): everything the test caused (Slurm jobs, warm pools,
# daemons) when the tests run one at a time (-p no:xdist), anything else running too otherwise. For sizing
# the suite.
_CPU_FILE = os.environ.get("HPC_JABAS_TEST_CPU")
if _CPU_FILE:
    import json
    import resource
    import time

    def _cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    def _machine_cpu() -> float:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")     # all but idle and iowait

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        c0, m0, t0 = _cpu(), _machine_cpu(), time.time()
        yield
        with open(_CPU_FILE, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu_s": round(_cpu() - c0, 2),
                                "machine_cpu_s": round(_machine_cpu() - m0, 2),
                                "wall_s": round(time.time() - t0, 2), "end": round(time.time(), 2),
                                "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}) + "\n")

