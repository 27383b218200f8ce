"""A warm start for one-process test scripts (tests/mpi_util.py: run_script): this process imports torch, its
optimizer machinery (torch._dynamo) and the Trainer once, then forks one child per request. The child is a
process of its own (its own session, environment, working directory, stdin from /dev/null, stdout and stderr
to files) that runs the script as ``python SCRIPT ARGS...`` would (as ``__main__``) and exits as Python does
at the end of a script: an uncaught exception prints its traceback and exits 1, a signal ends it as a signal.

Protocol (files in the server directory): request ``req<k>.json`` {"script", "args", "env", "cwd", "stdout",
"stderr"}; the server writes ``pid<k>`` (the child's pid) and, when the child has ended, ``done<k>.json``
{"returncode"} (negative: the signal that ended it, as subprocess reports it). A file ``stop`` or the death of
the test process ends the server.
"""
import gc
import os
import runpy
import sys
import traceback
from pathlib import Path

import torch

BASE_PATH = list(sys.path[1:])          # what a fresh interpreter has beyond its script's directory
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from warm import answer, next_request  # noqa: E402

import hpc_jabas.runtime.trainer  # noqa: E402,F401  (the start-up every script would otherwise pay)

torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)    # imports torch._dynamo once, here
# what the imports made, out of the collector's sight: a child's collections walk only its own objects (and do
# not touch, and so copy, the pages it shares with this process)
gc.collect()
gc.freeze()
server, owner = Path(sys.argv[1]), int(sys.argv[2])


def _child(r: dict) -> None:
    os.setsid()
    fd_in = os.open(os.devnull, os.O_RDONLY)
    fd_out = os.open(r["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fd_err = os.open(r["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, to in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
        os.dup2(fd, to)
        os.close(fd)
    os.environ.clear()
    os.environ.update(r["env"])
    os.chdir(r["cwd"])
    extra = [p for p in r["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [str(Path(r["script"]).resolve().parent), *extra, *BASE_PATH]
    sys.argv = [r["script"], *r["args"]]
    code = 0
    try:
        runpy.run_path(r["script"], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.exit(code)                       # the interpreter's own exit: atexit handlers, flushed streams


k = 0
while True:
    r = next_request(server, k, owner)
    pid = os.fork()
    if pid == 0:
        _child(r)
    (server / f"pid{k}").write_text(str(pid))
    _, status = os.waitpid(pid, 0)
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    answer(server, f"done{k}.json", {"returncode": rc})
    k += 1
