"""The warm starts of the test suite stand in for fresh processes.

- The rank pool (tests/mpi_util.py: RankPool) for a fresh mpirun launch: a script run there gives what a launch of
  its own gives, the run directory it locked is free afterwards, and a script that fails is an error with the
  ranks' output, after which the next script gets a new pool.
- The fork server (run_script) for ``python SCRIPT ARGS``: the same exit code (exit, uncaught exception,
  signal), stdout, stderr, working directory, environment and empty stdin as a fresh interpreter.
"""
import numpy as np
import pytest
from mpi_util import _POOLS, run_ranks

SPEC = {"optimizer": "momentum", "lr": 0.05, "plan": "b=4 n=2,1", "steps": 5, "n": 96, "checkpoint": True}


@pytest.mark.mpi
def test_a_pool_run_equals_a_fresh_launch_and_a_failure_is_reported(tmp_path, monkeypatch):
    pooled = run_ranks("train_worker.py", dict(SPEC, stop_at=5, run_dir=str(tmp_path / "a")), np_=2)
    pool = _POOLS[2, None]
    # the same run directory again, resumed, from the same pool: the first script's lock was dropped
    again = run_ranks("train_worker.py", dict(SPEC, steps=7, resume=True, run_dir=str(tmp_path / "a")), np_=2)
    assert again[0]["resumed_from"] and again[0]["iterations"] == 7 and _POOLS[2, None] is pool
    monkeypatch.setenv("HPC_JABAS_TEST_POOL", "0")
    fresh = run_ranks("train_worker.py", dict(SPEC, stop_at=5, run_dir=str(tmp_path / "b")), np_=2)
    for p, f in zip(pooled, fresh):
        assert p["history"] == f["history"]
        for k in p["params"]:
            assert np.array_equal(np.array(p["params"][k]), np.array(f["params"][k])), k
    monkeypatch.delenv("HPC_JABAS_TEST_POOL")
    with pytest.raises(AssertionError, match="ValueError: nope"):
        run_ranks("train_worker.py", dict(SPEC, optimizer="nope", run_dir=str(tmp_path / "c")), np_=2, timeout=60)
    assert not pool.alive()                      # a failed script closes its pool; the next one starts anew
    ok = run_ranks("train_worker.py", dict(SPEC, steps=2, run_dir=str(tmp_path / "d")), np_=2)
    assert [r["iterations"] for r in ok] == [2, 2] and _POOLS[2, None] is not pool


SCRIPT = """import os, signal, sys
print(os.getcwd(), os.environ.get("HJ_PROBE"), sys.argv[1:], sys.stdin.read() == "")
print("to stderr", file=sys.stderr)
how = sys.argv[1]
if how == "exit":
    sys.exit(3)
if how == "raise":
    raise ValueError("bad")
if how == "signal":
    os.kill(os.getpid(), signal.SIGTERM)
"""


@pytest.mark.parametrize("how", ["ok", "exit", "raise", "signal"])
def test_a_forked_script_ends_like_a_fresh_interpreter(tmp_path, monkeypatch, how):
    import os
    import subprocess
    import sys

    from mpi_util import run_script
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, HJ_PROBE="seen", OMP_NUM_THREADS="1")
    forked = run_script([str(script), how], env=env, cwd=str(tmp_path), timeout=60)
    fresh = subprocess.run([sys.executable, str(script), how], env=env, cwd=str(tmp_path), capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert forked.returncode == fresh.returncode == {"ok": 0, "exit": 3, "raise": 1, "signal": -15}[how]
    assert forked.stdout == fresh.stdout == f"{tmp_path} seen ['{how}'] True\n"
    assert forked.stderr.splitlines()[0] == "to stderr" and forked.stderr.splitlines()[-1:] == \
        fresh.stderr.splitlines()[-1:]
