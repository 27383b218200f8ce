"""The epoch-end decision at cluster scale: branch-and-bound over allocation units. Pure.

``scaler.choose`` prices a list of candidate mixes; listing every mix (``enumerate_mixes``) grows as
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
compute (non-decreasing in N). It holds for ``scaler.epoch_time_fn`` under the perf model: an
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

The parts (mixtree.py), each readable and tested on its own: ``Problem`` (one decision's checked
inputs), ``Memo`` (epoch_time_fn and wait_fn asked once per mix, the priced mixes' totals, the work done),
``Tables``, ``NodeBound`` (the key of a node's children, tabulated per level), ``Frontier`` (the sorted
chains and the heap), ``Incumbent`` (the best mix and the pruning tests) and ``TreeSearch`` (one run:
seed, expand, dive); :func:`decide` runs it and hands the shortlist to ``choose``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hpc_jabas.core.autoscale.mixbound import Bound as Bound
from hpc_jabas.core.autoscale.mixbound import peak_rate as peak_rate
from hpc_jabas.core.autoscale.mixbound import perf_bound as perf_bound
from hpc_jabas.core.autoscale.mixbound import snapped_iterations as snapped_iterations
from hpc_jabas.core.autoscale.mixtree import (
    MAX_EVALS,
    MAX_NODES,
    MAX_WAITS,
    Key,
    Memo,
    Problem,
    Tables,
    TreeSearch,
)
from hpc_jabas.core.autoscale.mixtree import NODE_CACHE_MAX as NODE_CACHE_MAX
from hpc_jabas.core.autoscale.scaler import (
    OBJECTIVES,
    Choice,
    EpochTimeFn,
    Mix,
    RestartOverhead,
    WaitFn,
    choose,
    enumerate_mixes,
)
from hpc_jabas.core.config.validate import integer
from hpc_jabas.errors import ConfigError

SHORTLIST = 12          # priced mixes handed to choose (and kept in its table)
BRUTE_MAX = 256         # up to this many mixes (and no queue wait to ask): price them all, list them all


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
    missing = [p for p in counts if not bound.peak.get(p, 0.0) > 0]
    if missing:
        raise ConfigError(f"the search bound has no peak throughput > 0 for partition(s) {', '.join(missing)}")
    few = all_mixes(counts, max_gpus, min_gpus, maxp, limit=brute_max) if wait_fn is None and brute_max else None
    if few is not None:                          # a small cluster: every mix priced and listed, as before
        ch = choose(current_mix, few, epoch_time_fn, rates, obj, overhead, margin=margin, budget=budget,
                    deadline_s=deadline_s, remaining_epochs=remaining_epochs)
        return Choice(ch.mix, f"{ch.reason} (search: all {len(few)} mixes priced, exact)", ch.table, move=ch.move)
    pb = Problem(counts, {p: int(n) for p, n in sorted(current_mix.items()) if n}, epoch_time_fn, rates, obj,
                 overhead, bound, float(remaining_epochs), max_gpus, min_gpus, maxp, margin, budget, deadline_s,
                 wait_fn, max_queue_wait_s, max_nodes, max_evals, max_waits)
    return decide(pb, node_cache)


def decide(pb: Problem, node_cache: dict[Any, Any] | None = None) -> Choice:
    """:func:`search` on a checked problem: the tree search (again on the other metric when nothing meets
    the limit: choose then minimises it), then ``choose`` on the shortlist."""
    memo, tables = Memo(pb), Tables(pb)
    limit = pb.limit()
    primary = "cost" if pb.objective in ("cost", "cost-under-deadline") else "time"
    found, unexplored = TreeSearch(pb, memo, primary, limit, node_cache, tables).run()
    if found is None and limit is not None:
        primary = "cost" if primary == "time" else "time"
        found, unexplored = TreeSearch(pb, memo, primary, None, node_cache, tables).run()
    ch = choose(pb.current, shortlist(memo, primary, limit, found), memo.epoch_s, pb.rates, pb.objective,
                pb.overhead, margin=pb.margin, budget=pb.budget, deadline_s=pb.deadline_s, remaining_epochs=pb.R,
                wait_fn=memo.wait_s if pb.wait_fn is not None else None, max_queue_wait_s=pb.max_queue_wait_s)
    best_v = None
    if found is not None:
        best_v = memo.priced[found][0] if primary == "time" else memo.priced[found][1]
    how = f"search: {memo.work.evals} mixes priced, {memo.work.nodes} nodes"
    if pb.wait_fn is not None:
        how += f", {memo.work.waits} queue estimates"
    if not memo.work.cut:
        how += ", exact"
    elif best_v is not None and unexplored < math.inf and unexplored > 0:
        how += f", cut by its work cap: within {max(0.0, best_v / unexplored - 1):.1%} of the optimum"
    else:
        how += ", cut by its work cap: optimality not proven"
    return Choice(ch.mix, f"{ch.reason} ({how})", ch.table, move=ch.move)


def shortlist(memo: Memo, primary: str, limit: tuple[str, float] | None, found: Key | None) -> list[Mix]:
    """The best priced mixes by the primary (those within the limit first, up to SHORTLIST), the current
    one, and the search's pick; with a wait_fn only mixes whose wait is known (choose asks it of each)."""
    within = (lambda v: v[1] <= limit[1] + 1e-12) if limit and limit[0] == "cost" else \
        (lambda v: v[0] <= limit[1] + 1e-9) if limit else (lambda v: True)
    ranked = sorted(memo.priced.items(), key=lambda kv: (
        not within(kv[1]), kv[1][0] if primary == "time" else kv[1][1],
        kv[1][1] if primary == "time" else kv[1][0], kv[1][2], kv[0]))
    if memo.pb.wait_fn is not None:
        ranked = [kv for kv in ranked if kv[0] == memo.pb.current_key or kv[0] in memo.waits]
    short = [dict(k) for k, _ in ranked[:SHORTLIST]]
    if found is not None and dict(found) not in short:
        short.append(dict(found))
    return short
