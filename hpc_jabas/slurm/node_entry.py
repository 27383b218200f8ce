"""What every rank of a method-"submitit" job runs on the node, in place of submitit's own
``python -u -m submitit.core._submit FOLDER``: the same thing, once the submitted pickle has passed the owner
and mode checks (hpc_jabas/trust.py).

submitit unpickles ``FOLDER/<job id>_submitted.pkl`` before any hpc-jabas code runs, and a pickle is code: one
that another user owns, or that sits in a directory others can write (so that it could have been swapped
between sbatch and the job's start), is refused here with one line on stderr and exit code 2, and nothing of
it is loaded. The check is made on the open file (hpc_jabas/trust.py ``open_trusted``), once it has appeared:
a file that vanished after it appeared is not passed unchecked. submitit then opens it again by name; that is
safe because the check covered its directory and every one above it (no one else can write them, so no one
else can put another file under that name). The executor (hpc_jabas/slurm/executor.py:
``JabasSlurmExecutor._submitit_command_str``) writes this module into the job script.

The process's umask loses group and world write (group write kept with group trust), so that the pickles
submitit writes here (the result, the requeued job's pickle) pass the same check when they are read back.
"""
from __future__ import annotations

import os
import sys
import time

from hpc_jabas.trust import UntrustedFileError, open_trusted, trust_group

#: what the job script runs: ``<python> -u -m NODE_ENTRY <folder>``
NODE_ENTRY = "hpc_jabas.slurm.node_entry"
WAIT_S = 60                       # as submitit's own process_job: the pickle is moved in after sbatch returns


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {NODE_ENTRY} FOLDER", file=sys.stderr)
        return 2
    folder = args[0]
    os.environ["SUBMITIT_FOLDER"] = folder
    from submitit.core import job_environment

    paths = job_environment.JobEnvironment().paths
    pkl = paths.submitted_pickle
    for _ in range(WAIT_S):
        if pkl.exists():
            break
        time.sleep(1)
    if not pkl.exists():
        print(f"hpc-jabas: the submitted job {str(pkl)!r} did not appear within {WAIT_S} s", file=sys.stderr)
        return 2
    try:              # the file that is there now and its directories: a missing one is never passed unchecked
        open_trusted(pkl, "submitted job pickle").close()
    except UntrustedFileError as e:
        print(f"hpc-jabas: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"hpc-jabas: the submitted job {str(pkl)!r} cannot be read ({e.strerror or type(e).__name__})",
              file=sys.stderr)
        return 2
    old = os.umask(0o077)
    os.umask(old | (0o002 if trust_group() else 0o022))
    from submitit.core.submission import process_job
    process_job(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
