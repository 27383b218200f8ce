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
identical.py does for identical b. C_i uses the same floating-point expressions as ``rank_time``.

Assignment at T*: every rank gets 1 sample; the other B - R are split over the groups in proportion
to their spare capacity c_g (C_g - 1) (largest remainder, capped), a group's share evenly over its
ranks (the lower index gets the extra sample); each rank then takes the b in A_i that finishes its
x_i first (ties: the larger b, fewer micro-batches). Ranks of one GPU type and speed factor form a
group, so the work is per group x allowed b.

Monotone t: the planner uses the running maximum of each profile's tabulated times (the profile
itself for every emulated or monotone measured profile); on a measured dip the plan is optimal for
that envelope only. ``makespans`` is then the envelope's makespan, not the model's price of the
plan, so identical.py checks ``is_monotone`` and, on a dip, prices each plan with the model and
compares it with the identical-b plan (which may use the dip).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hpc_jabas.core.planning.plan import Plan

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass
class RankGroup:
    """Interchangeable ranks: GPU type ``t`` (an index into the type tables), speed factor ``sf``,
    ranks ascending."""

    t: int
    sf: float
    ranks: list[int]


@dataclass
class TypeTable:
    """One GPU type: tt[r-1] = seconds of a micro-batch of r samples (r = 1..max(A)), A the allowed
    sizes (ascending), u the update time."""

    tt: FloatArray
    A: IntArray
    u: float


class _Pairs:
    """Every (group, allowed b) pair as flat arrays. A group's time of r samples is its type's
    tabulated time / its speed factor, computed on lookup (the same division as the perf model)."""

    def __init__(self, types: Sequence[TypeTable], groups: Sequence[RankGroup]) -> None:
        self.groups = groups
        width = max(len(t.tt) for t in types)
        self.BASE = np.full((len(types), width), np.inf)
        for j, t in enumerate(types):
            self.BASE[j, :len(t.tt)] = np.maximum.accumulate(np.asarray(t.tt, dtype=np.float64))
        self.gt = np.array([g.t for g in groups], dtype=np.int64)
        self.gsf = np.array([g.sf for g in groups], dtype=np.float64)
        self.c = np.array([len(g.ranks) for g in groups], dtype=np.int64)
        self.gu = np.array([types[t].u for t in range(len(types))], dtype=np.float64)[self.gt]
        lens = np.array([len(t.A) for t in types], dtype=np.int64)[self.gt]
        self.row = np.repeat(np.arange(len(groups), dtype=np.int64), lens)
        self.A = np.concatenate([types[t].A for t in self.gt.tolist()]).astype(np.int64)
        self.rt = self.gt[self.row]
        self.rsf = self.gsf[self.row]
        self.tb = self.BASE[self.rt, self.A - 1] / self.rsf
        self.u = self.gu[self.row]
        self.start = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        self.steps = max(1, int(width).bit_length())
        self.rho = np.min(self.BASE / np.arange(1, width + 1), axis=1)[self.gt] / self.gsf

    def tt(self, idx: IntArray) -> FloatArray:
        """Per pair: the time of idx + 1 samples on that pair's group."""
        out: FloatArray = self.BASE[self.rt, idx] / self.rsf
        return out

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
            fits = (L0 + self.tt(np.maximum(mid - 1, 0))) + u <= T
            lo = np.where(act & fits, mid, lo)
            hi = np.where(act & ~fits, mid, hi)
        out: IntArray = k * A + lo
        return out

    def group_caps(self, per: IntArray) -> IntArray:
        return np.maximum.reduceat(per, self.start)

    def total(self, T: float) -> tuple[int, IntArray]:
        per = self.caps(T)
        return int(self.group_caps(per) @ self.c), per

    def time_of(self, x: IntArray) -> FloatArray:
        """Per pair: time of x samples (x >= 1, one value per pair) with that pair's b, as
        perfmodel.rank_time computes it."""
        A, tb, u = self.A, self.tb, self.u
        k, r = np.divmod(x, A)
        full = k * tb + u
        part = (k * tb + self.tt(np.maximum(r - 1, 0))) + u
        res: FloatArray = np.where(r == 0, full, part)
        return res

    def best_b(self, x: IntArray) -> IntArray:
        """Per group: the allowed b that finishes x[group] samples first (ties: the larger b)."""
        t = self.time_of(x[self.row])
        tmin = np.minimum.reduceat(t, self.start)
        idx = np.where(t == tmin[self.row], np.arange(len(t)), -1)
        out: IntArray = self.A[np.maximum.reduceat(idx, self.start)]
        return out


def is_monotone(types: Sequence[TypeTable]) -> bool:
    """Every type's tabulated times non-decreasing in b (then the envelope is the profile itself)."""
    return all(bool(np.all(np.diff(np.asarray(t.tt, dtype=np.float64)) >= 0)) for t in types)


def makespan(P: _Pairs, B: int) -> float:
    """T* = min{T >= T_lo : sum C_i(T) >= B} (module docstring); B >= number of ranks."""
    T_lo = float(np.max(P.BASE[P.gt, 0] / P.gsf + P.gu))
    tot, per = P.total(T_lo)
    if tot >= B:
        return T_lo
    lo, per_lo, tot_lo = T_lo, per, tot
    c = P.c.astype(np.float64)
    # lower bound: no rank beats its best per-sample rate rho (over every size it may run)
    t_lb = (B + float(np.sum(c * P.gu / P.rho))) / float(np.sum(c / P.rho))
    cand = t_lb * (1 - 1e-12)
    if cand > lo:
        tot, per = P.total(cand)
        if tot < B:
            lo, per_lo, tot_lo = cand, per, tot
    # upper bound: each rank's most efficient full micro-batch (rate A/tb), k of them, plus one
    best = np.maximum.reduceat(P.A / P.tb, P.start)
    amax = np.maximum.reduceat(P.A, P.start)
    hi = max(lo, (B + float(np.sum(c * (P.gu * best + amax)))) / float(np.sum(c * best)))
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


def plan_per_rank(types: Sequence[TypeTable], groups: Sequence[RankGroup], R: int, B: int) -> Plan:
    """The optimal per-rank plan for B >= R samples, every rank running (module docstring)."""
    P = _Pairs(types, groups)
    T = makespan(P, B)
    C = P.group_caps(P.caps(T))
    spare = P.c * (C - 1)
    E = B - R
    # largest remainder of E split in proportion to spare (never above it), exact integers;
    # ties: the larger spare, then the lower group
    tot = int(spare.sum())
    extra = np.zeros(len(groups), dtype=np.int64)
    if E > 0:
        num = spare * E
        extra = num // tot
        left = E - int(extra.sum())
        if left:
            order = np.lexsort((np.arange(len(groups)), -spare, -(num % tot)))
            extra[order[:left]] += 1
    q, rem = np.divmod(P.c + extra, P.c)
    b_hi, b_lo = P.best_b(q + 1), P.best_b(q)
    members = [i for g in groups for i in g.ranks]
    gidx = np.repeat(np.arange(len(groups)), P.c)
    pos = np.arange(len(members)) - np.repeat(np.concatenate([[0], np.cumsum(P.c)[:-1]]), P.c)
    up = pos < rem[gidx]
    x = q[gidx] + up
    b = np.where(up, b_hi[gidx], b_lo[gidx])
    n = -(-x // b)
    bs, ns, xs = [0] * R, [0] * R, [0] * R
    for i, bi, ni, xi in zip(members, b.tolist(), n.tolist(), x.tolist()):
        bs[i], ns[i], xs[i] = bi, ni, xi
    return Plan(tuple(bs), tuple(ns), tuple(xs))


def makespans(types: Sequence[TypeTable], groups: Sequence[RankGroup], B_lo: int, B_hi: int) -> FloatArray:
    """T*(B) for every B in [B_lo, B_hi] (B_lo >= number of ranks) at once.

    Each group's capacity C_g(T) is the running maximum, over its events time(x, b) in time order,
    of x; the total sum_g c_g C_g(T) grows only at those events, so one sort of every event up to
    T*(B_hi) and a cumulative sum give T*(B) = the first event whose total reaches B (at least T_lo).
    The events are the values ``makespan`` walks to, so each T*(B) equals it.
    """
    P = _Pairs(types, groups)
    T_hi = makespan(P, B_hi)
    T_lo = float(np.max(P.BASE[P.gt, 0] / P.gsf + P.gu))
    per = P.caps(T_hi)                                   # per pair: events x = 1..per
    cnt = per
    pair = np.repeat(np.arange(len(per)), cnt)
    x = np.arange(int(cnt.sum()), dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt) + 1
    A, tb, u = P.A[pair], P.tb[pair], P.u[pair]
    k, r = np.divmod(x, A)
    t = np.where(r == 0, k * tb + u, (k * tb + P.BASE[P.rt[pair], np.maximum(r - 1, 0)] / P.rsf[pair]) + u)
    g = P.row[pair]
    order = np.lexsort((x, t, g))                        # by group, then time, then x
    g, t, x = g[order], t[order], x[order]
    # running maximum of x within each group; keep the events that raise it
    start = np.concatenate([[0], np.flatnonzero(np.diff(g)) + 1])
    offset = np.zeros(len(x), dtype=np.int64)
    offset[start] = g[start] * (int(x.max()) + 1)        # make groups increasing, so one accumulate serves
    run = np.maximum.accumulate(x + np.cumsum(offset)) - np.cumsum(offset)
    prev = np.concatenate([[0], run[:-1]])
    prev[start] = 0
    up = run > prev
    delta = (run - prev)[up] * P.c[g[up]]
    te = t[up]
    o = np.argsort(te, kind="stable")
    te, total = te[o], np.cumsum(delta[o])
    Bs = np.arange(B_lo, B_hi + 1)
    i = np.searchsorted(total, Bs, side="left")
    out: FloatArray = np.maximum(te[i], T_lo)
    return out
