"""What a rank measures on its own host for the balancing models' exogenous inputs.

``HostTelemetry.sample(device)`` returns the signals of the window that just ended, as named floats:

* ``cpu``, ``mem``: the host's CPU and memory utilisation (psutil), 0..1;
* ``load1``: the 1-minute load average per core;
* ``proc_cpu``: this process's CPU share since the previous sample: a co-located job that takes the
  cores away shows here first;
* on CUDA, from NVML: ``gpu_util`` (0..1), ``sm_clock`` (GHz) and ``power`` (100 W units).

A signal that cannot be read (no psutil, no NVML, no such call on this platform) is left out of the dict;
the predictors hold a missing signal at its last value (hpc_jabas/core/balancing/predictor.py). Nothing
here is derived from an injected slowdown: the emulator's factor never reaches the predictor.
"""
from __future__ import annotations

import os
import time
from typing import Any


class HostTelemetry:
    """One per rank: primes the CPU counter at creation, keeps the NVML handle and the last sample's clocks."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._clock: tuple[float, float] | None = None
        try:
            import psutil
            psutil.cpu_percent(interval=None)          # prime the counter: the first real reading spans a window
        except Exception:
            pass

    def sample(self, device: Any) -> dict[str, float]:
        x: dict[str, float] = {}
        try:
            import psutil
            x["cpu"] = psutil.cpu_percent(interval=None) / 100.0
            x["mem"] = psutil.virtual_memory().percent / 100.0
        except Exception:
            pass
        try:
            x["load1"] = os.getloadavg()[0] / (os.cpu_count() or 1)
        except (OSError, AttributeError):
            pass
        now, cpu = time.monotonic(), time.process_time()
        if self._clock is not None and now > self._clock[0]:
            x["proc_cpu"] = (cpu - self._clock[1]) / (now - self._clock[0])
        self._clock = (now, cpu)
        if getattr(device, "type", None) == "cuda":
            x.update(self._gpu(device))
        return x

    def _gpu(self, device: Any) -> dict[str, float]:
        try:
            import pynvml
            if self._nvml is None:
                pynvml.nvmlInit()
                self._nvml = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            return {"gpu_util": pynvml.nvmlDeviceGetUtilizationRates(self._nvml).gpu / 100.0,
                    "sm_clock": pynvml.nvmlDeviceGetClockInfo(self._nvml, pynvml.NVML_CLOCK_SM) / 1000.0,
                    "power": pynvml.nvmlDeviceGetPowerUsage(self._nvml) / 1e5}
        except Exception:
            return {}
