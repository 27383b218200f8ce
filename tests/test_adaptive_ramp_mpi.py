"""The ramp policy on 3 real Horovod ranks: B doubles at 25%, 50% and 75% of the run's samples."""
from mpi_util import run_ranks

CONFIG = {"planner": "lbbsp", "micro_batch": 4, "speeds": [1.0, 0.5, 0.25], "policy": "ramp", "p": 4,
          "batch_min": 16, "batch_max": 64, "epochs": 2, "lr_rule": "sqrt"}


def test_ramp_doubles_B_at_the_fractions_of_the_run(tmp_path):
    spec = {"optimizer": "momentum", "lr": 0.05, "plan": "b=4 n=2,1,1", "steps": 1000, "n": 256,
            "checkpoint": False, "run_dir": str(tmp_path / "run"), "epochs": 2, "config": CONFIG}
    res = run_ranks("train_worker.py", spec, np_=3)
    hist = res[0]["history"]
    for r in res[1:]:
        assert r["history"] == hist
    total = 2 * 256
    done, first = 0, {}
    for h in hist:                              # samples done before each iteration, per B
        first.setdefault(h["B"], done)
        done += h["B"] if h["B"] <= total - done else total - done
    assert sorted(first) == [16, 32, 64]        # 128 would be above batch_max
    # each stage starts at the first decision (every p = 4 iterations) after its fraction of the run
    for B, frac in ((32, 0.25), (64, 0.5)):
        assert frac * total <= first[B] <= frac * total + 4 * (B // 2), (B, first)   # p iterations of B / 2
    lr = {h["B"]: h["lr_scale"] for h in hist}
    assert abs(lr[64] - 2.0) < 1e-12 and abs(lr[16] - 1.0) < 1e-12     # sqrt(64 / 16)
