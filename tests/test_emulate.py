"""GPU-type emulation: a rank really runs at its type's speed; explicit and validated."""
import time

import pytest
from mpi_util import run_ranks

from hpc_jabas.core.config import gpus
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.emulate import Emulator, Slowdown


def test_emulated_ranks_run_at_their_type_speed():
    spec = {"optimizer": "sgd", "lr": 0.01, "plan": "b=8 n=3,3,3", "steps": 15, "n": 512, "checkpoint": False,
            "emulate": True, "gpu_types": ["v100", "p100", "rtx2060"],
            # modelled times well above the real compute and a loaded CPU's scheduling delays (at 0.036 s a
            # micro-batch, four test workers on 2 cores squeezed p100's 1.48 to 1.17), so load keeps the ratios
            "config": {"emulate_base_s": 0.05, "emulate_per_sample_s": 0.005}}
    res = run_ranks("train_worker.py", spec, np_=3)
    per_mb = [r["compute_local_s"] / (15 * 3) for r in res]
    for r, g in zip(res[1:], ["p100", "rtx2060"]):
        expected = 1.0 / gpus.get(g).relative_speed            # slower types take longer per micro-batch
        measured = (r["compute_local_s"] / 45) / per_mb[0]
        assert measured == pytest.approx(expected, rel=0.15), (g, measured, expected)


def test_emulator_waits_to_the_formula_and_slowdown():
    e = Emulator("rtx2060", base_s=0.004, per_sample_s=0.0005, log=lambda m: None,
                 slowdown=Slowdown(factor=3.0, start=5))
    assert e.target(8, 0) == pytest.approx((0.004 + 0.004) / gpus.get("rtx2060").relative_speed)
    assert e.target(8, 5) == pytest.approx(3 * e.target(8, 0))
    t0 = time.perf_counter()
    e.wait_until(t0, 8, 0)
    assert time.perf_counter() - t0 >= e.target(8, 0) * 0.99


def test_slowdown_schedules():
    assert [Slowdown(2.0, start=2, end=4).at(i) for i in range(5)] == [1, 1, 2, 2, 1]
    ramp = Slowdown(3.0, start=0, end=10, kind="ramp")
    assert ramp.at(0) == 1.0 and ramp.at(5) == pytest.approx(2.0)
    per = Slowdown(3.0, start=0, kind="periodic", period=4, duty=0.5)
    assert [per.at(i) for i in range(8)] == [3, 3, 1, 1, 3, 3, 1, 1]
    assert Slowdown.parse("factor=3,start=50,kind=periodic,period=10").period == 10
    with pytest.raises(ConfigError, match="unknown"):
        Slowdown.parse("factor=3,bogus=1")
    with pytest.raises(ConfigError, match=r"start='x' must be an integer"):
        Slowdown.parse("factor=3,start=x")


def test_emulation_bad_input():
    with pytest.raises(ConfigError, match="unknown GPU type 'k80'; known types"):
        Emulator("k80", log=lambda m: None)
    with pytest.raises(ConfigError, match="speed"):
        Emulator("v100", speed=0, log=lambda m: None)
