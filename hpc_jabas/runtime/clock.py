"""Timing device work: CUDA events on a GPU, ``time.perf_counter`` on the CPU. One place, for the profiler
(runtime/profiling/timing.py: :class:`Timer`) and the trainer's iterations (:class:`IterationClock`).

On a GPU the host clock misleads: kernels run after the call that launched them returns. An event recorded on
the stream is reached when the work queued before it is done, so the time between two events is the stream's
own time for the work between them, whatever the host did meanwhile.
"""
from __future__ import annotations

import time

import torch


class Timer:
    """One interval: ``start()`` ... ``stop()`` -> seconds. perf_counter on the CPU, CUDA events on a GPU (stop
    waits for the work queued up to it)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self._a = torch.cuda.Event(enable_timing=True)
            self._b = torch.cuda.Event(enable_timing=True)
        self._t = 0.0

    def start(self) -> None:
        if self.cuda:
            self._a.record()
        else:
            self._t = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self._b.record()
            self._b.synchronize()
            return float(self._a.elapsed_time(self._b)) / 1e3
        return time.perf_counter() - self._t


class IterationClock:
    """The times of one training iteration (runtime/trainer.py).

    ``compute_start()`` / ``compute_stop()`` around each micro-batch (and the loss read) add to the iteration's
    compute time; ``end()`` after ``opt.step()`` closes the iteration and returns the host time then.

    CPU: the host clock (the work is done when the call returns). CUDA: a pair of events around each
    micro-batch (recorded, never waited for: no host sync per micro-batch), and ``end()`` records one more
    event after the optimizer step and waits for it, so the step's kernels count in the iteration that
    launched them, not in the next iteration's compute (which the calibration and the balancer read).
    :meth:`compute_s` is read after :meth:`end`.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._pool: list[torch.cuda.Event] = []
        self._used = 0
        self._open: object = None
        self._host = 0.0
        self._ended = True

    def _event(self) -> torch.cuda.Event:
        if self._used == len(self._pool):
            self._pool.append(torch.cuda.Event(enable_timing=True))
        e = self._pool[self._used]
        self._used += 1
        e.record()
        return e

    def begin(self) -> float:
        """A new iteration; the host time now."""
        self._used, self._host, self._open, self._ended = 0, 0.0, None, False
        return time.perf_counter()

    def compute_start(self) -> None:
        self._open = self._event() if self.cuda else time.perf_counter()

    def compute_stop(self) -> None:
        if self.cuda:
            self._event()                        # the pair: pool[used-2], pool[used-1]
        else:
            self._host += time.perf_counter() - float(self._open)  # type: ignore[arg-type]
        self._open = None

    def end(self) -> float:
        """After the optimizer step: on a GPU, wait until the stream has done it; the host time then."""
        if self.cuda:
            e = self._event()
            e.synchronize()
        self._ended = True
        return time.perf_counter()

    def compute_s(self) -> float:
        """Seconds of compute of this iteration so far (CUDA: read after :meth:`end`)."""
        if not self.cuda:
            return self._host
        if not self._ended:
            raise RuntimeError("IterationClock.compute_s on CUDA is read after end()")
        n = self._used - 1                      # the last event is end()'s
        return sum(float(self._pool[i].elapsed_time(self._pool[i + 1])) for i in range(0, n, 2)) / 1e3
