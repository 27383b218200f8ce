"""Issue 36, finding 3: a resume continues every rank's own random streams (torch's CPU generator, numpy,
Python's ``random``; CUDA per device where there is one). A 2-rank run with dropout, stopped at a checkpoint and
resumed in a fresh Trainer whose generators were seeded otherwise, ends bit-identical to its uninterrupted
twin."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from mpi_util import run_ranks

from hpc_jabas.runtime import resume


@pytest.mark.mpi
def test_resume_with_dropout_is_bit_identical_on_two_ranks(tmp_path):
    steps, stop = 24, 10
    cases = [{"run_dir": str(tmp_path / "twin"), "steps": steps, "seed": 100},
             {"run_dir": str(tmp_path / "cut"), "steps": steps, "stop_at": stop, "seed": 100},
             {"run_dir": str(tmp_path / "cut"), "steps": steps, "resume": True, "seed": 5000}]
    run_ranks("first_day_worker.py", {"cases": cases}, np_=2, _out_dir=str(tmp_path))
    res = [[json.loads((tmp_path / f"case{k}-rank{r}.json").read_text()) for r in range(2)] for k in range(3)]
    twin, cut, resumed = res
    assert [r["iterations"] for r in cut] == [stop, stop]
    assert all(r["resumed_from"] and r["iterations"] == steps for r in resumed)
    diff = max(float((torch.tensor(twin[0]["params"][n]) - torch.tensor(resumed[0]["params"][n])).abs().max())
               for n in twin[0]["params"])
    assert diff == 0.0, f"resumed run differs from its uninterrupted twin by {diff}"
    assert resumed[0]["params"] == resumed[1]["params"]           # and the ranks agree
    moved = max(float((torch.tensor(twin[0]["params"][n]) - torch.tensor(cut[0]["params"][n])).abs().max())
                for n in twin[0]["params"])
    assert moved > 0                                               # the last 14 iterations did train


def test_each_rank_restores_its_own_states_and_old_checkpoints_still_load():
    def draws():
        return (torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)])
    states = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        states.append(resume.rng_states())
    expect = []
    for r in range(2):
        resume.restore_rng({"ranks": states}, r)
        expect.append(draws())
    assert expect[0] != expect[1]
    for r in (1, 0):
        torch.manual_seed(99)
        assert resume.restore_rng({"ranks": states}, r) == "own"
        assert draws() == expect[r]
    torch.manual_seed(99)
    before = torch.get_rng_state()
    assert resume.restore_rng({"ranks": states}, 2) == "kept" and torch.equal(torch.get_rng_state(), before)
    old = {"torch": states[0]["torch"], "numpy": states[0]["numpy"], "python": states[0]["python"], "cuda": None}
    assert resume.restore_rng(old, 1) == "rank 0" and draws() == expect[0]


def test_every_devices_cuda_state_goes_back_to_its_rank(monkeypatch):
    """No GPU here: torch.cuda is faked to show which device states each rank gets back."""
    dev = {r: [torch.full((4,), 10 * r + d, dtype=torch.uint8) for d in range(2)] for r in range(2)}
    got: list[list[int]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: got.append([int(s[0]) for s in states]))
    ranks = []
    for r in range(2):
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda r=r: dev[r])
        ranks.append(resume.rng_states())
    assert resume.restore_rng({"ranks": ranks}, 1) == "own" and got == [[10, 11]]
    assert resume.restore_rng({"ranks": ranks}, 0) == "own" and got[-1] == [0, 1]
