"""Invariants 5-6: exact resume (same and different rank count); nothing half-written."""
import os

import pytest
import torch
from mpi_util import run_ranks, run_ranks_cases
from reference import reference_run
from test_equivalence import assert_params_close

from hpc_jabas.errors import CheckpointError
from hpc_jabas.runtime.persist import checkpoint as ckpt


def test_atomic_save_and_checksum(tmp_path):
    p = ckpt.save(tmp_path / "a.pt", {"x": torch.arange(5), "y": "z"})
    assert ckpt.load(p)["y"] == "z"
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]       # no temporary left behind
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])                               # truncated
    with pytest.raises(CheckpointError, match="truncated|corrupted"):
        ckpt.load(p)
    p.write_bytes(data[:-3] + bytes([data[-3] ^ 0xFF]) + data[-2:])     # one flipped byte
    with pytest.raises(CheckpointError, match="corrupted"):
        ckpt.load(p)


def test_load_latest_falls_back_to_previous_good(tmp_path):
    for it in (10, 20, 30):
        ckpt.save_in(tmp_path, {"it": it}, epoch=0, iteration=it, keep=3)
    newest = ckpt.list_checkpoints(tmp_path)[-1]
    newest.write_bytes(newest.read_bytes()[:100])
    msgs = []
    state, path = ckpt.load_latest(tmp_path, log=msgs.append)
    assert state == {"it": 20} and path.name == ckpt.name_for(0, 20)
    assert len(msgs) == 1 and "skipping bad checkpoint" in msgs[0] and newest.name in msgs[0]
    for p in ckpt.list_checkpoints(tmp_path):
        p.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        ckpt.load_latest(tmp_path, log=msgs.append)
    assert ckpt.load_latest(tmp_path / "none") is None


def test_keep_prunes_old(tmp_path):
    for it in range(6):
        ckpt.save_in(tmp_path, {"it": it}, epoch=0, iteration=it, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == [ckpt.name_for(0, 4), ckpt.name_for(0, 5)]


#: (ranks, plan, backend of the resumed run): the run stops on the default backend (Horovod where built); the
#: third case resumes it on torch.distributed (a checkpoint does not depend on the backend that wrote it)
RESUMES = [(3, "b=4 n=1,3,4", None), (2, "b=4 n=3,5", None), (3, "b=4 n=2,2,4", "torch")]


def _base(run_dir) -> dict:
    return {"optimizer": "adam", "lr": 0.01, "plan": "b=4 n=1,3,4", "steps": 20, "n": 256, "run_dir": str(run_dir)}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> list[tuple[dict, list[dict]]]:
    """One 3-rank launch stops a run at iteration 11 in one run directory per resume case."""
    root = tmp_path_factory.mktemp("resume")
    bases = [_base(root / f"run{k}") for k in range(len(RESUMES))]
    return list(zip(bases, run_ranks_cases("train_worker.py", [dict(b, stop_at=11) for b in bases], np_=3)))


@pytest.mark.mpi
@pytest.mark.parametrize("k", range(len(RESUMES)), ids=[f"{n}-{p}-{b or 'auto'}" for n, p, b in RESUMES])
def test_resume_is_exact(stopped, k):
    """Stop mid-epoch at iteration 11, resume (same or other rank count, same B) to 20:
    parameters equal those of the uninterrupted single-process run."""
    resume_np, resume_plan, backend = RESUMES[k]
    base, first = stopped[k]
    assert all(r["iterations"] == 11 for r in first)
    assert first[0]["sampler"]["cursor"] == 3 * 32 and first[0]["sampler"]["epoch"] == 1
    second = run_ranks("train_worker.py", dict(base, plan=resume_plan, resume=True), np_=resume_np, backend=backend)
    ref = reference_run(base)
    for r in second:
        assert r["resumed_from"] and r["iterations"] == 20
        assert backend is None or r["backend"] == backend
        assert_params_close(r["params"], ref)
