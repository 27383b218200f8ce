"""Planner: (global batch B, one GPU type per rank, perf model) -> the fastest exact Plan.

Pure (plain Python + numpy). IIDP's rule (docs/formulas.md, section 5): every rank runs micro-batches
of one size b, rank i runs n_i of them, B = b * sum(n_i) exactly. Under the perf model
(perfmodel.py) the iteration time of (b, n) is

    T(b, n) = max_{i: n_i > 0} (n_i t_i + u_i) + tail(N)

with t_i = t_micro(gpu_i, b, speed_factor_i), u_i = update_s(gpu_i), N = #{i: n_i > 0} and
tail(N) = (1 - overlap) * allreduce(grad_bytes, N), non-decreasing in N (a, c >= 0).

Why the answer is exactly optimal
---------------------------------
Fix b, so M = B / b is fixed. Call rank i's *slots* the values s_ik = k t_i + u_i, k = 1, 2, ...
(the finishing time of rank i if it runs k micro-batches), and count(T) the number of slots <= T.

*Every rank runs (n_i >= 1).* N = #ranks, so only the compute makespan C = max_i(n_i t_i + u_i)
varies. A makespan C is achievable iff every rank fits one micro-batch (C >= T_lo = max_i(t_i +
u_i)) and the ranks can hold M micro-batches within C, i.e. sum_i floor((C - u_i)/t_i) =
count(C) >= M: take n_i = floor((C - u_i)/t_i) >= 1 and lower some n_i (never below 1) until the
sum is M - lowering never raises the makespan; conversely any plan with makespan C has
n_i <= floor((C - u_i)/t_i). count is a non-decreasing step function that only jumps at slot
values, and the makespan of any plan is a slot value, so the optimum is

    C* = max(T_lo, the smallest slot s with count(s) >= M),

found by bisection on C plus a walk over the slot values (``first_slot``), which returns exactly
that slot. Slots are computed with the same floating-point expression (n * t + u) as
``PerfModel.iteration_time``, and count(T) is made consistent with it (``k_at``), so C* equals
what the model reports for the returned plan, bit for bit.

*Ranks may be dropped (allow_drop).* Now N varies. For a makespan C let N_min(C) be the fewest
ranks that hold M micro-batches within C (take ranks by decreasing floor((C - u_i)/t_i)).
Any plan with makespan C and N participants has N >= N_min(C), hence costs
C + tail(N) >= C + tail(N_min(C)), and C + tail(N_min(C)) is achieved (use those N_min ranks, lower
counts to sum M, none to zero since N_min is minimal). So the optimum is min over slot values C
(count(C) >= M) of C + tail(N_min(C)). With C0 the smallest feasible makespan, a C beyond
C0 + tail(R) - tail(1) cannot win (C + tail(1) > C0 + tail(R) >= value at C0), so only the slot
values in that window are scanned, in increasing order, stopping as soon as C + tail(1) reaches
the best value found. Ranks whose memory cap is below b can only be dropped.

Across b the smaller iteration time wins. Ties, deterministically: the larger b. Within one b
every running rank gets its first micro-batch, and the remaining ones go to the earliest extra
slots (k >= 2) in order of finishing time, then rank index (``fill_counts``) - the same as removing
the excess of the full-capacity assignment from the latest finisher first, highest index first.
So interchangeable ranks differ by at most one micro-batch and the lower index gets more. With
dropping, the participants are the ranks with the most capacity at C*, lower index first.

Speed: ranks of the same GPU type and speed factor are interchangeable, so all searches run over
groups (a handful) instead of ranks, and ``plan_range`` computes every makespan of one b at once
as order statistics of the merged slot sequences (numpy), then builds all plans in bulk.

Layout: this module checks the input, groups the ranks and chooses b; the slot arithmetic on the
groups (``k_at``, ``first_slot``, ``fill_counts``, ...) is in slots.py.

Per-rank micro-batch sizes (``plan_batch(..., per_rank=True)``): each rank its own b_i, the last
micro-batch partial; exact by a capacity bisection over the makespan, in per_rank.py. Its
allowed sizes include every identical-b candidate, so it is never slower than the identical-b plan.
On a non-monotone profile per_rank.py is exact for its running maximum only, so the result is
the faster (model price) of that plan and the identical-b one; prices.py prices ranges.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpc_jabas.core.config import gpus as _gpus
from hpc_jabas.core.config.validate import integer, passes
from hpc_jabas.core.perf.perfmodel import ComputeProfile, PerfModel, check_speed_factors
from hpc_jabas.core.planning.per_rank import RankGroup, TypeTable, is_monotone, plan_per_rank
from hpc_jabas.core.planning.plan import Plan
from hpc_jabas.core.planning.slots import (
    FloatArray,
    IntArray,
    best_with_drop,
    extra_slots_range,
    fill_counts,
    k_at,
    k_at_vec,
    makespan_all,
)
from hpc_jabas.errors import ConfigError, InfeasibleError

MAX_RANGE = 10_000_000  # widest B range plan_range accepts (one row per feasible B)
MIN_T_S = 1e-12         # smallest micro-batch time the planner accepts (seconds)
MIN_T_REL = 1e-9        # ... and relative to the rank's update_s


# ---------------------------------------------------------------------------------------------
# input checking and grouping
# ---------------------------------------------------------------------------------------------

@dataclass
class _Group:
    gpu: str
    sf: float
    ranks: list[int]      # ascending rank indices
    cap: int              # memory cap max_b
    update_s: float


@dataclass
class _Ctx:
    model: PerfModel
    R: int
    groups: list[_Group]
    gor: IntArray         # group index of every rank
    cands: list[int]      # usable candidate b, ascending (per-rank mode: every candidate)
    allow_drop: bool
    default_cands: bool = True   # no b_candidates given: the profiles' measured sizes

    def eligible(self, b: int) -> list[int]:
        return [j for j, g in enumerate(self.groups) if g.cap >= b]

    def params(self, b: int, which: Iterable[int]) -> tuple[list[float], list[float], list[int]]:
        """Per group in ``which``: (t_micro at b = profile time / speed factor, update_s, rank count)."""
        idx = np.fromiter(which, dtype=np.int64)
        if not hasattr(self, "_gsf"):
            names = sorted({g.gpu for g in self.groups})
            self._names = names
            self._gt = np.array([names.index(g.gpu) for g in self.groups], dtype=np.int64)
            self._gsf = np.array([g.sf for g in self.groups], dtype=np.float64)
            self._gu = np.array([g.update_s for g in self.groups], dtype=np.float64)
            self._gc = np.array([len(g.ranks) for g in self.groups], dtype=np.int64)
        used = set(self._gt[idx].tolist())                 # types of these groups (others may not fit b)
        base = np.array([self.model.profile(n).time(b) if k in used else np.nan for k, n in enumerate(self._names)])
        t = base[self._gt[idx]] / self._gsf[idx]          # = model.t_micro(gpu, b, sf), the same division
        u = self._gu[idx]
        ok = (t >= MIN_T_S) & (t >= MIN_T_REL * u) & np.isfinite(t)
        if not ok.all():
            j = int(idx[int(np.argmin(ok))])
            g, tj = self.groups[j], float(t[int(np.argmin(ok))])
            # slots k*t + u would stop increasing in floating point: no plan can be ranked
            raise ConfigError(f"micro-batch time {tj:g} s of {g.gpu} at b={b} is too small next to its "
                              f"update_s={g.update_s:g} s; times must be >= {MIN_T_S:g} s and >= "
                              f"{MIN_T_REL:g} x update_s")
        return t.tolist(), u.tolist(), self._gc[idx].tolist()


def _check_B(B: Any, what: str = "global batch B") -> int:
    if isinstance(B, bool):
        raise ConfigError(f"{what}={B!r} must be a positive integer")
    if isinstance(B, (float, np.floating)) and math.isfinite(B) and float(B).is_integer():
        B = int(B)
    if not isinstance(B, (int, np.integer)) or B <= 0:
        raise ConfigError(f"{what}={B!r} must be a positive integer")
    return int(B)


def _prepare(gpus: Sequence[str], model: PerfModel, b_candidates: Iterable[int] | None,
             speed_factors: Sequence[float] | None, allow_drop: bool, per_rank: bool = False) -> _Ctx:
    if not isinstance(model, PerfModel):
        raise ConfigError(f"model is a {type(model).__name__}, not a PerfModel")
    if isinstance(gpus, str):
        gpus = [gpus]
    names = list(gpus)
    if not names:
        raise ConfigError("no GPU given; give one GPU type per rank, e.g. v100,v100,p100")
    key_of = {}
    prof_of: dict[str, ComputeProfile] = {}
    for nm in names:
        if nm not in key_of:
            key = _gpus.normalize(nm)
            prof_of[key] = model.profile(key)  # a type the model has no profile for is an error here
            key_of[nm] = key
    sf = check_speed_factors(speed_factors, len(names))
    index: dict[tuple[str, float], int] = {}
    groups: list[_Group] = []
    gor = np.empty(len(names), dtype=np.int64)
    for i, (nm, f) in enumerate(zip(names, sf)):
        k = (key_of[nm], f)
        j = index.get(k)
        if j is None:
            p = prof_of[k[0]]
            assert p.max_b is not None   # ComputeProfile.__post_init__ sets it
            j = index[k] = len(groups)
            groups.append(_Group(k[0], f, [], p.max_b, p.update_s))
        groups[j].ranks.append(i)
        gor[i] = j

    if b_candidates is None:
        cands = sorted({b for p in prof_of.values() for b in p.b})
        origin = "measured micro-batch sizes"
    else:
        if isinstance(b_candidates, (int, str)):
            raise ConfigError(f"b_candidates={b_candidates!r} must be a list of integers >= 1")
        cands = []
        for b in b_candidates:
            if not passes(integer, b, lo=1, whole_float=False):
                raise ConfigError(f"candidate micro-batch b={b!r} must be an integer >= 1")
            cands.append(int(b))
        cands = sorted(set(cands))
        origin = "candidate micro-batch sizes"
        if not cands:
            raise ConfigError("b_candidates is empty; give at least one micro-batch size, e.g. [8, 16, 32]")
    if per_rank:
        return _Ctx(model, len(names), groups, gor, cands, bool(allow_drop), b_candidates is None)
    if allow_drop:
        top = max(groups, key=lambda g: g.cap)
        usable = [b for b in cands if b <= top.cap]
        if not usable:
            raise InfeasibleError(f"no GPU fits the smallest {origin[:-1]} b={cands[0]}: the largest memory "
                                  f"cap is max_b={top.cap} ({top.gpu}); use b <= {top.cap}")
    else:
        low = min(groups, key=lambda g: (g.cap, g.ranks[0]))
        usable = [b for b in cands if b <= low.cap]
        if not usable:
            raise InfeasibleError(f"memory cap of {low.gpu} (max_b={low.cap}) is below the smallest {origin[:-1]} "
                                  f"b={cands[0]} (tried {cands}); use b <= {low.cap}, "
                                  "or leave that GPU out")
    return _Ctx(model, len(names), groups, gor, usable, bool(allow_drop), b_candidates is None)


def _build_all(ctx: _Ctx, b: int, M: int, T: float) -> Plan:
    ts, us, _ = ctx.params(b, range(len(ctx.groups)))
    return fill_counts(b, ctx.R, [(t, u, g.ranks) for t, u, g in zip(ts, us, ctx.groups)], M - ctx.R, T)


def _build_drop(ctx: _Ctx, b: int, M: int, T: float, n_part: int) -> Plan:
    elig = ctx.eligible(b)
    ts, us, _ = ctx.params(b, elig)
    ks = [k_at(T, t, u) for t, u in zip(ts, us)]
    order = sorted((-ks[j], i, j) for j, gj in enumerate(elig) for i in ctx.groups[gj].ranks if ks[j] > 0)
    chosen: dict[int, list[int]] = {}
    for _, i, j in order[:n_part]:
        chosen.setdefault(j, []).append(i)
    subs = [(ts[j], us[j], sorted(m)) for j, m in sorted(chosen.items())]
    return fill_counts(b, ctx.R, subs, M - n_part, T)


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------

def _solve(ctx: _Ctx, B: int) -> tuple[Plan, float] | None:
    """Best (plan, iteration time) for B over the candidate b, or None when B is not realisable."""
    tail = ctx.model.allreduce_tail
    best = None  # (seconds, b, M, makespan, participants)
    for b in reversed(ctx.cands):           # larger b first: it keeps ties
        if B % b:
            continue
        M = B // b
        if ctx.allow_drop:
            elig = ctx.eligible(b)
            if not elig:
                continue
            ts, us, cs = ctx.params(b, elig)
            val, T, n_part = best_with_drop(M, ts, us, cs, tail)
        else:
            ts, us, cs = ctx.params(b, range(len(ctx.groups)))
            T_all = makespan_all(M, ts, us, cs)
            if T_all is None:
                continue
            T = T_all
            n_part = ctx.R
            val = T + tail(n_part)
        if best is None or val < best[0]:
            best = (val, b, M, T, n_part)
    if best is None:
        return None
    val, b, M, T, n_part = best
    plan = _build_drop(ctx, b, M, T, n_part) if ctx.allow_drop else _build_all(ctx, b, M, T)
    return plan, val


def _feasible_M_min(ctx: _Ctx, b: int) -> int | None:
    if ctx.allow_drop:
        return 1 if ctx.eligible(b) else None
    return ctx.R


def _nearest(ctx: _Ctx, B: float, lo: int, hi: int | None) -> int | None:
    """Nearest feasible global batch to B within [lo, hi]; ties to the smaller."""
    best = None
    for b in ctx.cands:
        m_min = _feasible_M_min(ctx, b)
        if m_min is None:
            continue
        m_lo = max(m_min, -(-lo // b))
        m_hi = None if hi is None else hi // b
        if m_hi is not None and m_lo > m_hi:
            continue
        for m in (math.floor(B / b), math.ceil(B / b)):
            m = max(m, m_lo)
            if m_hi is not None:
                m = min(m, m_hi)
            cand = b * m
            key = (abs(cand - B), cand)
            if best is None or key < best[0]:
                best = (key, cand)
    return None if best is None else best[1]


def _rank_tables(ctx: _Ctx) -> tuple[list[TypeTable], list[RankGroup]]:
    """Per-rank mode: each GPU type's allowed sizes A and tabulated times, and the groups (per_rank.py).

    A: the candidates within the type's memory cap, plus the cap itself when the candidates are the
    default (the profiles' measured sizes), so every identical-b plan is also a per-rank one.
    """
    types: list[TypeTable] = []
    index: dict[str, int] = {}
    groups = []
    for g in ctx.groups:
        j = index.get(g.gpu)
        if j is None:
            A = sorted({b for b in ctx.cands if b <= g.cap} | ({g.cap} if ctx.default_cands else set()))
            if not A:
                raise InfeasibleError(f"memory cap of {g.gpu} (max_b={g.cap}) is below the smallest candidate "
                                      f"micro-batch b={ctx.cands[0]}; use b <= {g.cap} or leave that GPU out")
            tt = np.asarray(ctx.model.profile(g.gpu).time_table(A[-1]), dtype=float)
            if not math.isfinite(float(tt[-1])):
                raise ConfigError(f"micro-batch time of {g.gpu} at b={A[-1]} is not finite")
            j = index[g.gpu] = len(types)
            types.append(TypeTable(tt, np.asarray(A, dtype=np.int64), g.update_s))
        t0 = float(types[j].tt[0]) / g.sf
        if not (t0 >= MIN_T_S and t0 >= MIN_T_REL * g.update_s):
            raise ConfigError(f"micro-batch time {t0:g} s of {g.gpu} at b=1 is too small next to its "
                              f"update_s={g.update_s:g} s; times must be >= {MIN_T_S:g} s and >= "
                              f"{MIN_T_REL:g} x update_s")
        groups.append(RankGroup(j, g.sf, list(g.ranks)))
    return types, groups


def plan_batch(B: int, gpus: Sequence[str], model: PerfModel, *, b_candidates: Iterable[int] | None = None,
               speed_factors: Sequence[float] | None = None, allow_drop: bool = False,
               per_rank: bool = False) -> Plan:
    """The plan with b * sum(n) == B that minimises ``model.iteration_time`` (see module docstring).

    gpus: one GPU type (catalog name or alias) per rank. b_candidates: micro-batch sizes to try
    (default: the measured b values of the used types' profiles that fit every rank's memory cap;
    with allow_drop, that fit some rank's cap). allow_drop: a rank may get n_i = 0 (and then its
    memory cap does not matter). speed_factors: per rank, divides its micro-batch time.
    per_rank: each rank its own micro-batch size (per_rank.py; every rank runs, allow_drop is
    refused): the exact optimum over per-rank plans, never slower than the identical-b optimum.
    """
    B = _check_B(B)
    if per_rank:
        if allow_drop:
            raise ConfigError("allow_drop is not supported with per-rank micro-batch sizes; "
                              "plan with identical b to drop ranks")
        ctx = _prepare(gpus, model, b_candidates, speed_factors, False, per_rank=True)
        if B < ctx.R:
            raise InfeasibleError(f"global batch B={B} is too small for {ctx.R} GPUs: each needs at least one "
                                  f"sample, so B >= {ctx.R}; raise B or use fewer GPUs")
        types, groups = _rank_tables(ctx)
        plan = plan_per_rank(types, groups, ctx.R, B)
        if is_monotone(types):
            return plan
        return per_rank_or_identical(plan, B, gpus, model, b_candidates, speed_factors)
    ctx = _prepare(gpus, model, b_candidates, speed_factors, allow_drop)
    b_min = ctx.cands[0]
    if not allow_drop and B < b_min * ctx.R:
        raise InfeasibleError(f"global batch B={B} is too small for {ctx.R} GPUs: each needs at least one "
                              f"micro-batch of b >= {b_min}, so B >= {b_min * ctx.R}; raise B or use fewer GPUs")
    res = _solve(ctx, B)
    if res is None:
        near = _nearest(ctx, B, 1, None)
        need = "" if allow_drop else f" with at least {ctx.R} micro-batches (one per GPU)"
        raise InfeasibleError(f"global batch B={B} is not b * M for any candidate micro-batch b in {ctx.cands}"
                              f"{need}; nearest feasible B is {near}")
    return res[0]


def plan_range(B_min: int, B_max: int, gpus: Sequence[str], model: PerfModel, *,
               b_candidates: Iterable[int] | None = None, speed_factors: Sequence[float] | None = None,
               allow_drop: bool = False) -> list[tuple[int, Plan, float]]:
    """(B, best plan, predicted iteration seconds) for every feasible B in [B_min, B_max], B ascending.

    Each row equals ``plan_batch(B, ...)`` and ``model.iteration_time(plan, gpus)``. Without
    dropping, one b costs one sort of the merged slot sequences, whatever the number of B values.
    With allow_drop each B is solved on its own (slower).
    """
    B_min = _check_B(B_min, "B_min")
    B_max = _check_B(B_max, "B_max")
    if B_min > B_max:
        raise ConfigError(f"batch range {B_min}:{B_max} is empty; B_min must be <= B_max")
    if B_max - B_min > MAX_RANGE:
        raise ConfigError(f"batch range {B_min}:{B_max} spans more than {MAX_RANGE} values; narrow it")
    ctx = _prepare(gpus, model, b_candidates, speed_factors, allow_drop)
    if allow_drop:
        Bs = sorted({b * m for b in ctx.cands if ctx.eligible(b)
                     for m in range(max(1, -(-B_min // b)), B_max // b + 1)})
        out = []
        for B in Bs:
            res = _solve(ctx, B)
            if res is not None:
                out.append((B, res[0], res[1]))
        return out

    best_T, best_b, per_b = _best_times(ctx, B_min, B_max)
    R = ctx.R
    tail = ctx.model.allreduce_tail(R)
    rows: list[tuple[int, Plan, float]] = []
    for b, (ts, us, m_lo, V, T) in per_b.items():
        sel = np.nonzero(best_b == b)[0]
        if len(sel):
            Msel = (sel + B_min) // b
            rows += _bulk_plans(ctx, b, ts, us, Msel, V[Msel - m_lo], T[Msel - m_lo], tail)
    rows.sort(key=lambda r: r[0])
    return rows


def _best_times(ctx: _Ctx, B_min: int, B_max: int) -> tuple[FloatArray, IntArray, dict[int, Any]]:
    """Every rank runs: per B in [B_min, B_max] (index B - B_min) the least compute makespan over the
    candidate b (inf: B is not realisable) and the b that reaches it (ties: the larger b); per b its
    (ts, us, m_lo, V, T), V and T over M = m_lo..B_max // b (``plan_range`` builds its plans from them)."""
    R = ctx.R
    width = B_max - B_min + 1
    best_T = np.full(width, np.inf)
    best_b = np.zeros(width, dtype=np.int64)
    per_b: dict[int, Any] = {}
    for b in reversed(ctx.cands):            # larger b first; strict '<' keeps it on ties
        m_lo = max(R, -(-B_min // b))
        m_hi = B_max // b
        if m_lo > m_hi:
            continue
        ts, us, cs = ctx.params(b, range(len(ctx.groups)))
        V = extra_slots_range(m_lo - R, m_hi - R, ts, us, cs)
        T = np.maximum(V, max(t + u for t, u in zip(ts, us)))
        per_b[b] = (ts, us, m_lo, V, T)
        pos = b * np.arange(m_lo, m_hi + 1) - B_min
        better = T < best_T[pos]
        best_T[pos[better]] = T[better]
        best_b[pos[better]] = b
    return best_T, best_b, per_b


class RangeTimes:
    """``plan_range``'s (B, predicted iteration seconds) for ranges of B on fixed ranks, without building
    the plans (identical b, every rank runs): the ranks are checked and grouped once (ConfigError,
    InfeasibleError as ``plan_range``), each :meth:`rows` call runs the same per-b makespans."""

    def __init__(self, gpus: Sequence[str], model: PerfModel, *, b_candidates: Iterable[int] | None = None,
                 speed_factors: Sequence[float] | None = None) -> None:
        self._ctx = _prepare(gpus, model, b_candidates, speed_factors, False)

    def rows(self, B_min: int, B_max: int) -> list[tuple[int, float]]:
        """(B, seconds) for every realisable B in [B_min, B_max], B ascending: the B and the seconds of
        ``plan_range(B_min, B_max, ...)``'s rows, bit for bit."""
        B_min, B_max = _check_B(B_min, "B_min"), _check_B(B_max, "B_max")
        if B_min > B_max:
            raise ConfigError(f"batch range {B_min}:{B_max} is empty; B_min must be <= B_max")
        if B_max - B_min > MAX_RANGE:
            raise ConfigError(f"batch range {B_min}:{B_max} spans more than {MAX_RANGE} values; narrow it")
        best_T, _, _ = _best_times(self._ctx, B_min, B_max)
        tail = self._ctx.model.allreduce_tail(self._ctx.R)
        idx = np.nonzero(np.isfinite(best_T))[0]
        return [(int(B_min + i), float(best_T[i]) + tail) for i in idx.tolist()]


def _bulk_plans(ctx: _Ctx, b: int, ts: Sequence[float], us: Sequence[float], Msel: IntArray, Vsel: FloatArray,
                Tsel: FloatArray, tail: float, chunk: int = 256) -> list[tuple[int, Plan, float]]:
    """Rows (B, plan, seconds) for many M of one b at once: ``fill_counts``'s rule in numpy."""
    t = np.asarray(ts, dtype=float)[None, :]
    u = np.asarray(us, dtype=float)[None, :]
    c = np.array([len(g.ranks) for g in ctx.groups], dtype=np.int64)
    gor = ctx.gor
    out = []
    for s0 in range(0, len(Msel), chunk):
        M = Msel[s0:s0 + chunk]
        V = Vsel[s0:s0 + chunk, None]
        K = k_at_vec(V, t, u)
        at = (K >= 2) & (K * t + u == V)
        below = np.maximum(K - 1 - at, 0)
        rem = (M - ctx.R) - below @ c
        at_r = at[:, gor]
        n2d = below.astype(np.int32)[:, gor]
        n2d += 1
        n2d += at_r & (np.cumsum(at_r, axis=1, dtype=np.int32) <= rem[:, None])
        if np.any(n2d.sum(axis=1) != M) or np.any(n2d < 1):   # cheap guard on the bulk path
            raise AssertionError("planner: bulk plan construction is inconsistent (internal error)")
        for m, T, n in zip(M.tolist(), Tsel[s0:s0 + chunk].tolist(), n2d.tolist()):
            out.append((b * m, _trusted_plan(b, tuple(n)), T + tail))
    return out


def _trusted_plan(b: int, n: tuple[int, ...]) -> Plan:
    """An identical-b Plan from counts already checked in bulk (ints >= 1, exact sum), skipping the
    per-item validation of Plan.__init__, which costs ~0.1 ms per 1024-rank plan and would dominate
    a range table. Kept in step with plan.Plan's fields (bs, n, xs); tests compare against Plan(b, n).
    """
    p = object.__new__(Plan)
    object.__setattr__(p, "bs", (b,) * len(n))
    object.__setattr__(p, "n", n)
    object.__setattr__(p, "xs", tuple(b * k for k in n))
    return p


def snap_batch(B: float, gpus: Sequence[str], model: PerfModel, *, b_candidates: Iterable[int] | None = None,
               speed_factors: Sequence[float] | None = None, allow_drop: bool = False,
               B_min: int | None = None, B_max: int | None = None) -> int:
    """The feasible global batch nearest to B (B may be fractional), within [B_min, B_max].

    Rule: minimise |B' - B| over the feasible B' (some candidate b divides B' with B'/b >= #GPUs,
    or >= 1 with allow_drop) inside the bounds; on a tie take the smaller B'. A target outside the
    bounds therefore snaps to the nearest feasible value inside them.
    """
    if isinstance(B, bool) or not isinstance(B, (int, float, np.integer, np.floating)) \
            or not math.isfinite(B) or B <= 0:
        raise ConfigError(f"global batch B={B!r} must be a positive number")
    lo = 1 if B_min is None else _check_B(B_min, "B_min")
    hi = None if B_max is None else _check_B(B_max, "B_max")
    if hi is not None and lo > hi:
        raise ConfigError(f"batch bounds B_min={lo} > B_max={hi}; B_min must be <= B_max")
    ctx = _prepare(gpus, model, b_candidates, speed_factors, allow_drop)
    near = _nearest(ctx, float(B), lo, hi)
    if near is None:
        raise InfeasibleError(f"no feasible global batch in [{lo}, {hi}] for {ctx.R} GPUs with micro-batch "
                              f"sizes {ctx.cands}: the smallest is {ctx.cands[0] * (1 if allow_drop else ctx.R)}")
    return near


def identical_rows(lo: int, hi: int, gpus: Sequence[str], model: PerfModel, b_candidates: list[int] | None,
                   speed_factors: Sequence[float] | None) -> list[tuple[int, Plan, float]]:
    try:
        return plan_range(lo, hi, gpus, model, b_candidates=b_candidates, speed_factors=speed_factors)
    except InfeasibleError:
        return []


def per_rank_or_identical(plan: Plan, B: int, gpus: Sequence[str], model: PerfModel,
                          b_candidates: Iterable[int] | None, speed_factors: Sequence[float] | None) -> Plan:
    """The per-rank plan (optimal for the profile's running maximum) or, when the model prices it
    faster, the identical-b plan (it may use a measured dip)."""
    rows = identical_rows(B, B, gpus, model, None if b_candidates is None else list(b_candidates), speed_factors)
    if rows and rows[0][2] < model.iteration_time(plan, gpus, speed_factors):
        return rows[0][1]
    return plan
