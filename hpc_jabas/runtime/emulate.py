"""GPU-type emulation on CPU ranks (docs/design.md, section 1).

A rank that stands for GPU type T runs the real forward/backward of each micro-batch, then
waits until the time T's profile implies:  t(b) = (base_s + per_sample_s * b) / speed,
speed = T's FP32 throughput relative to a V100 (catalog) unless given explicitly. This is the
same formula as ``PerfModel.emulated`` so that the planner's model and the emulated cluster
agree. An interference schedule (config key ``slowdown``) can slow a rank further from a given
iteration: a step, a ramp or periodic bursts; it is logged as injected.

Emulation is explicit (``--emulate``), logged once per rank, and refused when CUDA is in use.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from hpc_jabas.core.config import gpus
from hpc_jabas.core.config.slowdown import Slowdown
from hpc_jabas.core.perf.perfmodel import EMU_BASE_S, EMU_PER_SAMPLE_S, emulated_time
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger

__all__ = ["Emulator", "Slowdown"]           # Slowdown lives in core/config/slowdown.py (the config checks it)


class Emulator:
    """Sleeps each micro-batch up to its emulated GPU type's time (defaults: perfmodel.EMU_BASE_S,
    EMU_PER_SAMPLE_S, the same as the job keys emulate_base_s, emulate_per_sample_s)."""

    def __init__(self, gpu_type: str, speed: float | None = None, base_s: float = EMU_BASE_S,
                 per_sample_s: float = EMU_PER_SAMPLE_S, slowdown: Slowdown | None = None,
                 rank: int = 0, allow_cuda: bool = False, log: Callable[[str], None] | None = None):
        try:
            import torch
            if torch.cuda.is_available() and not allow_cuda:
                raise ConfigError("--emulate refused: a real GPU is in use here; emulation is for CPU ranks only")
        except ImportError:  # pragma: no cover
            pass
        self.gpu_type = gpus.normalize(gpu_type)
        self.speed = float(speed) if speed is not None else gpus.get(self.gpu_type).relative_speed
        if not self.speed > 0:
            raise ConfigError(f"emulated speed {speed!r} must be > 0")
        if base_s < 0 or per_sample_s < 0:
            raise ConfigError(f"emulation times base_s={base_s}, per_sample_s={per_sample_s} must be >= 0")
        self.base_s, self.per_sample_s = float(base_s), float(per_sample_s)
        self.slowdown = slowdown
        self.overruns = 0
        # said once per job: rank 0 warns (its rank lines then name every rank's emulated type, "cpu(emulated T)");
        # another rank warns only of its own injected slowdown, else logs at debug level
        if log is None:
            lg = get_logger(__name__)
            log = lg.warning if rank == 0 or slowdown is not None else lg.debug
        msg = (f"rank {rank} EMULATES GPU type {self.gpu_type} (speed {self.speed:.3f} x V100): "
               f"t(b) = ({self.base_s:g} + {self.per_sample_s:g}*b) / {self.speed:.3f} s per micro-batch")
        if rank == 0 and slowdown is None:
            msg += "; every rank emulates its GPU type (the rank lines below name them)"
        if slowdown is not None:
            msg += f"; INJECTED slowdown {slowdown}"
        log(msg)

    def factor(self, iteration: int) -> float:
        return self.slowdown.at(iteration) if self.slowdown is not None else 1.0

    def target(self, b: int, iteration: int = 0) -> float:
        return emulated_time(b, self.base_s, self.per_sample_s, self.speed) * self.factor(iteration)

    def start(self, t: float | None = None) -> None:
        """Begin a chain of micro-batches (one iteration): deadlines accumulate from here, so a
        late wake-up of one sleep is absorbed by the next instead of adding up."""
        self._deadline = time.perf_counter() if t is None else t

    def wait_next(self, b: int, iteration: int = 0) -> float:
        """After the real compute of the next micro-batch of the chain: sleep until its deadline
        (previous deadline + target(b)); returns the seconds slept."""
        now = time.perf_counter()
        self._deadline += self.target(b, iteration)
        if now >= self._deadline:
            self.overruns += 1
            self._deadline = now
            return 0.0
        time.sleep(self._deadline - now)
        return time.perf_counter() - now       # as slept: an oversleep is time the rank really spent

    def wait_until(self, t_start: float, b: int, iteration: int = 0) -> float:
        """Sleep until t_start + target(b); returns the seconds waited (0 if compute overran)."""
        deadline = t_start + self.target(b, iteration)
        now = time.perf_counter()
        if now >= deadline:
            self.overruns += 1
            return 0.0
        waited = deadline - now
        # plain sleep: spinning would steal the CPU that other emulated ranks need
        time.sleep(waited)
        return waited
