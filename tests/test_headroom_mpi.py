"""The curvature headroom measured online on 2 real mpirun ranks, as a user's script runs it
(tests/workers/headroom_user.py: ``import hpc_jabas``, the goodput policy, momentum SGD, a step schedule,
``headroom_probe = 64`` every 2nd decision round): each backend's launch runs a 3-epoch run and the same run cut
after its first epoch and resumed from its checkpoint.

- every decision record carries the h in force (fresh at the probing rounds), finite and positive, with the
  effective lr it was measured at (lr x lr scale / (1 - momentum));
- no move up goes past c x h x B_h (c = 4, the default);
- h survives the resume: the resumed run's decisions, h included, and its final weights equal the uninterrupted
  run's bit for bit (a decision right after the resume carries the h probed before the cut), and the ranks agree;
- ``goal = "final"`` on the same task: both ranks run past 2 epochs of samples to the same last iteration, the
  step schedule stepped at the 2 epochs of progress.
"""
from __future__ import annotations

import json

import pytest
from mpi_util import run_ranks


def _decisions(run_dir):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r["type"] == "decision"]


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_h_in_the_decision_records_and_through_a_resume(tmp_path, backend):
    cases = [{"run_dir": str(tmp_path / "twin"), "epochs": 3, "backend": backend},
             {"run_dir": str(tmp_path / "cut"), "epochs": 1, "backend": backend},
             {"run_dir": str(tmp_path / "cut"), "epochs": 3, "resume": True, "backend": backend},
             {"run_dir": str(tmp_path / "final"), "epochs": 2, "backend": backend, "goal": "final"}]
    run_ranks("headroom_user.py", {"cases": cases}, np_=2, timeout=300, _out_dir=str(tmp_path))
    res = [[json.loads((tmp_path / f"case{k}-rank{r}.json").read_text()) for r in range(2)] for k in range(4)]
    twin, cut, resumed, final = res
    ds = _decisions(tmp_path / "twin")
    assert len(ds) >= 4 and all("headroom" in d["stats"] for d in ds)
    fresh = [d for d in ds if d["stats"]["headroom_fresh"]]
    assert len(fresh) >= 2 and len(fresh) < len(ds)           # every 2nd round probes
    for d in ds:
        hd = d["stats"]["headroom"]
        assert isinstance(hd["h"], float) and 0 < hd["h"] < 1e6 and hd["samples"] == 64
        assert hd["lr_eff"] == pytest.approx(hd["eps_max"] * 2 / hd["h"], rel=1e-12)
        if d["stats"]["B_before"] < d["B"]:
            assert d["B"] <= 4.0 * hd["h"] * hd["B"] * (1 + 1e-12)
    # the effective lr at the first probe: lr 0.1 / (1 - 0.9) at the initial lr scale 1
    assert fresh[0]["stats"]["headroom"]["lr_eff"] == pytest.approx(1.0, rel=1e-12)
    # the resume: the same records (h included) and weights
    cut_at = cut[0]["iterations"]
    assert all(r["resumed_from"] for r in resumed) and resumed[0]["iterations"] == twin[0]["iterations"] > cut_at
    again = _decisions(tmp_path / "cut")
    assert [(d["at_iteration"], d["B"], d["stats"]["headroom"]) for d in again] == \
        [(d["at_iteration"], d["B"], d["stats"]["headroom"]) for d in ds]
    carried = [d for d in again if d["at_iteration"] > cut_at + 1 and not d["stats"]["headroom_fresh"]]
    assert carried and carried[0]["stats"]["headroom"]["it"] <= cut_at      # probed before the cut, kept
    assert resumed[0]["params"] == twin[0]["params"] == resumed[1]["params"]
    # goal = "final": both ranks end at the same iteration, past 2 epochs of samples, the schedule stepped twice
    assert final[0]["iterations"] == final[1]["iterations"] and final[0]["params"] == final[1]["params"]
    assert final[0]["samples"] > 2 * 512 and final[0]["sched_epochs"] == 2
    last = _decisions(tmp_path / "final")[-1]["stats"]
    assert 0.5 < last["progress"] < 1.0 and 0 < last["progress_E"] <= 1.0
