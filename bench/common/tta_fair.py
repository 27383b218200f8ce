"""bench/adaptive_tta.py --fair: the fair protocol's sections (issue 56), on rank 0's results; the pure pieces are in
bench/common/tta_protocol.py. Runs are started through the ``run`` callable adaptive_tta passes in
(``run(kind, seed) -> result dict``, a collective over the ranks) and ``broadcast``, so this module imports
neither torch nor MPI.

Per (task, regime):
1. fixed-32 on the SELECTION seeds; its curves fix the two targets (mid-curve: the median accuracy at 60% of the
   budget; plateau: the median final accuracy less two standard deviations) before any other run;
2. the fixed grid (every B with the sqrt and the linear lr rule) on the selection seeds, order rotated per seed;
3. per target, the reference: the fastest fixed configuration (fixed-32 included) on the selection seeds whose
   median final accuracy is within 0.5 point of fixed-32's; it is run again on the FRESH seeds, and its fresh
   times are the denominator (a lucky selection seed does not set the bar);
4. the policies at their JobConfig defaults (batch_max included) on the fresh seeds, fixed-32 there too.
Time to a target: interpolated between the two evaluations (every quarter epoch, clock paused) that bracket it.
"""
from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Sequence

import numpy as np

from bench.common import tta_protocol as proto

TARGET_AT = 0.6
BOOT = 4000


def _med(v: Sequence[float]) -> float:
    return statistics.median(v) if v else math.nan


def _acc_at_epoch(res: dict, epoch: int) -> float:
    return res["evals"][epoch - 1]["acc"]


def _tta(res: dict, target: float, clock: str = "clock") -> float:
    return proto.crossing_time([(p[clock], p["acc"]) for p in res["curve"]], target)


def fair_section(name: str, epochs: int, fixed_kinds: Sequence[str], policies: Sequence[str],
                 sel: Sequence[int], fresh: Sequence[int], run: Callable[[str, int], dict],
                 broadcast: Callable[[object], object], rank: int) -> dict | None:
    """One (task, regime) under the fair protocol; ``broadcast(obj)``: rank 0's obj on every rank. Rank 0 returns
    its figures (the others None)."""
    base = [run("fixed-32", s) for s in sel]
    tg = None
    if rank == 0:
        k = max(1, round(TARGET_AT * epochs))
        tg = proto.targets([_acc_at_epoch(r, k) for r in base], [r["final"] for r in base])
    tg = broadcast(tg)
    targets = {"mid": tg[0], "plateau": tg[1]}
    if rank == 0:
        print(f"  [fair {name}] targets fixed before the other runs: mid {100 * tg[0]:.2f}%, plateau "
              f"{100 * tg[1]:.2f}%", flush=True)
    grid: dict[str, list[dict]] = {"fixed-32": base}
    kinds = list(fixed_kinds)
    for i, s in enumerate(sel):
        r = i % max(len(kinds), 1)
        for kind in kinds[r:] + kinds[:r]:
            grid.setdefault(kind, []).append(run(kind, s))
    base_final = _med([r["final"] for r in base]) if rank == 0 else 0.0
    refs = None
    if rank == 0:
        refs = {t: proto.choose_reference({k: [_tta(r, v) for r in rs] for k, rs in grid.items()},
                                          {k: [r["final"] for r in rs] for k, rs in grid.items()}, base_final)
                for t, v in targets.items()}
    refs = broadcast(refs)
    on_fresh = list(dict.fromkeys(["fixed-32", *(k for k in refs.values() if k), *policies]))
    fresh_runs: dict[str, list[dict]] = {}
    for i, s in enumerate(fresh):
        r = i % len(on_fresh)
        for kind in on_fresh[r:] + on_fresh[:r]:
            fresh_runs.setdefault(kind, []).append(run(kind, s))
    if rank != 0:
        return None
    return _report(name, targets, refs, grid, fresh_runs, policies, base_final)


def _report(name: str, targets: dict, refs: dict, grid: dict, fresh_runs: dict, policies: Sequence[str],
            base_final: float) -> dict:
    print(f"\n== fair protocol, {name}: targets mid {100 * targets['mid']:.2f}%, plateau "
          f"{100 * targets['plateau']:.2f}%; fixed-32's final on the selection seeds {100 * base_final:.2f}%")
    print(f"{'config (selection seeds)':<26} {'final acc % med [min,max]':<26} {'to mid s':>9} {'to plateau s':>13} "
          f"{'to the end s':>12}")
    for k, rs in grid.items():
        accs = [100 * r["final"] for r in rs]
        print(f"{k:<26} {_med(accs):6.2f} [{min(accs):.2f},{max(accs):.2f}]{'':<8} "
              f"{_med([_tta(r, targets['mid']) for r in rs]):>9.2f} "
              f"{_med([_tta(r, targets['plateau']) for r in rs]):>13.2f} {_med([r['train_s'] for r in rs]):>12.2f}")
    print(f"{'run (fresh seeds)':<26} {'final acc % med [min,max]':<26} {'to mid s':>9} {'to plateau s':>13} "
          f"{'to the end s':>12}")
    for k, rs in fresh_runs.items():
        accs = [100 * r["final"] for r in rs]
        print(f"{k:<26} {_med(accs):6.2f} [{min(accs):.2f},{max(accs):.2f}]{'':<8} "
              f"{_med([_tta(r, targets['mid']) for r in rs]):>9.2f} "
              f"{_med([_tta(r, targets['plateau']) for r in rs]):>13.2f} {_med([r['train_s'] for r in rs]):>12.2f}")
    grid_total = _med([sum(rs[i]["train_s"] for rs in grid.values()) for i in range(len(grid["fixed-32"]))])
    fresh_final32 = _med([r["final"] for r in fresh_runs["fixed-32"]])
    out: dict = {"pairs": {}, "grid_total_s": grid_total}
    for p in policies:
        accs = [r["final"] for r in fresh_runs[p]]
        gap = 100 * (fresh_final32 - _med(accs))
        vs_grid = proto.one_run_vs_grid(_med([r["train_s"] for r in fresh_runs[p]]), [grid_total])
        out.setdefault("gap", {})[p] = gap
        out.setdefault("vs_grid", {})[p] = vs_grid
        for t, v in targets.items():
            ref = refs[t]
            pt = [_tta(r, v) for r in fresh_runs[p]]
            rt = [_tta(r, v) for r in fresh_runs[ref]] if ref else []
            reg = proto.regret(pt, rt) if ref else math.nan
            out["pairs"][(p, t)] = {"regret": reg, "policy_t": pt, "ref_t": rt, "ref": ref}
            print(f"  {p} / {ref or 'no reference'} ({t} target): regret {reg:.3f} (fresh medians "
                  f"{_med(pt):.2f} s / {_med(rt):.2f} s; {sum(math.isinf(x) for x in pt)} of {len(pt)} seeds missed)")
        print(f"  {p}: final accuracy {100 * _med(accs):.2f}% (gap to fixed-32 on the fresh seeds {gap:.2f} pts); "
              f"one run to the end / the whole grid's ({len(grid)} configs) {vs_grid:.3f}")
    return out


def headline(sections: dict[str, dict], policy: str, rng: np.random.Generator) -> dict[str, float]:
    """The protocol's last-line figures for ``policy`` over every (section, target) pair: the summary of the
    regrets, with a 90% bootstrap interval of the geometric mean (fresh seeds resampled per pair, policy and
    reference paired by seed); the worst accuracy gap and the median one-run-vs-grid share."""
    pairs = [v for s in sections.values() for (p, _), v in s["pairs"].items() if p == policy]
    regs = [v["regret"] for v in pairs]
    out = proto.summary(regs)
    boots = []
    for _ in range(BOOT):
        rb = []
        for v in pairs:
            n = len(v["policy_t"])
            if not v["ref_t"] or not n:
                continue
            idx = rng.integers(0, n, n)
            rb.append(proto.regret([v["policy_t"][i] for i in idx], [v["ref_t"][i] for i in idx]))
        boots.append(proto.geomean(rb))
    fin = np.array([b for b in boots if not math.isnan(b)])
    out["regret_geomean_lo"] = float(np.quantile(fin, 0.05, method="lower")) if len(fin) else math.nan
    out["regret_geomean_hi"] = float(np.quantile(fin, 0.95, method="higher")) if len(fin) else math.nan
    out["acc_gap_worst_pts"] = max((s["gap"][policy] for s in sections.values()), default=math.nan)
    out["one_run_vs_grid"] = _med([s["vs_grid"][policy] for s in sections.values()])
    return out


def last_line(sections: dict[str, dict], policies: Sequence[str], n_seeds: int, rng: np.random.Generator) -> str:
    """The headline policy's keys first (the first of ``policies``), then each other policy's with its prefix."""
    fields = []
    for i, p in enumerate(policies):
        h = headline(sections, p, rng)
        pre = "" if i == 0 else re.sub(r"\W", "_", p.replace("noise-scale", "goodput")) + "_"  # +variant: _variant
        fields.append(" ".join(f"{pre}{k}={h[k]:.0f}" if k == "misses" else f"{pre}{k}={h[k]:.3f}" for k in
                               ("regret_geomean", "regret_worst", "misses", "profile_110", "profile_125",
                                "one_run_vs_grid", "acc_gap_worst_pts", "regret_geomean_lo", "regret_geomean_hi",
                                "profile_150")))
    return " ".join(fields) + f" seeds={n_seeds}"
