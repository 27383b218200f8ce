"""The ramp policy: a batch-size warm-up schedule, B = B0 * factor^k once the run has passed k of the fractions
``at`` (in samples of the configured epochs), realised as the nearest realisable B. It reads no gradient statistics.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hpc_jabas.core.adaptive.policies.base import BatchPolicy, PolicyState, Wish
from hpc_jabas.core.config.defaults import DEFAULT_P, DEFAULT_RAMP_AT, DEFAULT_RAMP_FACTOR
from hpc_jabas.core.config.validate import integer, is_number
from hpc_jabas.core.planning.space import SET, STAY, BatchSpace
from hpc_jabas.errors import ConfigError

if TYPE_CHECKING:
    from hpc_jabas.core.config.sections import JobConfig


class RampPolicy(BatchPolicy):
    """A batch-size warm-up schedule: B = B0 * factor^k after the k-th of the fractions ``at`` of the
    run (in samples), clipped to [B_min, B_max] and realised as the nearest realisable B.

    What practitioners run as the baseline to adaptive batching (DeepSeek-V3 grows its batch over
    the first tokens; Merrill et al. 2025 warm the batch up for OLMo). The stage depends only on the
    run's progress and B0, never on statistics or the mix, so every mix decides the same B."""

    name = "ramp"
    options = frozenset({"B0", "at", "factor", "B_min", "B_max", "p"})

    def __init__(self, B0: int | None = None, at: Any = DEFAULT_RAMP_AT, factor: float = DEFAULT_RAMP_FACTOR,
                 B_min: int = 1, B_max: int | None = None, p: int = DEFAULT_P) -> None:
        super().__init__(B_min, B_max, p)
        self.B0 = self.B_min if B0 is None else integer(B0, "B0", lo=1)
        if isinstance(at, (str, bytes)) or not hasattr(at, "__iter__"):
            raise ConfigError(f"ramp at={at!r} is invalid; give fractions of the run, e.g. [0.25, 0.5, 0.75]")
        fr = list(at)
        if not all(is_number(f) and 0.0 < f < 1.0 for f in fr) or fr != sorted(fr) or len(set(fr)) != len(fr):
            raise ConfigError(f"ramp at={fr!r} is invalid; give increasing fractions of the run in (0, 1), "
                              "e.g. [0.25, 0.5, 0.75]")
        if not is_number(factor, nan=False) or not factor > 0 or factor == 1.0 or math.isinf(factor):
            raise ConfigError(f"ramp factor={factor!r} is invalid; B is multiplied by it at each stage, e.g. 2")
        self.at = tuple(float(f) for f in fr)
        self.factor = float(factor)

    @classmethod
    def job_options(cls, cfg: JobConfig) -> dict[str, Any]:
        return {"B0": cfg.batch, "at": list(cfg.ramp_at), "factor": cfg.ramp_factor}

    def stage(self, progress: float) -> int:
        """How many of the fractions ``at`` the run has passed."""
        return sum(1 for f in self.at if progress >= f)

    def wish(self, state: PolicyState, space: BatchSpace) -> Wish:
        pr = state.progress
        if pr is None or not is_number(pr, nan=False):
            return Wish(STAY, float(state.B), "run progress unknown; keep B")
        k = self.stage(float(pr))
        tgt = self.B0 * self.factor ** k
        return Wish(SET, float(tgt), f"ramp: progress {float(pr):.3f}, stage {k} of {len(self.at)}: "
                                     f"B0={self.B0} x {self.factor:g}^{k} = {tgt:g}")

    def config(self) -> dict[str, Any]:
        return {**super().config(), "B0": self.B0, "at": list(self.at), "factor": self.factor}
