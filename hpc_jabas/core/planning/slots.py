"""Exact slot arithmetic of the planner (see identical.py's docstring for why it is optimal).

A rank group is (t, u, c): micro-batch time t, update time u, c interchangeable ranks. Slot k of a
rank is k*t + u, its finishing time with k micro-batches. Everything here works on the parallel
lists ts, us, cs of the groups; identical.py does input checking, grouping and the choice of b.
Pure: plain Python + numpy.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from hpc_jabas.core.planning.plan import Plan

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Floats = Sequence[float]
Ints = Sequence[int]

# ---------------------------------------------------------------------------------------------
# exact slot arithmetic
# ---------------------------------------------------------------------------------------------

def k_at(T: float, t: float, u: float) -> int:
    """Number of k >= 1 with k*t + u <= T in floating point (may be <= 0: then none)."""
    k = math.floor((T - u) / t)
    while (k + 1) * t + u <= T:
        k += 1
    while k * t + u > T:
        k -= 1
    return k


VEC = 32   # from this many groups on, the slot counts run in numpy (the same IEEE arithmetic)


def _arrays(ts: Floats, us: Floats, cs: Ints) -> tuple[FloatArray, FloatArray, IntArray]:
    return np.asarray(ts, dtype=np.float64), np.asarray(us, dtype=np.float64), np.asarray(cs, dtype=np.int64)


def count_slots(T: float, ts: Sequence[float], us: Sequence[float], cs: Sequence[int], kmin: int = 1) -> int:
    """sum over groups of c * max(0, k_at(T) - kmin + 1)."""
    if len(ts) >= VEC:
        t, u, c = _arrays(ts, us, cs)
        kv = k_at_vec(np.full(1, T), t, u) - kmin + 1
        return int(np.maximum(kv, 0) @ c)
    tot = 0
    for t_, u_, c_ in zip(ts, us, cs):
        k = k_at(T, t_, u_) - kmin + 1
        if k > 0:
            tot += c_ * k
    return tot


def _next_slot(lo: float, ts: Floats, us: Floats, kmin: int) -> float:
    """The smallest slot value k*t + u (k >= kmin) above lo."""
    if len(ts) >= VEC:
        t, u = np.asarray(ts, dtype=np.float64), np.asarray(us, dtype=np.float64)
        k = np.maximum(k_at_vec(np.full(1, lo), t, u) + 1, kmin)
        return float(np.min(k * t + u))
    return min(max(k_at(lo, t, u) + 1, kmin) * t + u for t, u in zip(ts, us))


def first_slot(M: int, lo: float, hi: float, ts: Floats, us: Floats, cs: Ints, kmin: int = 1) -> float:
    """Smallest slot value s (slots k*t + u with k >= kmin) with count(s) >= M.

    Requires count(lo) < M <= count(hi), count(T) = sum c * max(0, k_at(T) - kmin + 1).
    Bisection on T, plus a step to the next slot value above lo, which ends on the exact slot.
    """
    def count(T: float) -> int:
        return count_slots(T, ts, us, cs, kmin)

    while True:
        nxt = _next_slot(lo, ts, us, kmin)  # first slot > lo
        if count(nxt) >= M:
            return nxt
        lo = nxt
        mid = lo + (hi - lo) * 0.5
        if lo < mid < hi:
            if count(mid) >= M:
                hi = mid
            else:
                lo = mid


def upper_makespan(M: int, ts: Floats, us: Floats, cs: Ints, floor_: float) -> float:
    """A makespan with count >= M (continuous bound plus one micro-batch of the slowest)."""
    tmax = max(ts)
    hi = max((M + sum(c * u / t for t, u, c in zip(ts, us, cs))) / sum(c / t for t, c in zip(ts, cs)),
             floor_) + tmax
    while count_slots(hi, ts, us, cs) < M:
        hi += tmax
    return hi


def makespan_all(M: int, ts: Floats, us: Floats, cs: Ints) -> float | None:
    """Optimal compute makespan when every rank runs >= 1 micro-batch (None: M < #ranks)."""
    if M < sum(cs):
        return None
    t_lo = max(t + u for t, u in zip(ts, us))
    if count_slots(t_lo, ts, us, cs) >= M:
        return t_lo
    lo = t_lo
    cont = (M + sum(c * u / t for t, u, c in zip(ts, us, cs))) / sum(c / t for t, c in zip(ts, cs))
    cand = cont - 1e-9 * abs(cont)
    if cand > lo and count_slots(cand, ts, us, cs) < M:
        lo = cand
    return first_slot(M, lo, upper_makespan(M, ts, us, cs, lo), ts, us, cs)


def n_min(T: float, M: int, ts: Floats, us: Floats, cs: Ints) -> int | None:
    """Fewest ranks holding M micro-batches within makespan T (None: impossible)."""
    ks = sorted(((k_at(T, t, u), c) for t, u, c in zip(ts, us, cs)), reverse=True)
    acc = n = 0
    for k, c in ks:
        if k <= 0:
            break
        if acc + c * k >= M:
            return n + -(-(M - acc) // k)
        acc += c * k
        n += c
    return None


def best_with_drop(M: int, ts: Floats, us: Floats, cs: Ints,
                   tail: Callable[[int], float]) -> tuple[float, float, int]:
    """(iteration time, makespan, participants) minimising makespan + tail(participants)."""
    c0 = first_slot(M, 0.0, upper_makespan(M, ts, us, cs, 0.0), ts, us, cs)
    t1 = tail(1)
    end = c0 + (tail(sum(cs)) - t1)
    heap: list[tuple[float, int, int]] = []
    for g, (t, u) in enumerate(zip(ts, us)):
        k = max(k_at(c0, t, u), 1)
        if k * t + u < c0:
            k += 1
        heapq.heappush(heap, (k * t + u, g, k))
    best: tuple[float, float, int] | None = None
    last: float | None = None
    while heap:
        T, g, k = heapq.heappop(heap)
        if T > end or (best is not None and T + t1 >= best[0]):
            break
        heapq.heappush(heap, ((k + 1) * ts[g] + us[g], g, k + 1))
        if T == last:
            continue
        last = T
        n = n_min(T, M, ts, us, cs)
        assert n is not None   # T >= c0, so count(T) >= M
        val = T + tail(n)
        if best is None or val < best[0]:
            best = (val, T, n)
    assert best is not None
    return best


def fill_counts(b: int, R: int, subs: list[tuple[float, float, list[int]]], Q: int, hi: float) -> Plan:
    """Counts for running ranks: 1 each, plus the Q earliest extra slots (k >= 2).

    subs: (t, u, members ascending) of the running ranks; hi: a makespan holding them all.
    Extra slots are taken in order of finishing time, then rank index; equivalently the excess of
    the full-capacity assignment is removed from the latest finisher first, highest index first.
    """
    n = [0] * R
    for _, _, mem in subs:
        for i in mem:
            n[i] = 1
    if Q <= 0:
        return Plan(b, tuple(n))
    ts = [s[0] for s in subs]
    us = [s[1] for s in subs]
    cs = [len(s[2]) for s in subs]
    V = first_slot(Q, 0.0, hi, ts, us, cs, kmin=2)   # value of the Q-th extra slot
    at_members = []
    for t, u, mem in subs:
        K = k_at(V, t, u)
        at = K >= 2 and K * t + u == V
        below = max(K - 1 - at, 0)
        for i in mem:
            n[i] += below
            Q -= below
        if at:
            at_members += mem
    at_members.sort()
    for i in at_members[:Q]:
        n[i] += 1
    return Plan(b, tuple(n))


# ---------------------------------------------------------------------------------------------
# every makespan of one b at once (plan_range)
# ---------------------------------------------------------------------------------------------

def extra_slots_range(q_lo: int, q_hi: int, ts: Floats, us: Floats, cs: Ints) -> FloatArray:
    """For Q = q_lo..q_hi: value of the Q-th smallest extra slot (k >= 2; 0.0 for Q = 0).

    The optimal makespan with every rank running M = R + Q micro-batches is max(T_lo, that value)
    (see identical.py's docstring); one sort of the merged slot sequences serves every Q.
    """
    Qs = np.arange(q_lo, q_hi + 1)
    if q_hi <= 0:
        return np.zeros(len(Qs))
    t_lo = max(t + u for t, u in zip(ts, us))
    hi = upper_makespan(q_hi + sum(cs), ts, us, cs, t_lo)
    while True:
        vals: list[FloatArray] = []
        wts: list[IntArray] = []
        for tj, uj, cj in zip(ts, us, cs):
            K = max(k_at(hi, tj, uj), 1)
            vals.append(np.arange(2, K + 2, dtype=float) * tj + uj)
            wts.append(np.full(K, cj, dtype=np.int64))
        v = np.concatenate(vals)
        order = np.argsort(v, kind="stable")
        v = v[order]
        cw = np.cumsum(np.concatenate(wts)[order])
        if cw[-1] >= q_hi:
            break
        hi += max(ts)
    idx = np.searchsorted(cw, np.maximum(Qs, 1), side="left")
    return np.where(Qs > 0, v[idx], 0.0)


def k_at_vec(T: FloatArray, t: FloatArray, u: FloatArray) -> IntArray:
    K = np.floor((T - u) / t).astype(np.int64)
    K -= (K * t + u > T)
    K += ((K + 1) * t + u <= T)
    return K
