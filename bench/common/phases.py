"""Where an adaptive run's time to target goes, against a fixed-B run at equal samples (bench.adaptive_tta).

An adaptive run A and a fixed run F of the same seed each reach the target at a wall clock (T_A, T_F) after a
number of samples (N_A, N_F; whole epochs, the evaluations come at epoch ends). Each run's metrics give every
iteration's B, samples and measured time. A's iterations before its target fall into three phases:

- ``start``: from the first iteration until B first differs from its starting value;
- ``climb``: from there until B first reaches 0.9 of its value at the target ("final");
- ``steady``: the rest, up to the target.

F's cumulative iteration time as a function of samples, c_F(n) (piecewise linear through its iterations), prices
any sample range at F's speed. Then, exactly,

    T_A - T_F = sum over phases [t_A(phase) - (c_F(n1) - c_F(n0))]      (speed: A's time over F's, same samples)
              + [c_F(N_A) - c_F(N_F)]                                   (samples: A needs more or fewer samples)
              + [(T_A - sum t_A) - (T_F - c_F(N_F))]                    (other: time outside iterations)

where [n0, n1) is the phase's sample range and t_A(phase) A's measured iteration time in it. A positive term is
time A lost. Pure: plain lists in, a dict out.
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence

PHASES = ("start", "climb", "steady")
TERMS = (*PHASES, "samples", "other")
#: the climb ends when B first reaches this fraction of its value at the target
CLIMB_END = 0.9


def cumulative(rows: Sequence[tuple[int, int, float]]) -> tuple[list[float], list[float]]:
    """(samples, seconds) after each iteration, from (B, samples, seconds) rows, with (0, 0) first."""
    n, t = [0.0], [0.0]
    for _, s, dt in rows:
        n.append(n[-1] + s)
        t.append(t[-1] + dt)
    return n, t


def price(curve: tuple[list[float], list[float]], samples: float) -> float:
    """c(samples): linear between iterations, and past the last at the last iteration's rate."""
    n, t = curve
    if samples <= 0:
        return 0.0
    i = bisect.bisect_left(n, samples)
    if i >= len(n):
        rate = (t[-1] - t[-2]) / (n[-1] - n[-2]) if len(n) >= 2 and n[-1] > n[-2] else 0.0
        return t[-1] + (samples - n[-1]) * rate
    n0, n1, t0, t1 = n[i - 1], n[i], t[i - 1], t[i]
    return t0 + (t1 - t0) * (samples - n0) / (n1 - n0) if n1 > n0 else t1


def bounds(Bs: Sequence[int]) -> tuple[int, int]:
    """The iteration indices where the climb and the steady phase begin (len(Bs) when never)."""
    if not Bs:
        return 0, 0
    first = next((i for i, b in enumerate(Bs) if b != Bs[0]), len(Bs))
    final = Bs[-1]
    steady = next((i for i in range(first, len(Bs)) if Bs[i] >= CLIMB_END * final), len(Bs)) \
        if first < len(Bs) else len(Bs)
    return first, steady


def split(adaptive: Sequence[tuple[int, int, float]], t_a: float, n_a: float,
          fixed: Sequence[tuple[int, int, float]], t_f: float, n_f: float) -> dict[str, float]:
    """The terms (seconds; positive: A lost time) of T_A - T_F, for A's iterations ``adaptive`` and F's ``fixed``
    as (B, samples, seconds) rows, each run's wall time (t_a, t_f) and samples (n_a, n_f) at its target."""
    cf = cumulative(fixed)
    ca_n, ca_t = cumulative(adaptive)
    k = bisect.bisect_right(ca_n, n_a + 1e-9) - 1          # A's iterations up to its target
    rows = list(adaptive[:k])
    first, steady = bounds([b for b, _, _ in rows])
    out: dict[str, float] = {}
    for name, (i0, i1) in zip(PHASES, ((0, first), (first, steady), (steady, len(rows)))):
        took = ca_t[i1] - ca_t[i0]
        out[name] = took - (price(cf, ca_n[i1]) - price(cf, ca_n[i0]))
    out["samples"] = price(cf, ca_n[len(rows)]) - price(cf, n_f)
    out["other"] = (t_a - ca_t[len(rows)]) - (t_f - price(cf, n_f))
    return out


def both_goals(ratio: dict[str, float], gap: dict[str, float], best: str, time_goal: float = 1.10,
               acc_goal: float = 0.5) -> list[str]:
    """The runs of ``ratio`` (time to target over fixed-32's; inf: a miss) that meet both of the benchmark's goals
    at once: time within ``time_goal`` x the best fixed B's (``best``) and a final accuracy at most ``acc_goal``
    points below fixed-32's (``gap``: points below). On a task where no fixed B is in this list, the two goals
    ask a policy for what no fixed batch size does: the fastest B to the target ends the budget less accurate."""
    limit = time_goal * ratio[best]
    if not limit < float("inf"):          # no fixed B reached the target: nothing meets the time goal
        return []
    return [k for k in ratio if ratio[k] <= limit and gap[k] <= acc_goal]
