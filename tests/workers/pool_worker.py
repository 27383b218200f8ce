"""One rank of a warm rank pool (tests/mpi_util.py: RankPool): it pays the torch and Horovod start-up once, then
runs worker scripts of tests/workers one after another, each as ``python SCRIPT SPEC`` would (run as
``__main__`` with that argv), for as long as the test process that started the pool lives. After each script
the run and chain directory locks it took are released, as the end of its process would.

Protocol (files in the pool directory, a local disk): request ``req<k>.json`` {"script", "spec", "log_dir"}; each
rank runs it with its stdout/stderr in ``log_dir/rank<r>.log`` and then writes ``done<k>-<r>.json`` {"ok", "error"}.
A file ``stop`` (or the death of the test process) ends the pool. Between scripts Horovod is shut down (MPI stays
up, initialised by mpi4py), so that an idle pool takes no CPU and each script starts Horovod as a new process
would.
"""
import gc
import os
import runpy
import sys
import traceback
from pathlib import Path

import torch
from mpi4py import MPI  # noqa: F401  (MPI initialised here, so that Horovod can shut down and start again)

pool, owner = Path(sys.argv[1]), int(sys.argv[2])
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from warm import answer, next_request  # noqa: E402

from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.persist import dirlock  # noqa: E402

_opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)    # imports torch._dynamo once, here
# what the imports made, out of the collector's sight: its collections walk only what each script makes
gc.collect()
gc.freeze()


k = 0
out_fd, err_fd = os.dup(1), os.dup(2)
while True:
    r = next_request(pool, k, owner)
    log = open(Path(r["log_dir"]) / f"rank{rank}.log", "w")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    argv, path, cwd = sys.argv, list(sys.path), os.getcwd()
    sys.argv = [r["script"], r["spec"]]
    ok, error = True, None
    try:
        runpy.run_path(r["script"], run_name="__main__")
    except SystemExit as e:
        ok = e.code in (None, 0)
        error = None if ok else f"SystemExit({e.code!r})"
    except BaseException:
        ok, error = False, traceback.format_exc()
        print(error, file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        log.close()
        sys.argv, sys.path[:] = argv, path
        os.chdir(cwd)
        for held in list(dirlock._HELD.values()):    # what the end of a process would drop
            held.release()
        # Horovod stopped between scripts: an idle Horovod's background thread polls MPI (about half a core
        # per rank here), and the next script's comm.init() starts it afresh, as in a new process
        comm.shutdown()
        # what the script left in reference cycles (its module's functions and globals hold each other, and so its
        # model and buffers), freed now, as the end of its process would free it
        gc.collect()
    answer(pool, f"done{k}-{rank}.json", {"ok": ok, "error": error})
    k += 1
