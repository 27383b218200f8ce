"""Issue 58, item 4: torchrun --max-restarts=N resumes from the last checkpoint exactly, N times in a row, with no
orphaned process and no hang (tests/workers/restart_worker.py: in each of the first N attempts one rank, 0 then
1 then 0, kills itself two iterations after a checkpoint; the survivor's collective fails, it says one line that
names torchrun's restart and ends, torchrun restarts both). The final parameters equal the uninterrupted run's
(tests/reference.py, one process, one big batch per iteration) to 1e-9 relative; every process of every attempt
is gone when torchrun exits 0. bench/faults.py runs the same with N = 3 (``restarts_exact=``)."""
from pathlib import Path

import pytest
from mpi_util import mpi_env
from reference import reference_run
from support.rank_runs import run_restarts as _run_restarts


def run_restarts(out: Path, kills: int, max_restarts: int) -> dict:
    return _run_restarts(out, kills, max_restarts, mpi_env(), reference_run)

@pytest.mark.mpi
def test_three_restarts_resume_exactly(tmp_path):
    r = run_restarts(tmp_path, kills=3, max_restarts=3)
    assert r["rc"] == 0, r["stderr"][-4000:]
    assert r["attempts"] == 4 and r["done"] == {"attempt": 3, "iteration": 60}, (r["attempts"], r["done"])
    assert r["rel_err"] <= 1e-9, r["rel_err"]
    assert r["left"] == [], f"processes outlived torchrun: {r['left']}"
    ours = [ln for ln in r["stderr"].splitlines() if ln.startswith("hpc-jabas: error:")]
    # one line per failed attempt, from the survivor, naming the rank killed and torchrun's restarts left
    assert [ln.split("rank ", 1)[1].split(" ", 1)[0] for ln in ours] == ["0", "1", "0"], ours
    for left, ln in zip((3, 2, 1), ours):
        assert f"torchrun restarts the workers ({left} of --max-restarts=3 left)" in ln, ln
    assert "Traceback" not in r["stderr"] and "connectFullMesh" not in r["stderr"], r["stderr"][-4000:]
