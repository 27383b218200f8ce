"""The epoch-end decision at cluster scale: branch-and-bound over allocation units. Pure.

``autoscale.choose`` prices a list of candidate mixes; listing every mix (``enumerate_mixes``) grows as
prod(free[p] + 1) (four partitions of 64 free GPUs: 17.8 million). :func:`search` returns the same
decision without listing them.

Granularity (:func:`allowed_counts`): partition p offers 0, every multiple of ``unit[p]`` up to its free
GPUs (``unit`` = GPUs per node: whole nodes; JABAS: 4-GPU nodes, 2-GPU minimum units) and every count
1..``exact_upto`` (exact counts where few). ``unit = 1`` offers every count, as ``enumerate_mixes``.

The bound (:class:`Bound`, in mixbound.py): one epoch of S samples on a mix n (n_p GPUs of partition
p, N in all) takes at least

    L(n) = max(S / sum_p n_p * peak_p, iters(N) * max_{p: n_p > 0} floor_p) + iters(N) * tail(N),

peak_p: the most samples per second one GPU of p processes (the largest b / t_p(b) of its profile over
1 <= b <= max_b); floor_p: the least compute time of one iteration on a GPU of p (every rank runs one
micro-batch at least: min over allowed b of t_p(b) + update_s); iters(N): the fewest iterations an
epoch has (ceil(S / B_max), or with the forecast: each period's B is at most the snapped bound of
``mixbound.snapped_iterations``, non-increasing in N); tail(N): the allreduce time not hidden behind
compute (non-decreasing in N). It holds for ``autoscale.epoch_time_fn`` under the perf model: an
iteration of B samples lasts at least its slowest rank's compute, rank i's x_i samples take >=
x_i / peak_i, so >= B / sum_i peak_i, and >= floor of every partition in the mix; every rank runs
(optimal planner), so the tail is tail(N); an epoch's iterations price >= S samples. With lbbsp ranks
may idle: :func:`perf_bound` then uses tail(1), no floor and ceil(S / B_max). tests/test_mixsearch.py
checks L(n) <= epoch_time_fn(n) on random forecasts, ranges, micro-batches and mixes.

The search (:func:`search`): best-first over a tree whose level i fixes the count of the i-th partition
(time: fastest first; cost: cheapest per sample first). A node's key is the least objective total any
mix below it can have. With N the GPUs fixed so far, fl the largest floor fixed, and for each threshold
f (0 and each floor of an unfixed partition) the unfixed partitions with floor <= f: Nmax_f the most GPUs
they let the subtree reach, fill_f the most sum n_p peak_p (filled greedily by peak up to max_gpus),
I_f = iters(Nmax_f): time min over f of R * (max(S / fill_f, I_f * max(fl, f)) + I_f * tail(N)) + the
restart overhead (0 where the subtree still holds the current mix); cost the same with R * (max(S *
least rate/peak among what is fixed and what f lets add (a mediant bound), I_f * max(fl, f) * rate
fixed) + I_f * tail(N) * rate fixed) / 3600 + the overhead at the fixed rate. (A completion whose
added partitions' largest floor is f* is bounded by the least threshold >= f*: more GPUs mean fewer
iterations only by adding partitions whose floor then applies.) A child's key is never below its
parent's (per threshold its fill and Nmax are within the parent's; its floor, tail, rate and ratio are no
lower). A node's children are sorted by key into a chain; a popped node dives to a leaf through the first child of each
chain, leaving each chain's next sibling on the heap, so the heap's least key bounds every mix not yet
priced. Subtrees that cannot meet the budget/deadline or reach min_gpus are dropped. Leaves are priced
by ``epoch_time_fn`` (memoised) and, with ``wait_fn``, the queue wait (bound 0 until asked, asked only
of a mix that could still win). The search stops when the least key exceeds the best total found.

Exactness: when the bound holds for every mix (L(n) <= epoch_time_fn(n)) and the search ends inside
its work caps, the chosen mix's objective value equals brute force's (``choose`` over every mix of the
same counts): only subtrees whose every mix is provably worse than (or, under a limit, outside) the
best found are skipped, and ties are kept (pruning is strict). The final ranking and the margin /
restart-overhead rule are ``choose``'s own, run on the best mixes found plus the current one. Before
the tree, greedy fills at a few sizes (fastest and cheapest per sample first) and the current mix
scaled are priced as first incumbents; exactness does not depend on them.
Up to BRUTE_MAX mixes and no queue wait to ask, :func:`search` simply prices them all (``choose``).
Work: at most ``max_nodes`` node visits (each O(P * (P + the partition's allowed counts)), numpy),
``max_evals`` epoch_time_fn calls and ``max_waits`` wait_fn calls per decision; a search cut by a cap
says so in the reason, with the proven bound on how far its pick can be from the optimum (best total /
least bound left unexplored - 1, per the objective's primary metric). How often a cap is hit depends on
how tight L is for the job (it ignores integral micro-batches per rank and the snapped B's throughput):
random clusters of <= 4 partitions of <= 8 GPUs (the hypothesis test's) typically take <= ~150 nodes and
<= ~120 pricings; degenerate ties (equal speeds and rates) and queue waits (bounded by 0) can take many
more. A node whose primary bound ties the best and whose secondary bound is worse is skipped too (the
ranking is lexicographic). bench/autoscale_search.py shows the 4,096-GPU figures.
"""
from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from hpc_jabas.core.autoscale import (
    OBJECTIVES,
    Choice,
    EpochTimeFn,
    Mix,
    RestartOverhead,
    WaitFn,
    choose,
    mix_rate,
    price,
)
from hpc_jabas.core.mixbound import Bound as Bound
from hpc_jabas.core.mixbound import peak_rate as peak_rate
from hpc_jabas.core.mixbound import perf_bound as perf_bound
from hpc_jabas.core.mixbound import snapped_iterations as snapped_iterations
from hpc_jabas.core.validate import integer
from hpc_jabas.errors import ConfigError, InfeasibleError

MAX_NODES = 5_000       # search-tree nodes per decision
MAX_EVALS = 300         # epoch_time_fn calls per decision
MAX_WAITS = 24          # wait_fn calls per decision (each may be an `sbatch --test-only`)
SHORTLIST = 12          # priced mixes handed to choose (and kept in its table)
BRUTE_MAX = 256         # up to this many mixes (and no queue wait to ask): price them all, list them all
_REL = 1e-9             # pruning tolerance: ties are never pruned
NODE_CACHE_MAX = 20_000  # nodes a node_cache keeps per bound, granularity and objective


def allowed_counts(free: int, unit: int = 1, exact_upto: int = 0) -> list[int]:
    """The GPU counts a partition offers: 0, the multiples of ``unit`` <= free, and 1..exact_upto (<= free)."""
    free, unit = integer(free, "free", lo=0), integer(unit, "unit", lo=1)
    exact_upto = integer(exact_upto, "exact_upto", lo=0)
    return sorted(set(range(0, free + 1, unit)) | set(range(1, min(free, exact_upto) + 1)))


def _units(unit: int | Mapping[str, int], parts: Iterable[str]) -> dict[str, int]:
    if isinstance(unit, Mapping):
        return {p: integer(int(unit.get(p, 1)), f"unit[{p!r}]", lo=1) for p in parts}
    return {p: integer(unit, "unit", lo=1) for p in parts}


def partition_counts(free: Mapping[str, int], types: Mapping[str, str], max_gpus: int,
                     allowed: Iterable[str] | None = None, unit: int | Mapping[str, int] = 1,
                     exact_upto: int = 0) -> dict[str, list[int]]:
    """partition -> its allowed counts <= max_gpus (:func:`allowed_counts`), for the partitions to consider
    (``allowed``: names or GPU types, None: all) that have a free GPU; checked like ``enumerate_mixes``."""
    from hpc_jabas.core.autoscale import enumerate_mixes
    enumerate_mixes({p: 0 for p in free}, types, max_gpus, allowed=allowed)     # the same checks and messages
    for part, n in free.items():
        integer(n, f"free GPU count for partition {part!r}", lo=0)
    parts = sorted(free)
    if allowed is not None:
        names = {str(a) for a in allowed}
        parts = [p for p in parts if p in names or types[p] in names]
    units = _units(unit, parts)
    out = {p: [n for n in allowed_counts(free[p], units[p], exact_upto) if n <= max_gpus] for p in parts}
    return {p: c for p, c in out.items() if len(c) > 1}


def all_mixes(counts: Mapping[str, Sequence[int]], max_gpus: int, min_gpus: int = 1,
              max_partitions: int | None = None, limit: int | None = None) -> list[Mix] | None:
    """Brute force: every mix of the allowed counts within the limits (tests, small clusters); None when
    there are more than ``limit``."""
    parts = sorted(counts)
    maxp = len(parts) if max_partitions is None else max_partitions
    out: list[Mix] = []

    def rec(i: int, cur: Mix, total: int) -> None:
        if limit is not None and len(out) > limit:
            return
        if i == len(parts):
            if total >= min_gpus:
                out.append(dict(cur))
            return
        p = parts[i]
        for n in counts[p]:
            if total + n > max_gpus or (n and len(cur) >= maxp):
                continue
            if n:
                cur[p] = n
            rec(i + 1, cur, total + n)
            cur.pop(p, None)
    rec(0, {}, 0)
    return None if limit is not None and len(out) > limit else out


def _linear_order(parts: list[str], key: Callable[[str], float]) -> list[str]:
    return sorted(parts, key=lambda p: (key(p), p))


def search(current_mix: Mapping[str, int], free: Mapping[str, int], types: Mapping[str, str],
           epoch_time_fn: EpochTimeFn, rates: Mapping[str, float], objective: str,
           restart_overhead_s: float | RestartOverhead, bound: Bound, *, max_gpus: int, min_gpus: int = 1,
           allowed: Iterable[str] | None = None, max_partitions: int | None = None,
           unit: int | Mapping[str, int] = 1, exact_upto: int = 0, margin: float = 0.05,
           budget: float | None = None, deadline_s: float | None = None, remaining_epochs: float = 1,
           wait_fn: WaitFn | None = None, max_queue_wait_s: float | None = None,
           max_nodes: int = MAX_NODES, max_evals: int = MAX_EVALS, max_waits: int = MAX_WAITS,
           brute_max: int = BRUTE_MAX, node_cache: dict[Any, Any] | None = None) -> Choice:
    """``choose`` over every mix of :func:`partition_counts`, by branch-and-bound (module docstring).

    The arguments are ``choose``'s plus the cluster (``free``, ``types``, the limits and granularity), the
    ``bound`` and the work caps. Up to ``brute_max`` mixes and no ``wait_fn``: ``choose`` over all of them
    (the table lists every mix, as before the search existed). Otherwise the table lists the current mix
    and the best priced mixes (up to SHORTLIST; with ``wait_fn``, those whose wait was asked), and the
    reason ends with what the search did (mixes priced, nodes, queue estimates, exact or the proven gap).
    ``wait_fn`` is asked only of mixes that could still win, at most ``max_waits`` times (each may be an
    ``sbatch --test-only``). ``node_cache``: a dict the caller keeps across decisions; the search keeps in it,
    for the ``bound`` it was last given (another bound empties it), each expanded node's children and their
    bounds before R, the overhead and the limits enter (up to NODE_CACHE_MAX nodes per granularity and
    objective), so a later decision on the same bound and cluster reads them instead of recomputing them:
    the same values, the same decision (tests/test_mixsearch.py)."""
    obj = str(objective).strip().lower().replace("_", "-")
    if obj not in OBJECTIVES:
        raise ConfigError(f"unknown objective {objective!r}; valid objectives: {', '.join(OBJECTIVES)}")
    max_gpus, min_gpus = integer(max_gpus, "max_gpus", lo=1), integer(min_gpus, "min_gpus", lo=1)
    maxp = None if max_partitions is None else integer(max_partitions, "max_partitions", lo=1)
    counts = partition_counts(free, types, max_gpus, allowed, unit, exact_upto)
    overhead = restart_overhead_s.seconds if isinstance(restart_overhead_s, RestartOverhead) else \
        RestartOverhead._check(restart_overhead_s, "restart_overhead_s")
    choose(current_mix, [], lambda m: None, rates, obj, overhead, margin=margin, budget=budget,   # checks the
           deadline_s=deadline_s, remaining_epochs=remaining_epochs)                          # arguments alike
    R = float(remaining_epochs)
    missing = [p for p in counts if not bound.peak.get(p, 0.0) > 0]
    if missing:
        raise ConfigError(f"the search bound has no peak throughput > 0 for partition(s) {', '.join(missing)}")
    few = all_mixes(counts, max_gpus, min_gpus, maxp, limit=brute_max) if wait_fn is None and brute_max else None
    if few is not None:                          # a small cluster: every mix priced and listed, as before
        ch = choose(current_mix, few, epoch_time_fn, rates, obj, overhead, margin=margin, budget=budget,
                    deadline_s=deadline_s, remaining_epochs=remaining_epochs)
        return Choice(ch.mix, f"{ch.reason} (search: all {len(few)} mixes priced, exact)", ch.table, move=ch.move)
    cur = {p: int(n) for p, n in sorted(current_mix.items()) if n}
    cur_key = tuple(cur.items())
    epoch_memo: dict[tuple[tuple[str, int], ...], Any] = {}

    def fn(mix: Mix) -> float | None:          # memoised: choose re-prices the shortlist without a new call
        k = tuple(sorted(mix.items()))
        if k not in epoch_memo:
            try:
                epoch_memo[k] = epoch_time_fn(dict(mix))
            except InfeasibleError as e:
                epoch_memo[k] = e
        v = epoch_memo[k]
        if isinstance(v, InfeasibleError):
            raise v
        return v  # type: ignore[no-any-return]
    wait_memo: dict[tuple[tuple[str, int], ...], float | None] = {}

    def wfn(mix: Mix) -> float | None:
        k = tuple(sorted(mix.items()))
        if k not in wait_memo:
            wait_memo[k] = None if wait_fn is None else wait_fn(dict(mix))
        return wait_memo[k]

    stats = {"nodes": 0, "evals": 0, "waits": 0, "cut": 0}
    priced: dict[tuple[tuple[str, int], ...], tuple[float, float, int]] = {}   # key -> (total_t, total_c, gpus)

    def totals(key: tuple[tuple[str, int], ...], beat: tuple[int, float] | None) -> tuple[float, float] | None:
        """(total time, total cost) of a mix, or None when infeasible / cannot start. Prices it on demand;
        the wait is asked only when the mix could still win: ``beat`` = (0: time, 1: cost; the best so far)."""
        mix = dict(key)
        est = price(mix, fn, rates)
        if not est.feasible or est.time_s is None or est.cost is None:
            return None
        stay = key == cur_key
        move = 0.0 if stay else overhead
        t = R * est.time_s + move
        c = R * est.cost + move / 3600.0 * est.rate_per_hour
        if wait_fn is not None and not stay:
            if beat is not None and (t, c)[beat[0]] > beat[1] * (1 + _REL) + 1e-12:
                return t, c                       # cannot win even with no wait: leave the queue alone
            if key not in wait_memo:
                if stats["waits"] >= max_waits:
                    stats["cut"] = 1
                    return None
                stats["waits"] += 1
            w = wfn(mix)
            if w is None or (max_queue_wait_s is not None and w > max_queue_wait_s):
                return None
            t += w
        return t, c

    parts = list(counts)
    peak = {p: float(bound.peak[p]) for p in parts}
    floor = {p: float(bound.floor.get(p, 0.0)) for p in parts}
    count_arr = {p: np.array(counts[p], dtype=np.int64) for p in parts}      # ascending (allowed_counts)
    count_list = {p: [int(c) for c in counts[p]] for p in parts}
    # u when a partition's counts are 0, u, 2u, ... (whole units, no exact counts): its lookups are strided views
    step = {p: (cl[1] if len(cl) > 1 and cl == list(range(0, cl[-1] + 1, cl[1])) else 0)
            for p, cl in count_list.items()}
    rate = {p: float(mix_rate({p: 1}, rates)) for p in parts}
    peak_k = {p: count_arr[p] * peak[p] for p in parts}     # per count: its sum of peaks and its rate
    rate_k = {p: count_arr[p] * rate[p] for p in parts}

    tail_tab = np.array([bound.tail(max(n, 1)) if bound.tail is not None else 0.0 for n in range(max_gpus + 1)])
    iters_tab = bound.iters_table(max_gpus)

    def probes(order: list[str]) -> list[tuple[tuple[str, int], ...]]:
        """Mixes that fill partitions in ``order`` (the search's: fastest or cheapest per sample first) up to
        G GPUs, G = min_gpus, 2 min_gpus, 4 min_gpus, ... max_gpus: priced first, so that the search starts
        from a good incumbent (exactness does not depend on them)."""
        out: list[tuple[tuple[str, int], ...]] = []
        G = max(1, min_gpus)
        while True:
            mix: list[tuple[str, int]] = []
            left = G
            for p in order:
                if left <= 0 or (maxp is not None and len(mix) >= maxp):
                    break
                k = max(c for c in counts[p] if c <= left)
                if k:
                    mix.append((p, k))
                    left -= k
            n = G - left
            key = tuple(sorted(mix))
            if mix and n >= min_gpus and key not in out:
                out.append(key)
            if G >= max_gpus:
                return out
            G = min(max_gpus, 2 * G)

    def scaled_current() -> list[tuple[tuple[str, int], ...]]:
        """The current mix's shape at 1/4, 1/2, 2 and 4 times its counts (each rounded down to an allowed count)."""
        out = []
        for f in (0.25, 0.5, 2.0, 4.0):
            mix = [(p, max([c for c in counts[p] if c <= f * n], default=0)) for p, n in cur.items() if p in counts]
            mix = [(p, k) for p, k in mix if k]
            if mix and min_gpus <= sum(k for _, k in mix) <= max_gpus and (maxp is None or len(mix) <= maxp):
                out.append(tuple(sorted(mix)))
        return out

    def run(primary: str, limit: tuple[str, float] | None) -> tuple[tuple[tuple[str, int], ...] | None, float]:
        """Best mix key by (primary, secondary, gpus, key) among those within ``limit``, and the least
        bound of the primary left unexplored (inf: the search was exhaustive)."""
        order = _linear_order(parts, (lambda p: -peak[p]) if primary == "time" else (lambda p: rate[p] / peak[p]))
        P = len(order)
        # per suffix i: F_i(room) = the most sum peak * count its partitions reach with <= room GPUs (greedy by
        # peak: a concave piecewise-linear function), the least rate/peak, the most GPUs it can add
        # per suffix i and floor threshold f (0 and each floor in the suffix): what the partitions of the
        # suffix with floor <= f can add - F(room) = the most sum peak * count with <= room GPUs (greedy by
        # peak: concave piecewise linear), their GPUs, their least rate/peak. A completion whose added
        # partitions have largest floor f* is bounded with the least threshold >= f*.
        caps = [sum(max(counts[p]) for p in order[i:]) for i in range(P + 1)]
        # per level: the thresholds f, F(room) tabulated for every room 0..max_gpus (one row per f; the same
        # np.interp values as at each node's rooms), the GPUs each f lets add, their least rate/peak
        levels: list[tuple[Any, list[float], Any, Any, Any]] = []      # (fs, fs as a list, F, iters, ratios)
        rooms = np.arange(max_gpus + 1)
        for i in range(P + 1):
            fs, tabs, capf, ratios = [], [], [], []
            for f in sorted({0.0} | {floor[p] for p in order[i:]}):
                sub = [p for p in order[i:] if floor[p] <= f]
                items = sorted(((peak[p], max(counts[p])) for p in sub), reverse=True)
                xs, ys = [0.0], [0.0]
                for pk, cap in items:
                    xs.append(xs[-1] + cap)
                    ys.append(ys[-1] + cap * pk)
                fs.append(f)
                tabs.append(np.interp(rooms, np.array(xs), np.array(ys)))
                capf.append(int(xs[-1]))
                ratios.append(min([rate[p] / peak[p] for p in sub], default=math.inf))
            # per f and GPU count m: the fewest iterations once f's partitions are added, iters(min(m + cap_f, max))
            its_tab = iters_tab[np.minimum(rooms + np.array(capf, dtype=np.int64)[:, None], max_gpus)]
            levels.append((np.array(fs), fs, np.array(tabs), its_tab, np.array(ratios)))
        cur_at = [cur.get(p, 0) for p in order]
        best: list[Any] = [None, None]          # key, rank tuple
        lim_kind, lim = limit if limit is not None else ("", math.inf)
        need_cost = primary == "cost" or lim_kind == "cost"
        nodes: dict[tuple[int, ...], Any] | None = None
        if node_cache is not None:             # what the children's A and C depend on besides the node itself
            if node_cache.get("bound") is not bound:
                node_cache.clear()
                node_cache["bound"] = bound
            ctx = (primary, need_cost, max_gpus, min_gpus, maxp, tuple((p, tuple(counts[p]), rate[p]) for p in order))
            nodes = node_cache.setdefault(ctx, {})

        def rank(key: tuple[tuple[str, int], ...], tc: tuple[float, float]) -> tuple[Any, ...]:
            t, c = tc
            return ((t, c) if primary == "time" else (c, t)) + (sum(n for _, n in key), key)

        def consider(key: tuple[tuple[str, int], ...]) -> None:
            if key not in epoch_memo:
                stats["evals"] += 1
            tc = totals(key, None if best[1] is None else (0 if primary == "time" else 1, best[1][0]))
            if tc is None:
                return
            priced[key] = (tc[0], tc[1], sum(n for _, n in key))
            if limit is not None and (tc[1] if lim_kind == "cost" else tc[0]) > lim + (
                    1e-12 if lim_kind == "cost" else 1e-9):
                return
            r = rank(key, tc)
            if best[1] is None or r < best[1]:
                best[0], best[1] = key, r

        def beaten(v: float) -> bool:
            return best[1] is not None and bool(v > best[1][0] * (1 + _REL) + 1e-12)

        def tied_and_worse(v: float, v2: float) -> bool:
            """No mix below can beat the best on the primary, and a tie would lose on the secondary."""
            return best[1] is not None and v >= best[1][0] and bool(v2 > best[1][1] * (1 + _REL) + 1e-12)

        # a chain: the children of one node (partition order[i] at each allowed count), sorted by bound
        # a chain: (depth, fixed, order of the children, their keys, secondary keys (lists, sorted), and per
        # child in count order: K, theta, rate, the floor (fl_first for the first child when it adds 0 GPUs,
        # else fmax), on (None: no child holds the current mix), the parent's GPUs n)
        chains: list[tuple[Any, ...]] = []
        heap: list[tuple[float, int, int, int]] = []      # (bound, -depth, chain, position)

        def children(i: int, n: int, theta: float, rt: float, fl0: float, used: int) -> tuple[Any, ...] | None:
            """The children of a node and their bounds before R, the restart overhead and any limit enter:
            per child the least over the thresholds f of the time A and the cost C of one epoch (see ``expand``).
            The children are a slice of the partition's sorted counts, every threshold f at once (the numpy
            errors are silenced around the whole search). None: no child."""
            p = order[i]
            cl = count_list[p]
            a = bisect.bisect_left(cl, min_gpus - n - caps[i + 1])     # below: no mix can reach min_gpus
            b = bisect.bisect_right(cl, max_gpus - n)
            if maxp is not None and used >= maxp:
                b = min(b, 1) if cl[0] == 0 else 0                     # only the count 0 is left
            if a >= b:
                return None
            zero = cl[a] == 0                                          # the first child adds no GPU
            K = count_arr[p][a:b]
            th = theta + peak_k[p][a:b]
            rr = rt + rate_k[p][a:b]
            fmax = max(fl0, floor[p])
            fs, fs_list, tabs, its_tab, ratios = levels[i + 1]
            j0 = bisect.bisect_right(fs_list, fl0 if zero else fmax) - 1   # below it: a smaller set, the same floor
            u = step[p]
            if u:                                  # counts 0, u, 2u, ...: every lookup is a strided view
                lo_n, hi_n = n + cl[a], n + cl[b - 1]
                N2: Any = slice(lo_n, hi_n + 1, u)
                r0, r1 = max_gpus - lo_n, max_gpus - hi_n              # rooms, descending; r1 >= 0
                room: Any = slice(r0, r1 - 1 if r1 > 0 else None, -u)
            else:
                N2 = n + K
                room = max_gpus - N2                                   # >= 0: K <= max_gpus - n
            tail_n = tail_tab[N2]
            fill = th + tabs[j0:, room]            # one row per threshold f >= fs[j0], one column per child
            its = its_tab[j0:, N2]                 # the most GPUs: the fewest iterations
            F_its = np.maximum(fs[j0:, None], fmax) * its
            if zero:
                F_its[:, 0] = np.maximum(fs[j0:], fl0) * its[:, 0]
            tails = tail_n * its
            S = bound.samples
            base = S / fill if S > 0 else np.where(fill > 0, S / fill, np.inf)   # S > 0: S / 0 is inf
            A = (np.maximum(base, F_its) + tails).min(axis=0)
            C = None
            if need_cost:
                own = rr / th
                if zero and theta == 0.0:                              # no GPU at all yet: no rate per sample
                    own[0] = np.inf
                ratio = np.minimum(own, ratios[j0:, None])
                ratio = np.where(np.isfinite(ratio), ratio, 0.0)
                C = (np.maximum(S * ratio, F_its * rr) + tails * rr).min(axis=0)
            return K, th, rr, fmax, fl0 if zero else fmax, A, C

        def expand(i: int, fixed: tuple[int, ...], n: int, theta: float, rt: float, fl0: float, used: int,
                   here: bool) -> int | None:
            """Sort the children of a node into a chain; its index (None: no child is left). A child's time key
            is R * A + the move's overhead, its cost key R * C / 3600 + the overhead's cost: the least over f
            of R * A_f + o is R * min_f A_f + o exactly (R > 0: rounding is monotone). With ``node_cache``
            the children's values come from an earlier search on the same bound when it reached the node."""
            if nodes is not None and fixed in nodes:
                ent = nodes[fixed]
            else:
                ent = children(i, n, theta, rt, fl0, used)
                if nodes is not None and len(nodes) < NODE_CACHE_MAX:
                    nodes[fixed] = ent
            if ent is None:
                return None
            K, th, rr, fmax, fl_first, A, C = ent
            on: Any = None
            if here:                                                   # the subtree still holds the current mix
                on = K == cur_at[i]
                move_t: Any = np.where(on, 0.0, overhead)
            else:
                move_t = overhead
            lt = R * A + move_t
            if need_cost:
                move_c: Any = overhead * rr / 3600
                if on is not None:
                    move_c = np.where(on, 0.0, move_c)
                lc = R * C / 3600.0 + move_c
            else:
                lc = np.zeros(len(K))                                  # time alone: no cost bound needed
            key, key2 = (lt, lc) if primary == "time" else (lc, lt)
            if lim_kind:
                sel = np.nonzero((lc if lim_kind == "cost" else lt) <= lim * (1 + _REL) + 1e-9)[0]
                if not len(sel):
                    return None
                srt = sel[np.lexsort((-K[sel] if primary == "time" else K[sel], key2[sel], key[sel]))]
            else:
                srt = np.lexsort((-K if primary == "time" else K, key2, key))
            # sorted bounds as lists (the heap's keys); the rest is read per visited child only
            chains.append((i + 1, fixed, srt.tolist(), key[srt].tolist(), key2[srt].tolist(), K, th, rr, fmax,
                           fl_first, on, n))
            return len(chains) - 1

        frontier = math.inf
        if cur:
            consider(cur_key)                      # the first incumbent: staying (choose always ranks it)
        by_peak = _linear_order(parts, lambda p: -peak[p])
        by_ratio = _linear_order(parts, lambda p: rate[p] / peak[p])
        for key in probes(by_peak) + probes(by_ratio) + scaled_current():   # more incumbents
            if key not in priced and key not in epoch_memo:
                consider(key)
        with np.errstate(divide="ignore", invalid="ignore"):
            root = expand(0, (), 0, 0.0, 0.0, 0.0, 0, True) if P else None
            if root is not None:
                heapq.heappush(heap, (chains[root][3][0], -1, root, 0))
            while heap:
                v, _, cid, j = heapq.heappop(heap)
                if beaten(v):
                    break                          # every bound left is worse than the best found: exact
                while True:                        # dive: the first child of each chain, down to a leaf
                    depth, fixed, srt, key, key2, K, th, rr, fmax, fl_first, on, n = chains[cid]
                    if j + 1 < len(srt):           # the next sibling (its bound is >= this one's) waits
                        heapq.heappush(heap, (key[j + 1], -depth, cid, j + 1))
                    if tied_and_worse(key[j], key2[j]):
                        break
                    if stats["nodes"] >= max_nodes or (depth == P and stats["evals"] >= max_evals):
                        stats["cut"] = 1
                        frontier = v               # nothing left unexplored is below v
                        heap.clear()
                        break
                    stats["nodes"] += 1
                    c = srt[j]
                    k = int(K[c])
                    node = fixed + (k,)
                    if depth == P:
                        if n + k >= max(1, min_gpus):
                            consider(tuple(sorted((order[q], c) for q, c in enumerate(node) if c)))
                        break
                    used = sum(1 for c in node if c)
                    nxt = expand(depth, node, n + k, float(th[c]), float(rr[c]), fl_first if c == 0 else fmax, used,
                                 False if on is None else bool(on[c]))
                    if nxt is None or beaten(chains[nxt][3][0]):
                        break                      # no child left, or all are worse than the best (sorted)
                    cid, j = nxt, 0
        return best[0], frontier

    def primary_of(o: str) -> str:
        return "cost" if o in ("cost", "cost-under-deadline") else "time"

    limit: tuple[str, float] | None = None
    if obj == "time-under-budget" and isinstance(budget, (int, float)):
        limit = ("cost", float(budget))
    elif obj == "cost-under-deadline" and isinstance(deadline_s, (int, float)):
        limit = ("time", float(deadline_s))
    primary = primary_of(obj)
    found, frontier = run(primary, limit)
    if found is None and limit is not None:      # nothing meets the limit: choose minimises the other metric
        primary = "cost" if primary == "time" else "time"
        found, frontier = run(primary, None)
    # the shortlist: the best priced mixes by the primary (those within the limit first), plus the current one
    within = (lambda v: v[1] <= limit[1] + 1e-12) if limit and limit[0] == "cost" else \
        (lambda v: v[0] <= limit[1] + 1e-9) if limit else (lambda v: True)
    ranked = sorted(priced.items(), key=lambda kv: (not within(kv[1]), kv[1][0] if primary == "time" else kv[1][1],
                                                    kv[1][1] if primary == "time" else kv[1][0], kv[1][2], kv[0]))
    if wait_fn is not None:                      # only mixes whose wait is known: choose asks wait_fn of each
        ranked = [kv for kv in ranked if kv[0] == cur_key or kv[0] in wait_memo]
    short = [dict(k) for k, _ in ranked[:SHORTLIST]]
    if found is not None and dict(found) not in short:
        short.append(dict(found))
    ch = choose(cur, short, fn, rates, obj, overhead, margin=margin, budget=budget, deadline_s=deadline_s,
                remaining_epochs=R, wait_fn=wfn if wait_fn is not None else None, max_queue_wait_s=max_queue_wait_s)
    best_v = None
    if found is not None:
        best_v = priced[found][0] if primary == "time" else priced[found][1]
    how = f"search: {stats['evals']} mixes priced, {stats['nodes']} nodes"
    if wait_fn is not None:
        how += f", {stats['waits']} queue estimates"
    if not stats["cut"]:
        how += ", exact"
    elif best_v is not None and frontier < math.inf and frontier > 0:
        how += f", cut by its work cap: within {max(0.0, best_v / frontier - 1):.1%} of the optimum"
    else:
        how += ", cut by its work cap: optimality not proven"
    return Choice(ch.mix, f"{ch.reason} ({how})", ch.table, move=ch.move)
