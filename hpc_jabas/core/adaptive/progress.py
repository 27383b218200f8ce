"""The epoch budget counted in statistical progress (``[adaptive] goal = "final"``), as Pollux's own runs count it.
Pure.

One iteration at batch B makes r "iterations at B0" of progress (AdaScale's gain, Pollux's scale-invariant
iterations):

    r = (S + G2) / (S / s + G2),   s = B / B0,   S = tr(Sigma) / B0,

with G2 = |G|^2 and tr(Sigma) one sample's gradient noise (core/adaptive/stats.py). In samples at B0 that is
``r B0 = B E(B)``, E(B) = r / s = (B_noise + B0) / (B_noise + B) Pollux's efficiency (B_noise = tr(Sigma) / G2), so an
iteration of ``n`` samples counts ``n E(B)``. Without an estimate yet, or with G2 <= 0 (the noise swamps the
gradient), E = 1: a sample counts as one, as with ``goal = "time"``. A run with ``goal = "final"`` goes on until
the progress of its epochs at B0 (epochs x the data's samples) is made; with ``goal = "time"`` it ends after that
many samples, whatever B was.
"""
from __future__ import annotations

import math
from typing import Any


def progress_gain(G2: float | None, S: float | None, B: float, B0: float) -> float:
    """r = (S/B0 + G2) / (S/(B0 s) + G2), s = B / B0 (``S``: one sample's tr(Sigma)); s where r is unknown (no
    estimate, G2 <= 0: E = 1)."""
    if not (B > 0 and B0 > 0):
        raise ValueError(f"progress_gain: B={B}, B0={B0}: each must be > 0")
    s = B / B0
    if G2 is None or S is None or not (math.isfinite(G2) and math.isfinite(S)) or G2 <= 0.0:
        return s
    var = max(0.0, S) / B0
    return (var + G2) / (var / s + G2)


def progress_efficiency(G2: float | None, S: float | None, B: float, B0: float) -> float:
    """E = r / s: the progress one sample at B makes, in samples at B0."""
    return progress_gain(G2, S, B, B0) / (B / B0)


class ProgressBudget:
    """The run's progress in samples at B0 against its budget (``epochs`` x the data's samples): each iteration's
    samples x the efficiency E in force (``efficiency``, set from each decision's record, the same on every rank).
    ``epoch``: the data's samples, an epoch of progress (``epochs_due``: a per-epoch scheduler's steps)."""

    def __init__(self, budget: float, epoch: float | None = None) -> None:
        if not budget > 0:
            raise ValueError(f"progress budget {budget}: must be > 0 samples")
        self.budget = float(budget)
        self.epoch = float(epoch) if epoch else self.budget
        self.done = 0.0
        self.samples = 0
        self.efficiency = 1.0
        self.stepped = 0                          # epochs of progress a scheduler was stepped for

    def add(self, samples: float) -> None:
        self.done += float(samples) * self.efficiency
        self.samples += int(samples)

    def set_efficiency(self, E: float | None) -> None:
        if E is not None and math.isfinite(E) and E > 0:
            self.efficiency = min(1.0, float(E))

    @property
    def fraction(self) -> float:
        return self.done / self.budget

    def finished(self) -> bool:
        return self.done >= self.budget * (1.0 - 1e-12)

    def epochs_due(self) -> int:
        """The epochs of progress completed since the last call (each one a per-epoch scheduler's step)."""
        k = int(math.floor(self.done / self.epoch * (1.0 + 1e-12))) - self.stepped
        self.stepped += max(0, k)
        return max(0, k)

    def state_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "done": self.done, "samples": self.samples, "efficiency": self.efficiency,
                "stepped": self.stepped}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.done, self.samples = float(st.get("done", 0.0)), int(st.get("samples", 0))
        self.efficiency = float(st.get("efficiency", 1.0))
        self.stepped = int(st.get("stepped", 0))
