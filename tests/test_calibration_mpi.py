"""Online calibration on 3 emulated Horovod ranks: a rank slowed 2x without telling the
planner (an injected, unannounced slowdown) is calibrated to the true factor within 5%; the others
stay at 1 unless what they measured says the host slowed them; every fit predicts its rank's last
measured iterations within 10% (median); predicted vs measured iteration time is in metrics.jsonl; the
calibration survives a checkpoint and resume exactly."""
import json

import pytest
from mpi_util import run_ranks

from hpc_jabas.core.perf.calibration import CALIBRATION_FILE, Calibration

TYPES = ["v100", "p100", "rtx2060"]


def test_unannounced_slowdown_is_calibrated_and_survives_resume(tmp_path):
    run_dir = tmp_path / "run"
    # emulated times well above the real compute of the small model, also on a loaded machine
    spec = {"run_dir": str(run_dir), "gpu_types": TYPES, "steps": 80, "slowdown": {"1": "factor=2,start=20"},
            "base_s": 0.02, "per_sample_s": 0.002}
    res = run_ranks("calib_worker.py", spec, np_=3)
    cal = res[0]["calibration"]
    assert all(r["calibration"] == cal for r in res)               # every rank holds the same fits
    factors = [r["factor"] for r in cal["ranks"]]
    assert factors[1] == pytest.approx(2.0, rel=0.05), factors
    for r, fit in zip(res, cal["ranks"]):
        # the fit predicts what the rank measured in its last 30 iterations within 10% (median). Not 5%: on a
        # loaded 2-core host one CPU rank's iteration jitters by up to 30% (CI saw a 6.2% median miss on
        # rank 0), and a burst of load slowed 5 of one rank's last 10 iterations by 45% or more (the emulated
        # times, since doubled, and the 30 iterations dilute that); a fit that missed the 2x slowdown or
        # stayed at the profile misses by 50% or more.
        last = r["samples"][-30:]
        assert len(last) == 30
        miss = sorted(abs(fit["factor"] * x + fit["offset_s"] * n - y) / y for x, n, y in last)
        assert miss[15] < 0.10, (r["rank"], fit, last)
        # the ranks nobody slowed stay at 1, unless what they measured says the machine did slow them
        # (a CPU rank on a loaded 2-core host: the calibration then follows it, as it should). Within 10%, not 5%:
        # CI once saw 1.066 on rank 0 while its last 10 iterations ran a median 1.029x the profile; the slowed
        # rank's 2.0 is ten times further off.
        if r["rank"] != 1:
            against_profile = sorted(y / x for x, n, y in last)[5]
            assert fit["factor"] == pytest.approx(1.0, rel=0.10) or against_profile > 1.05, (factors, against_profile)
    # written beside the run's checkpoints for the next job and `hpc-jabas plan --calibration`
    assert Calibration.load(run_dir / CALIBRATION_FILE).to_dict() == cal
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    perr = [r for r in recs if r["type"] == "perf_error"]
    assert len(perr) >= 7                 # every 10 iterations (metrics_period) and at the checkpoint
    assert all(r["predicted_s"] > 0 and r["measured_s"] > 0 and len(r["factor"]) == 3 for r in perr)
    last = perr[-3:]                      # after the slowdown: the calibrated model predicts it, the profile not
    assert all(r["error"] < r["error_uncalibrated"] for r in last), last
    # resume: the calibration as checkpointed, to 1e-12
    back = run_ranks("calib_worker.py", dict(spec, mode="resume_only"), np_=3)
    for r in back:
        assert r["resumed"]
        for a, b in zip(r["calibration"]["ranks"], cal["ranks"]):
            assert a["factor"] == pytest.approx(b["factor"], rel=1e-12, abs=1e-12)
            assert a["offset_s"] == pytest.approx(b["offset_s"], rel=1e-12, abs=1e-12)
            assert sum(a["P"], []) == pytest.approx(sum(b["P"], []), rel=1e-12, abs=1e-15)
            assert a["n_obs"] == b["n_obs"]
    assert back[1]["view_v100_t4"] == pytest.approx(res[1]["view_v100_t4"], rel=1e-12)
