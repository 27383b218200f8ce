"""The exact planner for per-rank micro-batch sizes (plan.py's per-rank plans). Pure: Python + numpy.

Rank i may use any micro-batch size b from its allowed set A_i (b <= its memory cap), the last
micro-batch partial: x samples cost time_i(x, b) = ``perfmodel.rank_time`` (n - 1 full micro-batches
of b, then one of r = x - (n - 1) b samples, plus update_s). Partial micro-batches are allowed
because the weighted allreduce makes any split exact, and they make every sample count reachable.

Why the result is exactly optimal. With t non-decreasing in b, time_i(x, b) is non-decreasing in x,
so the sample counts rank i can process within a makespan T form an interval [0, C_i(T)] with

    C_i(T) = max_{b in A_i} (k b + r),  k = full micro-batches of b within T, r < b the largest
                                           partial micro-batch that still fits after them.

Every rank runs (x_i >= 1), the allreduce tail is fixed, so the optimum is

    T* = min { T >= T_lo : sum_i C_i(T) >= B },   T_lo = max_i time_i(1) (every rank's one sample),

and any x with 1 <= x_i <= C_i(T*) and sum x = B has makespan <= T*. sum_i C_i is a step function
jumping only at the values time_i(x, b) ("events"), so T* is an event: bisection on T between a
lower bound (the best per-sample rate of each rank) and an upper bound (its best full micro-batch),
plus a walk to the next event above the infeasible end, which ends on the exact event, as
planner.py does for identical b. C_i uses the same floating-point expressions as ``rank_time``.

Assignment at T*: every rank gets 1 sample; the other B - R are split over the groups in proportion
to their spare capacity c_g (C_g - 1) (largest remainder, capped), a group's share evenly over its
ranks (the lower index gets the extra sample); each rank then takes the b in A_i that finishes its
x_i first (ties: the larger b, fewer micro-batches). Ranks of one GPU type and speed factor form a
group, so the work is per group x allowed b.

Monotone t: the planner uses the running maximum of each profile's tabulated times (the profile
itself for every emulated or monotone measured profile); on a measured dip the plan is optimal for
that envelope and priced by the model as it is.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hpc_jabas.core.plan import Plan, split_proportional

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass
class RankGroup:
    """Interchangeable ranks: tt[r-1] = seconds of a micro-batch of r samples (already / speed factor,
    r = 1..max(A)), A the allowed sizes (ascending), u the update time, ranks ascending."""

    tt: FloatArray
    A: IntArray
    u: float
    ranks: list[int]


class _Pairs:
    """Every (group, allowed b) pair as flat arrays; tables padded into one matrix (row = group)."""

    def __init__(self, groups: Sequence[RankGroup]) -> None:
        self.groups = groups
        width = max(len(g.tt) for g in groups)
        self.TT = np.full((len(groups), width), np.inf)
        for j, g in enumerate(groups):
            self.TT[j, :len(g.tt)] = np.maximum.accumulate(np.asarray(g.tt, dtype=np.float64))
        self.row = np.concatenate([np.full(len(g.A), j, dtype=np.int64) for j, g in enumerate(groups)])
        self.A = np.concatenate([np.asarray(g.A, dtype=np.int64) for g in groups])
        self.Af = self.A.astype(np.float64)
        self.tb = self.TT[self.row, self.A - 1]
        self.u = np.array([g.u for g in groups])[self.row]
        self.c = np.array([len(g.ranks) for g in groups], dtype=np.int64)
        self.start = np.concatenate([[0], np.cumsum([len(g.A) for g in groups])[:-1]]).astype(np.int64)
        self.steps = max(1, int(width).bit_length())

    def caps(self, T: float) -> IntArray:
        """Per pair: the most samples one rank processes within T (k full micro-batches of b, then
        the largest partial r < b that fits), with perfmodel.rank_time's floating-point expressions."""
        tb, u, A = self.tb, self.u, self.A
        k = np.floor((T - u) / tb).astype(np.int64)
        k -= (k * tb + u > T)
        k += ((k + 1) * tb + u <= T)
        k = np.maximum(k, 0)
        L0 = k * tb
        lo = np.zeros(len(A), dtype=np.int64)          # r = lo fits (r = 0: nothing), hi does not
        hi = A.copy()                                   # r = b is excluded (that is one more full one)
        for _ in range(self.steps):
            mid = (lo + hi) // 2
            act = mid > lo
            if not act.any():
                break
            fits = (L0 + self.TT[self.row, np.maximum(mid - 1, 0)]) + u <= T
            lo = np.where(act & fits, mid, lo)
            hi = np.where(act & ~fits, mid, hi)
        out: IntArray = k * A + lo
        return out

    def group_caps(self, per: IntArray) -> IntArray:
        return np.maximum.reduceat(per, self.start)

    def total(self, T: float) -> tuple[int, IntArray]:
        per = self.caps(T)
        return int(self.group_caps(per) @ self.c), per

    def time_of(self, x: IntArray | int, sl: slice = slice(None)) -> FloatArray:
        """Per pair (or the pairs in sl): time of x samples (x >= 1) with that pair's b, as
        perfmodel.rank_time computes it."""
        A, tb, u = self.A[sl], self.tb[sl], self.u[sl]
        k, r = np.divmod(x, A)
        full = k * tb + u
        part = (k * tb + self.TT[self.row[sl], np.maximum(r - 1, 0)]) + u
        res: FloatArray = np.where(r == 0, full, part)
        return res


def makespan(P: _Pairs, B: int) -> float:
    """T* = min{T >= T_lo : sum C_i(T) >= B} (module docstring); B >= number of ranks."""
    T_lo = float(np.max(P.TT[:, 0] + np.array([g.u for g in P.groups])))
    tot, per = P.total(T_lo)
    if tot >= B:
        return T_lo
    lo, per_lo, tot_lo = T_lo, per, tot
    c = P.c.astype(np.float64)
    ug = np.array([g.u for g in P.groups])
    # lower bound: no rank beats its best per-sample rate rho (over every size it may run)
    width = P.TT.shape[1]
    rho = np.min(P.TT / np.arange(1, width + 1), axis=1)
    t_lb = (B + float(np.sum(c * ug / rho))) / float(np.sum(c / rho))
    cand = t_lb * (1 - 1e-12)
    if cand > lo:
        tot, per = P.total(cand)
        if tot < B:
            lo, per_lo, tot_lo = cand, per, tot
    # upper bound: each rank's most efficient full micro-batch, k of them
    eff = P.Af / P.tb
    best = np.maximum.reduceat(eff, P.start)
    j = np.array([P.start[g] + int(np.argmax(eff[P.start[g]:P.start[g] + len(P.groups[g].A)]))
                  for g in range(len(P.groups))])
    hi = (B + float(np.sum(c * (ug + P.tb[j]) * best))) / float(np.sum(c * best))
    hi = max(hi, lo)
    step = float(P.tb.max())
    tot_hi = P.total(hi)[0]
    while tot_hi < B:
        hi += step
        step *= 2
        tot_hi = P.total(hi)[0]
    slow = 0
    while True:
        t = P.time_of(per_lo + 1)
        e = float(t[t > lo].min())                     # the next event above lo: cap is constant on [lo, e)
        if e >= hi:
            return hi                                  # then e == hi (hi is feasible)
        # regula falsi on the (nearly linear) total capacity, bisection when it stalls; never below e
        frac = 0.5 if slow >= 2 else (B - tot_lo) / (tot_hi - tot_lo)
        m = max(e, lo + (hi - lo) * min(max(frac, 0.0), 1.0))
        if not m < hi:
            m = e
        tot, per = P.total(m)
        span = hi - lo
        if tot >= B:
            if m == e:
                return e
            hi, tot_hi = m, tot
        else:
            lo, per_lo, tot_lo = m, per, tot
        slow = slow + 1 if hi - lo > 0.5 * span else 0


def plan_per_rank(groups: Sequence[RankGroup], R: int, B: int) -> Plan:
    """The optimal per-rank plan for B >= R samples, every rank running (module docstring)."""
    P = _Pairs(groups)
    T = makespan(P, B)
    C = P.group_caps(P.caps(T)).tolist()
    spare = [len(g.ranks) * (cg - 1) for g, cg in zip(groups, C)]
    extra = split_proportional(B - R, spare, caps=spare) if B > R else [0] * len(groups)
    bs = [0] * R
    ns = [0] * R
    xs = [0] * R
    for j, (g, e) in enumerate(zip(groups, extra)):
        cnt = len(g.ranks)
        q, rem = divmod(cnt + e, cnt)
        sl = slice(int(P.start[j]), int(P.start[j]) + len(g.A))
        for x, members in ((q + 1, g.ranks[:rem]), (q, g.ranks[rem:])):
            if not members:
                continue
            t = P.time_of(x, sl)
            best = np.flatnonzero(t == t.min())
            b = int(g.A[best[-1]])                     # ties: the larger b
            n = -(-x // b)
            for i in members:
                bs[i], ns[i], xs[i] = b, n, x
    return Plan(tuple(bs), tuple(ns), tuple(xs))
