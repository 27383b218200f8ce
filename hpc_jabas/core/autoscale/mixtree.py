"""The mix search's branch-and-bound tree, in parts (mixsearch.py's docstring: the bound, why it holds, the
search and its exactness). Pure.

:class:`Problem`: one decision's checked inputs; :class:`Memo`: epoch_time_fn and wait_fn asked once per mix,
the priced mixes' totals and the :class:`Work` done; :class:`Tables`: per-partition arrays;
:class:`NodeBound`: the keys of a node's children, tabulated per level; :class:`Frontier`: the sorted
chains and their heap; :class:`Incumbent`: the best mix and the pruning tests; :class:`TreeSearch`: one
best-first run (seed, expand, dive). tests/test_mixsearch.py tests each on its own.
"""
from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from hpc_jabas.core.autoscale.mixbound import Bound
from hpc_jabas.core.autoscale.scaler import EpochTimeFn, Mix, WaitFn, mix_rate, price
from hpc_jabas.errors import InfeasibleError

MAX_NODES = 5_000       # search-tree nodes per decision
MAX_EVALS = 300         # epoch_time_fn calls per decision
MAX_WAITS = 24          # wait_fn calls per decision (each may be an `sbatch --test-only`)
_REL = 1e-9             # pruning tolerance: ties are never pruned
NODE_CACHE_MAX = 20_000  # nodes a node_cache keeps per bound, granularity and objective


def linear_order(parts: list[str], key: Callable[[str], float]) -> list[str]:
    return sorted(parts, key=lambda p: (key(p), p))


Key = tuple[tuple[str, int], ...]          # a mix as sorted (partition, count) pairs


@dataclass(frozen=True)
class Problem:
    """One decision's inputs, checked once by :func:`search`: what every part of the search reads."""

    counts: dict[str, list[int]]           # partition -> its allowed counts (partition_counts)
    current: dict[str, int]                # the current mix, zero counts dropped, by partition name
    epoch_time_fn: EpochTimeFn
    rates: Mapping[str, float]
    objective: str                         # one of OBJECTIVES
    overhead: float                        # restart overhead, seconds
    bound: Bound
    R: float                               # remaining epochs
    max_gpus: int
    min_gpus: int = 1
    maxp: int | None = None                # most partitions in a mix
    margin: float = 0.05
    budget: float | None = None
    deadline_s: float | None = None
    wait_fn: WaitFn | None = None
    max_queue_wait_s: float | None = None
    max_nodes: int = MAX_NODES
    max_evals: int = MAX_EVALS
    max_waits: int = MAX_WAITS

    @property
    def current_key(self) -> Key:
        return tuple(self.current.items())

    def limit(self) -> tuple[str, float] | None:
        """("cost", budget) or ("time", deadline) when the objective has a limit, else None."""
        if self.objective == "time-under-budget" and isinstance(self.budget, (int, float)):
            return "cost", float(self.budget)
        if self.objective == "cost-under-deadline" and isinstance(self.deadline_s, (int, float)):
            return "time", float(self.deadline_s)
        return None


@dataclass
class Work:
    """What a search did: node visits, epoch_time_fn and wait_fn calls, whether a cap cut it."""

    nodes: int = 0
    evals: int = 0
    waits: int = 0
    cut: bool = False


class Memo:
    """The priced mixes: epoch_time_fn and wait_fn asked once per mix, each mix's totals kept (``priced``).

    ``epochs``: key -> seconds, None or the InfeasibleError it raised; ``waits``: key -> seconds or None;
    ``priced``: key -> (total time, total cost, GPUs) of every mix that could run."""

    def __init__(self, pb: Problem, work: Work | None = None) -> None:
        self.pb = pb
        self.work = work if work is not None else Work()
        self.epochs: dict[Key, Any] = {}
        self.waits: dict[Key, float | None] = {}
        self.priced: dict[Key, tuple[float, float, int]] = {}

    def epoch_s(self, mix: Mix) -> float | None:
        """epoch_time_fn(mix), asked once (choose re-prices the shortlist without a new call)."""
        k = tuple(sorted(mix.items()))
        if k not in self.epochs:
            try:
                self.epochs[k] = self.pb.epoch_time_fn(dict(mix))
            except InfeasibleError as e:
                self.epochs[k] = e
        v = self.epochs[k]
        if isinstance(v, InfeasibleError):
            raise v
        return v  # type: ignore[no-any-return]

    def wait_s(self, mix: Mix) -> float | None:
        """wait_fn(mix), asked once (None without a wait_fn)."""
        k = tuple(sorted(mix.items()))
        if k not in self.waits:
            self.waits[k] = None if self.pb.wait_fn is None else self.pb.wait_fn(dict(mix))
        return self.waits[k]

    def price(self, key: Key, beat: tuple[int, float] | None = None) -> tuple[float, float] | None:
        """(total time, total cost) of a mix, or None when infeasible or it cannot start; kept in ``priced``.
        The wait is asked only when the mix could still win: ``beat`` = (0: time, 1: cost; the best so far)."""
        if key not in self.epochs:
            self.work.evals += 1
        tc = self._totals(key, beat)
        if tc is not None:
            self.priced[key] = (tc[0], tc[1], sum(n for _, n in key))
        return tc

    def _totals(self, key: Key, beat: tuple[int, float] | None) -> tuple[float, float] | None:
        pb, mix = self.pb, dict(key)
        est = price(mix, self.epoch_s, pb.rates)
        if not est.feasible or est.time_s is None or est.cost is None:
            return None
        stay = key == pb.current_key
        move = 0.0 if stay else pb.overhead
        t = pb.R * est.time_s + move
        c = pb.R * est.cost + move / 3600.0 * est.rate_per_hour
        if pb.wait_fn is not None and not stay:
            if beat is not None and (t, c)[beat[0]] > beat[1] * (1 + _REL) + 1e-12:
                return t, c                       # cannot win even with no wait: leave the queue alone
            if key not in self.waits:
                if self.work.waits >= pb.max_waits:
                    self.work.cut = True
                    return None
                self.work.waits += 1
            w = self.wait_s(mix)
            if w is None or (pb.max_queue_wait_s is not None and w > pb.max_queue_wait_s):
                return None
            t += w
        return t, c


class Tables:
    """Per partition: peak, floor, rate of one GPU, allowed counts (ascending array and list), their
    stride (u when the counts are 0, u, 2u, ...: lookups become strided views; else 0) and per count its
    sum of peaks and its rate; per GPU count 0..max_gpus the bound's tail and fewest iterations."""

    def __init__(self, pb: Problem) -> None:
        counts, bound = pb.counts, pb.bound
        self.parts = list(counts)
        self.peak = {p: float(bound.peak[p]) for p in self.parts}
        self.floor = {p: float(bound.floor.get(p, 0.0)) for p in self.parts}
        self.count_arr = {p: np.array(counts[p], dtype=np.int64) for p in self.parts}
        self.count_list = {p: [int(c) for c in counts[p]] for p in self.parts}
        self.step = {p: (cl[1] if len(cl) > 1 and cl == list(range(0, cl[-1] + 1, cl[1])) else 0)
                     for p, cl in self.count_list.items()}
        self.rate = {p: float(mix_rate({p: 1}, pb.rates)) for p in self.parts}
        self.peak_k = {p: self.count_arr[p] * self.peak[p] for p in self.parts}
        self.rate_k = {p: self.count_arr[p] * self.rate[p] for p in self.parts}
        self.tail = np.array([bound.tail(max(n, 1)) if bound.tail is not None else 0.0
                              for n in range(pb.max_gpus + 1)])
        self.iters = bound.iters_table(pb.max_gpus)

    def order(self, primary: str) -> list[str]:
        """The tree's partition order: fastest first (time), cheapest per sample first (cost)."""
        if primary == "time":
            return linear_order(self.parts, lambda p: -self.peak[p])
        return linear_order(self.parts, lambda p: self.rate[p] / self.peak[p])


class Level(NamedTuple):
    """The bound's tables for the partitions from one tree level on, one row per floor threshold f."""

    fs: Any                  # the thresholds (array)
    fs_list: list[float]     # the same, a list (bisect)
    fill: Any                # F(room) for room = 0..max_gpus: the most sum peak * count with <= room GPUs
    iters: Any               # per f and GPU count m: iters(min(m + the GPUs f's partitions add, max_gpus))
    ratios: Any              # per f: the least rate / peak of its partitions (inf: none)


class Children(NamedTuple):
    """A node's children (a slice of the partition's counts) and their bounds before R, the restart
    overhead and any limit enter: A (time of one epoch) and C (its cost x 3600; None: time alone)."""

    K: Any                   # the children's counts
    th: Any                  # per child: sum of peaks fixed
    rr: Any                  # per child: rate fixed
    fmax: float              # the largest floor fixed (a child adding GPUs)
    fl_first: float          # the floor of the first child (fl0 when it adds 0 GPUs)
    A: Any
    C: Any


class NodeBound:
    """The bound of a node's children (module docstring), tabulated per level of the tree of ``order``.
    ``caps[i]``: the most GPUs the partitions order[i:] can add; ``levels[i]``: their :class:`Level`."""

    def __init__(self, pb: Problem, tables: Tables, order: list[str], need_cost: bool) -> None:
        self.pb, self.t, self.order, self.need_cost = pb, tables, order, need_cost
        P = len(order)
        self.caps = [sum(max(pb.counts[p]) for p in order[i:]) for i in range(P + 1)]
        self.rooms = np.arange(pb.max_gpus + 1)
        self.levels = [self._level(order[i:]) for i in range(P + 1)]
        t = tables       # per level i, what children(i, ...) reads, in one tuple (no attribute lookups there)
        self._at = [(p, t.count_list[p], self.caps[i + 1], t.count_arr[p], t.peak_k[p], t.rate_k[p], t.floor[p],
                     t.step[p], self.levels[i + 1]) for i, p in enumerate(order)]

    def _level(self, suffix: list[str]) -> Level:
        """Per threshold f (0 and each floor in the suffix), what the partitions with floor <= f can add:
        F(room) greedy by peak (concave piecewise linear), their GPUs, their least rate / peak. A completion
        whose added partitions have largest floor f* is bounded with the least threshold >= f*."""
        t = self.t
        fs, tabs, capf, ratios = [], [], [], []
        for f in sorted({0.0} | {t.floor[p] for p in suffix}):
            sub = [p for p in suffix if t.floor[p] <= f]
            items = sorted(((t.peak[p], max(self.pb.counts[p])) for p in sub), reverse=True)
            xs, ys = [0.0], [0.0]
            for pk, cap in items:
                xs.append(xs[-1] + cap)
                ys.append(ys[-1] + cap * pk)
            fs.append(f)
            tabs.append(np.interp(self.rooms, np.array(xs), np.array(ys)))
            capf.append(int(xs[-1]))
            ratios.append(min([t.rate[p] / t.peak[p] for p in sub], default=math.inf))
        its = t.iters[np.minimum(self.rooms + np.array(capf, dtype=np.int64)[:, None], self.pb.max_gpus)]
        return Level(np.array(fs), fs, np.array(tabs), its, np.array(ratios))

    def children(self, i: int, n: int, theta: float, rt: float, fl0: float, used: int) -> Children | None:
        """The children of a node at level i (n GPUs, sum of peaks theta, rate rt, largest floor fl0, ``used``
        partitions fixed): per child the least over the thresholds f of A and C, every f at once (numpy
        errors silenced by the caller). None: no child."""
        p, cl, cap_rest, counts, peaks, rates, floor_p, u, (fs, fs_list, fill_tab, its_tab, ratios) = self._at[i]
        pb = self.pb
        max_gpus = pb.max_gpus
        a = bisect.bisect_left(cl, pb.min_gpus - n - cap_rest)             # below: no mix can reach min_gpus
        b = bisect.bisect_right(cl, max_gpus - n)
        if pb.maxp is not None and used >= pb.maxp:
            b = min(b, 1) if cl[0] == 0 else 0                             # only the count 0 is left
        if a >= b:
            return None
        zero = cl[a] == 0                                                  # the first child adds no GPU
        K = counts[a:b]
        th = theta + peaks[a:b]
        rr = rt + rates[a:b]
        fmax = max(fl0, floor_p)
        j0 = bisect.bisect_right(fs_list, fl0 if zero else fmax) - 1       # below: a smaller set, the same floor
        if u:                                      # counts 0, u, 2u, ...: every lookup is a strided view
            lo_n, hi_n = n + cl[a], n + cl[b - 1]
            r0, r1 = max_gpus - lo_n, max_gpus - hi_n                      # rooms, descending; r1 >= 0
            N2: Any = slice(lo_n, hi_n + 1, u)
            room: Any = slice(r0, r1 - 1 if r1 > 0 else None, -u)
        else:
            N2 = n + K
            room = max_gpus - N2                                           # >= 0: K <= max_gpus - n
        its = its_tab[j0:, N2]                     # the most GPUs: the fewest iterations
        fill = th + fill_tab[j0:, room]            # one row per threshold f >= fs[j0], one column per child
        F_its = np.maximum(fs[j0:, None], fmax) * its
        if zero:
            F_its[:, 0] = np.maximum(fs[j0:], fl0) * its[:, 0]
        tails = self.t.tail[N2] * its
        S = pb.bound.samples
        base = S / fill if S > 0 else np.where(fill > 0, S / fill, np.inf)   # S > 0: S / 0 is inf
        A = (np.maximum(base, F_its) + tails).min(axis=0)
        C = None
        if self.need_cost:
            own = rr / th
            if zero and theta == 0.0:                                      # no GPU at all yet: no rate per sample
                own[0] = np.inf
            ratio = np.minimum(own, ratios[j0:, None])
            ratio = np.where(np.isfinite(ratio), ratio, 0.0)
            C = (np.maximum(S * ratio, F_its * rr) + tails * rr).min(axis=0)
        return tuple.__new__(Children, (K, th, rr, fmax, fl0 if zero else fmax, A, C))   # no __new__ frame


class Chain(NamedTuple):
    """A node's children sorted by key: level, the parent's fixed counts, the sort order, the sorted keys
    (primary, secondary, as lists), and per child in count order what its own children start from."""

    depth: int
    fixed: tuple[int, ...]
    srt: list[int]
    key: list[float]
    key2: list[float]
    K: Any
    th: Any
    rr: Any
    fmax: float
    fl_first: float
    on: Any                  # per child: it holds the current mix (None: no child does)
    n: int                   # the parent's GPUs


class Frontier:
    """The chains and a heap of (key, -depth, chain, position): the next child of each chain. Its least key
    bounds every mix not yet priced (a chain's children are sorted, a child's key is >= its parent's)."""

    def __init__(self) -> None:
        self.chains: list[Chain] = []
        self.heap: list[tuple[float, int, int, int]] = []

    def add(self, chain: Chain) -> int:
        self.chains.append(chain)
        return len(self.chains) - 1

    def push(self, cid: int, j: int) -> None:
        ch = self.chains[cid]
        heapq.heappush(self.heap, (ch.key[j], -ch.depth, cid, j))

    def pop(self) -> tuple[float, int, int]:
        v, _, cid, j = heapq.heappop(self.heap)
        return v, cid, j

    def least(self) -> float:
        return self.heap[0][0] if self.heap else math.inf

    def clear(self) -> None:
        self.heap.clear()

    def __len__(self) -> int:
        return len(self.heap)


class Incumbent:
    """The best mix priced within the limit, ranked by (primary, secondary, GPUs, key); the pruning tests."""

    def __init__(self) -> None:
        self.key: Key | None = None
        self.rank: tuple[Any, ...] | None = None

    def offer(self, key: Key, rank: tuple[Any, ...]) -> bool:
        if self.rank is None or rank < self.rank:
            self.key, self.rank = key, rank
            return True
        return False

    def beaten(self, v: float) -> bool:
        """No mix whose primary bound is v can beat the best (strict, up to the tolerance: ties are kept)."""
        return self.rank is not None and bool(v > self.rank[0] * (1 + _REL) + 1e-12)

    def tied_and_worse(self, v: float, v2: float) -> bool:
        """No mix below can beat the best on the primary, and a tie would lose on the secondary."""
        return self.rank is not None and v >= self.rank[0] and bool(v2 > self.rank[1] * (1 + _REL) + 1e-12)


class TreeSearch:
    """One best-first branch-and-bound run for a primary metric within an optional limit (module docstring).

    Its state, each part readable: ``bound`` (:class:`NodeBound`), ``frontier`` (:class:`Frontier`),
    ``memo`` (:class:`Memo`, shared across runs) and ``best`` (:class:`Incumbent`); after :meth:`run`,
    ``unexplored``: the least primary bound left unexplored when a cap cut it (inf: exhaustive)."""

    def __init__(self, pb: Problem, memo: Memo, primary: str, limit: tuple[str, float] | None,
                 node_cache: dict[Any, Any] | None = None, tables: Tables | None = None) -> None:
        self.pb, self.memo, self.primary = pb, memo, primary
        self.t = tables if tables is not None else Tables(pb)
        self.order = self.t.order(primary)
        self.lim_kind, self.lim = limit if limit is not None else ("", math.inf)
        self.need_cost = primary == "cost" or self.lim_kind == "cost"
        self.bound = NodeBound(pb, self.t, self.order, self.need_cost)
        self.cur_at = [pb.current.get(p, 0) for p in self.order]
        self.frontier = Frontier()
        self.best = Incumbent()
        self.unexplored = math.inf
        self.nodes: dict[tuple[int, ...], Children | None] | None = None
        if node_cache is not None:             # what the children's A and C depend on besides the node itself
            if node_cache.get("bound") is not pb.bound:
                node_cache.clear()
                node_cache["bound"] = pb.bound
            ctx = (primary, self.need_cost, pb.max_gpus, pb.min_gpus, pb.maxp,
                   tuple((p, tuple(pb.counts[p]), self.t.rate[p]) for p in self.order))
            self.nodes = node_cache.setdefault(ctx, {})

    def rank(self, key: Key, tc: tuple[float, float]) -> tuple[Any, ...]:
        t, c = tc
        return ((t, c) if self.primary == "time" else (c, t)) + (sum(n for _, n in key), key)

    def consider(self, key: Key) -> None:
        """Price a mix; it becomes the incumbent when it is within the limit and ranks better."""
        beat = None if self.best.rank is None else (0 if self.primary == "time" else 1, self.best.rank[0])
        tc = self.memo.price(key, beat)
        if tc is None:
            return
        if self.lim_kind and (tc[1] if self.lim_kind == "cost" else tc[0]) > self.lim + (
                1e-12 if self.lim_kind == "cost" else 1e-9):
            return
        self.best.offer(key, self.rank(key, tc))

    def seed(self) -> None:
        """First incumbents: staying (choose always ranks it), greedy fills and the current mix scaled."""
        pb, memo = self.pb, self.memo
        if pb.current:
            self.consider(pb.current_key)
        for key in probes(pb, self.t.order("time")) + probes(pb, self.t.order("cost")) + scaled_current(pb):
            if key not in memo.priced and key not in memo.epochs:
                self.consider(key)

    def expand(self, i: int, fixed: tuple[int, ...], n: int, theta: float, rt: float, fl0: float, used: int,
               here: bool) -> int | None:
        """Sort the children of a node into a chain; its index (None: no child is left). A child's time key
        is R * A + the move's overhead, its cost key R * C / 3600 + the overhead's cost: the least over f
        of R * A_f + o is R * min_f A_f + o exactly (R > 0: rounding is monotone). With ``node_cache``
        the children's values come from an earlier search on the same bound when it reached the node."""
        if self.nodes is not None and fixed in self.nodes:
            ent = self.nodes[fixed]
        else:
            ent = self.bound.children(i, n, theta, rt, fl0, used)
            if self.nodes is not None and len(self.nodes) < NODE_CACHE_MAX:
                self.nodes[fixed] = ent
        if ent is None:
            return None
        K, th, rr, fmax, fl_first, A, C = ent
        pb, primary = self.pb, self.primary
        on: Any = K == self.cur_at[i] if here else None               # the subtree still holds the current mix
        lt = pb.R * A + (np.where(on, 0.0, pb.overhead) if here else pb.overhead)
        if self.need_cost:
            move_c: Any = pb.overhead * rr / 3600
            lc = pb.R * C / 3600.0 + (np.where(on, 0.0, move_c) if here else move_c)
        else:
            lc = np.zeros(len(K))                                      # time alone: no cost bound needed
        key, key2 = (lt, lc) if primary == "time" else (lc, lt)
        if self.lim_kind:
            sel = np.nonzero((lc if self.lim_kind == "cost" else lt) <= self.lim * (1 + _REL) + 1e-9)[0]
            if not len(sel):
                return None
            srt = sel[np.lexsort((-K[sel] if primary == "time" else K[sel], key2[sel], key[sel]))]
        else:
            srt = np.lexsort((-K if primary == "time" else K, key2, key))
        # sorted keys as lists (the heap's); the rest is read per visited child only (Frontier.add, inlined)
        chains = self.frontier.chains
        chains.append(tuple.__new__(Chain, (i + 1, fixed, srt.tolist(), key[srt].tolist(), key2[srt].tolist(), K,
                                            th, rr, fmax, fl_first, on, n)))
        return len(chains) - 1

    def run(self) -> tuple[Key | None, float]:
        """The best mix key within the limit (None: none), and ``unexplored``."""
        self.seed()
        with np.errstate(divide="ignore", invalid="ignore"):
            root = self.expand(0, (), 0, 0.0, 0.0, 0.0, 0, True) if self.order else None
            if root is not None:
                self.frontier.push(root, 0)
            while self.frontier:
                v, cid, j = self.frontier.pop()
                if self.best.beaten(v):
                    break                          # every bound left is worse than the best found: exact
                self.dive(v, cid, j)
        return self.best.key, self.unexplored

    def dive(self, v: float, cid: int, j: int) -> None:
        """From child j of chain cid down to a leaf through the first child of each chain, leaving each
        chain's next sibling on the heap; prices the leaf. A work cap empties the frontier (``unexplored``)."""
        pb, work, P = self.pb, self.memo.work, len(self.order)
        chains, heap, best = self.frontier.chains, self.frontier.heap, self.best
        while True:
            depth, fixed, srt, key, key2, K, th, rr, fmax, fl_first, on, n = chains[cid]
            if j + 1 < len(srt):                   # the next sibling (its key is >= this one's) waits
                heapq.heappush(heap, (key[j + 1], -depth, cid, j + 1))        # Frontier.push, inlined
            if best.tied_and_worse(key[j], key2[j]):
                return
            if work.nodes >= pb.max_nodes or (depth == P and work.evals >= pb.max_evals):
                work.cut = True
                self.unexplored = v                # nothing left unexplored is below v
                self.frontier.clear()
                return
            work.nodes += 1
            c = srt[j]
            node = fixed + (int(K[c]),)
            n += node[-1]
            if depth == P:
                if n >= max(1, pb.min_gpus):
                    self.consider(tuple(sorted((self.order[q], k) for q, k in enumerate(node) if k)))
                return
            nxt = self.expand(depth, node, n, float(th[c]), float(rr[c]), fl_first if c == 0 else fmax,
                              sum(1 for k in node if k), False if on is None else bool(on[c]))
            if nxt is None or best.beaten(chains[nxt].key[0]):
                return                             # no child left, or all are worse than the best (sorted)
            cid, j = nxt, 0


def probes(pb: Problem, order: list[str]) -> list[Key]:
    """Mixes that fill partitions in ``order`` (the search's: fastest or cheapest per sample first) up to
    G GPUs, G = min_gpus, 2 min_gpus, 4 min_gpus, ... max_gpus: priced first, so that the search starts
    from a good incumbent (exactness does not depend on them)."""
    out: list[Key] = []
    G = max(1, pb.min_gpus)
    while True:
        mix: list[tuple[str, int]] = []
        left = G
        for p in order:
            if left <= 0 or (pb.maxp is not None and len(mix) >= pb.maxp):
                break
            k = max(c for c in pb.counts[p] if c <= left)
            if k:
                mix.append((p, k))
                left -= k
        key = tuple(sorted(mix))
        if mix and G - left >= pb.min_gpus and key not in out:
            out.append(key)
        if G >= pb.max_gpus:
            return out
        G = min(pb.max_gpus, 2 * G)


def scaled_current(pb: Problem) -> list[Key]:
    """The current mix's shape at 1/4, 1/2, 2 and 4 times its counts (each rounded down to an allowed count)."""
    out = []
    for f in (0.25, 0.5, 2.0, 4.0):
        mix = [(p, max([c for c in pb.counts[p] if c <= f * n], default=0)) for p, n in pb.current.items()
               if p in pb.counts]
        mix = [(p, k) for p, k in mix if k]
        if mix and pb.min_gpus <= sum(k for _, k in mix) <= pb.max_gpus and (pb.maxp is None or len(mix) <= pb.maxp):
            out.append(tuple(sorted(mix)))
    return out
