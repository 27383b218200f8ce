"""Issue 58, item 4: torchrun --max-restarts=N resumes from the last checkpoint exactly, N times in a row, with no
orphaned process and no hang (tests/workers/restart_worker.py: in each of the first N attempts one rank, 0 then
1 then 0, kills itself two iterations after a checkpoint; the survivor's collective fails, it says one line that
names torchrun's restart and ends, torchrun restarts both). The final parameters equal the uninterrupted run's
(tests/reference.py, one process, one big batch per iteration) to 1e-9 relative; every process of every attempt
is gone when torchrun exits 0. bench/faults.py runs the same with N = 3 (``restarts_exact=``)."""
import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from mpi_util import PY, ROOT, WORKERS, mpi_env
from reference import reference_run

#: torchrun's whole run: 60 iterations of a tiny model and N restarts (each a torch start-up), no wall-time claim
BOUND_S = 300


def run_restarts(out: Path, kills: int, max_restarts: int) -> dict:
    """Run the worker under torchrun; return rc, stderr, the pids left alive, and the final parameters' relative
    error against the uninterrupted run (inf when none were written)."""
    (out / "spec.json").write_text(json.dumps({"out_dir": str(out), "kills": kills}))
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_"))}
    cmd = [str(Path(PY).parent / "torchrun"), "--standalone", "--nproc-per-node=2", f"--max-restarts={max_restarts}",
           str(WORKERS / "restart_worker.py"), str(out / "spec.json")]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=BOUND_S)
    wall = time.monotonic() - t0
    time.sleep(1.0)
    pids = [int(f.read_text()) for f in out.glob("pid-*")]
    left = [pid for pid in pids if _alive(pid)]
    err = float("inf")
    if (out / "final.pt").exists():
        got = torch.load(out / "final.pt")
        ref = reference_run({"optimizer": "adam", "lr": 0.01, "plan": "b=4 n=1,1", "steps": 60, "n": 240})
        err = max(float((got[k] - v).abs().max() / (v.abs().max() + 1e-12)) for k, v in ref.items())
    attempts = len({f.name.split("-")[1] for f in out.glob("pid-*")})
    return {"rc": p.returncode, "stderr": p.stderr, "left": left, "rel_err": err, "attempts": attempts,
            "wall_s": wall, "done": json.loads((out / "done").read_text()) if (out / "done").exists() else None}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


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
