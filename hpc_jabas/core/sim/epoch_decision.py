"""The epoch-end decision of a simulated run that auto-scales (core/sim/simulate.py): the forecaster
(core/autoscale/forecast.py) over the B trajectory, then the auto-scaler's search (core/autoscale/mixsearch.py)
priced with ``autoscale.epoch_time_fn`` and ``mixsearch.perf_bound``, as the trainer's epoch end runs them. Pure.

With ``cache``, the pricing inputs are reused across decisions and strategies (the same decisions without,
tests/test_simulate.py): per exact pricing input (forecast, period, overheads) its bound and every mix's epoch time,
each mix's batch space, and the search's expanded nodes (its node_cache, for the NODE_CACHES most recent forecasts);
the forecaster reuses a fit of the same history. Every entry is a pure function of its key.

No clock here: ``clock`` (a function returning seconds) may be passed in to time the decisions (``decision_ms``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from hpc_jabas.core.adaptive.policy import decision_period
from hpc_jabas.core.autoscale import forecast, mixsearch
from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.autoscale.overheads import Overheads
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning import PlanSpec
from hpc_jabas.core.sim.measuring import run_overheads
from hpc_jabas.core.sim.simconfig import Cluster, Job
from hpc_jabas.core.sim.strategies import Strategy
from hpc_jabas.errors import InfeasibleError

NODE_CACHES = 4                  # the search's node caches kept (one per recent forecast)
Mix = dict[str, int]


class EpochEndDecision:
    """A job's epoch-end decisions on a cluster, for every strategy of one Simulation (its caches shared)."""

    def __init__(self, cluster: Cluster, job: Job, model: PerfModel, types: Mapping[str, str],
                 clock: Callable[[], float] | None = None, cache: bool = True) -> None:
        self.cluster, self.job, self.model, self.types = cluster, job, model, types
        self.auto = job.autoscale
        self.clock = clock
        self.cache = cache
        self.price_spaces: dict[Any, Any] = {}
        self.bounds: dict[tuple[Any, ...], mixsearch.Bound] = {}
        self.epoch_times: dict[tuple[Any, ...], dict[tuple[tuple[str, int], ...], Any]] = {}
        self.node_caches: dict[tuple[Any, ...], dict[Any, Any]] = {}     # the search's, per forecast (LRU)
        #: the inputs (mix, forecast, restart prior) of the last decision: a run that stays keeps them as its
        #: ``last_stay``, and a later decision with the same inputs stays without searching
        self.stay_key: Any = None

    def choice(self, st: Strategy, mix: Mix, traj: list[tuple[int, int]], it: int, R: float, t: float,
               overhead: autoscale.RestartOverhead, budget_left: float | None,
               last_stay: Any) -> tuple[autoscale.Choice, float | None]:
        """The choice (stay or move) over ``R`` epochs left at wall time ``t``, and how long it took (ms; None
        without a clock)."""
        job, cl, a = self.job, self.cluster, self.auto
        N, p = job.samples, decision_period(job.p, job.samples, job.batch)
        lo, hi = job.batch_min, job.batch_max
        t0 = self.clock() if self.clock else None
        hist = traj[-a.forecast_history:]
        fp = p if st.policy != "fixed" else max(1, math.ceil(N / traj[-1][1]))
        fc = forecast.forecast_next_epoch(hist, lambda b: math.ceil(N / b), period_p=fp, B_min=lo, B_max=hi,
                                          start_iter=it, reuse_fit=self.cache)
        obj = st.objective or "time"
        prior = overhead.seconds if st.overhead_aware else 0.0
        self.stay_key = (autoscale.mix_key(mix), tuple(fc), prior)
        if obj in ("time", "cost") and not st.queue_aware and last_stay == self.stay_key:
            # the same forecast, mix and overhead as a decision that stayed: with fewer epochs left a move
            # pays off less (the overhead is amortised over less), so the search would stay again
            return (autoscale.Choice(dict(mix), "inputs unchanged since the last decision, which stayed", []),
                    None if t0 is None or self.clock is None else 1000.0 * (self.clock() - t0))
        ov = run_overheads(job, st.policy, st.objective is not None, p) if st.overhead_aware else Overheads()
        fn, bound, nodes = self._pricing(fc, fp, ov)
        units: int | dict[str, int] = cl.units if a.unit == 0 else a.unit
        wait_fn = (lambda m: cl.queue.expected(m, t)) if st.queue_aware else None
        kw: dict[str, Any] = {}
        if obj == "time-under-budget":
            kw["budget"] = max(0.0, budget_left if budget_left is not None else math.inf)
        caps: dict[str, Any] = {k: v for k, v in (("max_nodes", a.max_nodes), ("max_evals", a.max_evals))
                                if v is not None}
        caps["brute_max"] = a.brute_max     # 0: branch-and-bound even on small clusters (exact)
        try:
            ch = mixsearch.search(
                mix, cl.capacity, self.types, fn, cl.rates, obj, prior, bound,
                max_gpus=a.max_gpus if a.max_gpus is not None else sum(cl.capacity.values()), min_gpus=a.min_gpus,
                max_partitions=a.max_partitions, unit=units, exact_upto=a.exact_upto,
                margin=a.margin if st.overhead_aware else 0.0, remaining_epochs=R,
                wait_fn=wait_fn, max_queue_wait_s=a.max_queue_wait_s if st.queue_aware else None,
                node_cache=nodes, **caps, **kw)
        except InfeasibleError as e:
            ch = autoscale.Choice(dict(mix), f"skipped: {e}", [])
        ms = None if t0 is None or self.clock is None else 1000.0 * (self.clock() - t0)
        return ch, ms

    def _pricing(self, fc: list[int], fp: int, ov: Overheads | None = None
                 ) -> tuple[autoscale.EpochTimeFn, mixsearch.Bound, dict[Any, Any] | None]:
        """The search's ``epoch_time_fn``, bound and node cache for a forecast and overheads; with ``cache``,
        reused for the same inputs (the node caches of the NODE_CACHES most recent forecasts are kept)."""
        N, lo, hi, mb = self.job.samples, self.job.batch_min, self.job.batch_max, self.job.micro_batch
        ov = ov or Overheads()
        fn = autoscale.epoch_time_fn(self.model, self.types, fc, fp, N, B_min=lo, B_max=hi,
                                     spaces=self.price_spaces if self.cache else None, overheads=ov,
                                     spec=PlanSpec("optimal", micro_batch=mb))
        if not self.cache:
            return fn, mixsearch.perf_bound(self.model, self.types, N, hi, forecast=fc, period=fp, B_min=lo,
                                            micro_batch=mb), None
        key = (tuple(fc), fp, ov)
        nodes = self.node_caches.pop(key, {})
        self.node_caches[key] = nodes                        # the most recent last
        while len(self.node_caches) > NODE_CACHES:
            self.node_caches.pop(next(iter(self.node_caches)))
        if key not in self.bounds:
            self.bounds[key] = mixsearch.perf_bound(self.model, self.types, N, hi, forecast=fc, period=fp, B_min=lo,
                                                     micro_batch=mb)
        memo = self.epoch_times.setdefault(key, {})

        def memo_time(mix: Mix) -> float | None:
            k = autoscale.mix_key(mix)
            if k not in memo:
                try:
                    memo[k] = fn(mix)
                except InfeasibleError as e:
                    memo[k] = e
            v = memo[k]
            if isinstance(v, InfeasibleError):
                raise v
            return v  # type: ignore[no-any-return]
        return memo_time, self.bounds[key], nodes
