"""Seesaw's late-phase floor (Meterez et al. 2025, "Seesaw: accelerating training by balancing learning rate and
batch size scheduling"): where the lr schedule multiplies the lr by alpha < 1, grow B by 1 / alpha instead. Pure.

The schedule's cut is read as ``alpha = lr / peak``: the scheduler's lr now over the largest it has set so far (a
warm-up's rise is no cut). The floor is ``B_ref / alpha`` (B_ref: the lr rule's reference batch), at most the
headroom cap's limit (core/adaptive/headroom.py: c x h x B_h; never below B_ref) and the range's B_max. Where the
floor binds, the lr scale on the scheduler's lr is

- SGD: ``B / B_ref`` (at the full floor the cut is undone: the lr stays the peak's);
- Adam: ``sqrt(B / B_ref)`` (at the full floor the lr is the peak's x sqrt(alpha)),

so a floor capped short of ``B_ref / alpha`` leaves the rest of the cut to the lr. Off (no floor) while alpha = 1.
"""
from __future__ import annotations

import math
from typing import Any


def seesaw_floor(B_ref: float, alpha: float, limit: float | None = None, B_max: float | None = None) -> float | None:
    """The batch Seesaw holds B at or above: ``B_ref / alpha``, capped by ``limit`` (the headroom's; never below
    B_ref) and ``B_max``; None while the schedule has cut nothing (alpha >= 1)."""
    if not B_ref > 0:
        raise ValueError(f"B_ref={B_ref}: must be > 0")
    if not 0.0 < alpha or math.isnan(alpha):
        raise ValueError(f"alpha={alpha}: the schedule's lr over its peak must be > 0")
    if alpha >= 1.0:
        return None
    f = B_ref / alpha
    if limit is not None:
        f = min(f, max(float(limit), B_ref))
    if B_max is not None:
        f = min(f, float(B_max))
    return f


def seesaw_lr_scale(B: float, B_ref: float, adam: bool) -> float:
    """The lr scale on the scheduler's lr at a B the floor set: B / B_ref (SGD), sqrt(B / B_ref) (Adam)."""
    if not (B > 0 and B_ref > 0):
        raise ValueError(f"B={B}, B_ref={B_ref}: each must be > 0")
    k = B / B_ref
    return math.sqrt(k) if adam else k


class SeesawFloor:
    """The schedule's peak lr so far and the cut since (``observe``), the floor it puts on B (``floor``)."""

    def __init__(self, B_ref: float, adam: bool) -> None:
        if not B_ref > 0:
            raise ValueError(f"B_ref={B_ref}: must be > 0")
        self.B_ref, self.adam = float(B_ref), bool(adam)
        self.peak: float | None = None
        self.alpha = 1.0

    def observe(self, lr: float) -> float:
        """The scheduler's lr now (no lr scale on it); the cut alpha = lr / the peak so far."""
        if not lr > 0 or math.isinf(lr):
            return self.alpha                      # a zero or broken lr: no cut read from it
        self.peak = lr if self.peak is None else max(self.peak, float(lr))
        self.alpha = float(lr) / self.peak
        return self.alpha

    def floor(self, limit: float | None = None, B_max: float | None = None) -> float | None:
        return seesaw_floor(self.B_ref, self.alpha, limit, B_max)

    def lr_scale(self, B: float) -> float:
        return seesaw_lr_scale(B, self.B_ref, self.adam)

    def state_dict(self) -> dict[str, Any]:
        return {"peak": self.peak, "alpha": self.alpha}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.peak = None if st.get("peak") is None else float(st["peak"])
        self.alpha = float(st.get("alpha", 1.0))


def floor_batch(space: Any, B: int, floor: float | None, limit: float | None = None) -> int | None:
    """The realisable B the floor lifts the decided ``B`` to (None: the floor does not bind): the smallest
    realisable B' >= ``floor`` in ``space`` (a ``BatchSpace``; its largest when none is), at most the largest
    realisable B' <= ``limit`` (the headroom cap's), and above B."""
    if floor is None or floor <= B:
        return None
    want = math.ceil(floor - 1e-9)
    got = want if space.is_realisable(want) and space.B_min <= want <= space.B_max else space.above(want)
    if got is None:
        got = space.below(space.B_max + 1)
    if got is not None and limit is not None and got > limit:
        got = space.below(math.floor(limit) + 1)
    return int(got) if got is not None and got > B else None
