"""Host telemetry for the balancing models: named signals in range, the process CPU share, no GPU keys without NVML."""
from __future__ import annotations

import time
from types import SimpleNamespace

from hpc_jabas.runtime.telemetry import HostTelemetry


def _spin(cpu_s: float) -> None:
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


def test_signals_are_named_fractions_and_the_process_share_follows_its_own_work():
    t = HostTelemetry()
    first = t.sample(SimpleNamespace(type="cpu"))
    assert "proc_cpu" not in first                       # no previous sample: no window to divide by
    assert 0.0 <= first["cpu"] <= 1.0 and 0.0 < first["mem"] < 1.0 and first["load1"] >= 0.0
    time.sleep(0.2)
    idle = t.sample(SimpleNamespace(type="cpu"))["proc_cpu"]
    _spin(0.1)
    busy = t.sample(SimpleNamespace(type="cpu"))["proc_cpu"]
    assert 0.0 <= idle < busy <= 1.05
    assert not {"gpu_util", "sm_clock", "power"} & set(first)


def test_a_cuda_device_without_nvml_gives_the_host_signals_only():
    t = HostTelemetry()
    x = t.sample(SimpleNamespace(type="cuda", index=0))
    assert {"cpu", "mem", "load1"} <= set(x)
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert not {"gpu_util", "sm_clock", "power"} & set(x)
