"""The warm rank pool of the test suite (tests/mpi_util.py: RankPool) stands in for a fresh mpirun launch: a
script run there gives what a launch of its own gives, the run directory it locked is free afterwards, and a
script that fails is an error with the ranks' output, after which the next script gets a new pool."""
import numpy as np
import pytest
from mpi_util import _POOLS, run_ranks

SPEC = {"optimizer": "momentum", "lr": 0.05, "plan": "b=4 n=2,1", "steps": 5, "n": 96, "checkpoint": True}


@pytest.mark.mpi
def test_a_pool_run_equals_a_fresh_launch_and_a_failure_is_reported(tmp_path, monkeypatch):
    pooled = run_ranks("train_worker.py", dict(SPEC, stop_at=5, run_dir=str(tmp_path / "a")), np_=2)
    pool = _POOLS[2]
    # the same run directory again, resumed, from the same pool: the first script's lock was dropped
    again = run_ranks("train_worker.py", dict(SPEC, steps=7, resume=True, run_dir=str(tmp_path / "a")), np_=2)
    assert again[0]["resumed_from"] and again[0]["iterations"] == 7 and _POOLS[2] is pool
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
    assert [r["iterations"] for r in ok] == [2, 2] and _POOLS[2] is not pool
