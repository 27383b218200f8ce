"""Whole training jobs in simulated time, on the project's own decision core. Pure.

The simulator owns no decision: every iteration time is the perf model's (core/perf/perfmodel.py) for the plan
the job's planner makes (core/planning: ``make_planner``; for the optimal identical-b planner the same
times from ``planning.grouptimes.group_space``, what the auto-scaler prices too), every B comes from a policy of
core/adaptive/policy.py (``make_policy``) fed with simulated gradient statistics (core/sim/simconfig.py), every epoch
end runs the forecaster (core/autoscale/forecast.py) and the auto-scaler's search (core/autoscale/mixsearch.py,
pricing with
``autoscale.epoch_time_fn`` and ``mixsearch.perf_bound``), and a move costs what it costs on the cluster:
the restart time (at the new mix's rate) and the queue wait (unbilled). tests/test_simulate.py fails if
this module defines its own version of any of them. The time line (docs/simulator.md), priced here, with what
measuring and probing add from core/sim/measuring.py:

- an epoch is ``samples`` samples; iterations run in periods of ``p`` (the global iteration count, as
  the trainer's); each period's iterations take ``space.iter_time(B)`` each, the epoch's last one a full
  iteration of B (as ``autoscale.epoch_time_fn`` prices it) for the samples left;
- at the end of every period the policy decides the next B from the statistics at the progress then;
- a measurement iteration (one per period for the similarity and goodput policies) takes
  ``[model] measure_factor`` times a normal one, and every epoch end adds ``[model] epoch_end_s`` (both
  measured on a run of the job; defaults 1 and 0: not priced);
- with ``[policy] headroom_probe`` = n > 0, every ``headroom_every``-th decision round (the first included) adds
  the curvature-headroom probe (runtime/headroom_probe.py): one forward and two backwards on n samples on one rank,
  priced ``PROBE_PASSES`` = 3 training micro-steps per micro-batch of the job's b (``micro_batch``, else 32) on the
  mix's slowest GPU type (``probe_seconds``), the other ranks waiting; the simulated policies get no h (the
  simulator has no curvature), so the probe is a cost here, not a signal;
- ``stop = "progress"``: the run ends once the statistical progress of ``epochs`` epochs at B0 is made
  (each sample counts E(B) = (B_noise + B0) / (B_noise + B), core/adaptive/stats.py), possibly mid-epoch;
  ``"samples"``: after exactly ``epochs`` epochs;
- the first job waits in the queue for its mix; each move adds the new mix's wait, then ``restart_s``; the
  epoch-end decision (forecast, search, its pricing reused) is core/sim/epoch_decision.py's.

Strategies (``STRATEGIES``, core/sim/strategies.py) are compared on the same job, cluster and seed.

No clock here: ``clock`` (a function returning seconds, e.g. ``time.perf_counter``) may be passed in
to time the epoch-end decisions (``decision_ms``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpc_jabas.core.adaptive.policy import (
    PolicyState,
    decision_period,
    default_measure_every,
    default_noise_memory,
    make_lr_rule,
    make_policy,
)
from hpc_jabas.core.adaptive.stats import statistical_efficiency
from hpc_jabas.core.autoscale import forecast, mixsearch  # noqa: F401  (mixsearch: core/sim/epoch_decision.py's)
from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.autoscale.mixbound import peak_rate
from hpc_jabas.core.autoscale.overheads import Overheads, measures, measures_between
from hpc_jabas.core.perf.perfmodel import AllreduceModel, PerfModel
from hpc_jabas.core.planning import BatchSpace, PlanSpec, make_planner, snap_nearest
from hpc_jabas.core.planning.grouptimes import group_space  # noqa: F401  (the optimal planner's pricing_space)
from hpc_jabas.core.sim.epoch_decision import EpochEndDecision
from hpc_jabas.core.sim.measuring import (  # noqa: F401  (PROBE_PASSES, measure_share: the time line's prices)
    PROBE_PASSES,
    measure_share,
    measurements,
    probe_seconds,
    run_overheads,
)
from hpc_jabas.core.sim.simconfig import Cluster, Job
from hpc_jabas.core.sim.strategies import BASELINE, Strategy
from hpc_jabas.core.sim.strategies import COMPARED as COMPARED  # re-exported: the CLI's and tests' names
from hpc_jabas.core.sim.strategies import STRATEGIES as STRATEGIES
from hpc_jabas.errors import ConfigError

MAX_EPOCH_FACTOR = 10            # stop = "progress": give up after this many times the configured epochs


def build_model(job: Job, types: Sequence[str]) -> PerfModel:
    """The job's perf model: its ``profile_dir``, or the emulated model of its [model] table."""
    m = job.model                      # checked, defaults filled in (core/sim/simconfig.py ModelKeys)
    if m.profile_dir:
        return PerfModel.load(str(m.profile_dir))
    mb = job.micro_batch
    bl = sorted(set(m.b_list) | ({mb} if mb else set()))
    ar = AllreduceModel(bandwidth=m.bandwidth_gbs * 1e9)
    return PerfModel.emulated(sorted(set(types)), bl, m.base_s, m.per_sample_s, speeds=dict(m.speeds),
                              grad_bytes=m.grad_mb * 1e6, allreduce=ar, overlap=m.overlap)


@dataclass
class Result:
    """One strategy's run: per-epoch records, the B trajectory, the epoch-end decisions and the totals."""

    strategy: str
    epochs: list[dict[str, Any]] = field(default_factory=list)
    trajectory: list[tuple[int, int]] = field(default_factory=list)
    timeline: list[tuple[float, int, int, float]] = field(default_factory=list)   # (wall s, iteration, B, lr scale)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "label": STRATEGIES[self.strategy].label if self.strategy in STRATEGIES
                else self.strategy, "totals": self.totals, "epochs": self.epochs,
                "trajectory": [list(x) for x in self.trajectory], "timeline": [list(x) for x in self.timeline],
                "decisions": self.decisions}


@dataclass
class _Run:
    """One strategy's run in progress (``Simulation.run``): what it decides with, where it is, what it spent."""

    st: Strategy
    res: Result
    policy: Any
    lr_rule: Any
    rng: np.random.Generator
    p: int
    lo: int
    hi: int
    target: float                     # statistical progress to make, in samples at B0
    ov: Overheads                     # what a run costs besides its iterations ([model])
    mix: dict[str, int]
    space: BatchSpace
    B: int
    t: float = 0.0
    it: int = 0
    done_eff: float = 0.0             # statistical progress made, in samples at B0
    cost: float = 0.0
    gpu_h: float = 0.0
    restarts: int = 0
    qwait: float = 0.0
    last_stay: Any = None
    measure_every: int | None = None  # goodput's noise-only measurements between decisions ([policy])
    reference: bool = False           # under auto-scaling: reference iterations when measure_every = 1 (overheads)
    since: int = 0                    # samples trained since the last fresh measurement
    early: int | None = None          # with measure_every: the early first decision (the controller's)
    probe_next: int = 0               # headroom_probe: the first decision round at or after this iteration probes


class Simulation:
    """A job on a cluster; :meth:`run` plays one strategy, :meth:`compare` several."""

    def __init__(self, cluster: Cluster, job: Job, model: PerfModel | None = None,
                 clock: Callable[[], float] | None = None, cache: bool = True) -> None:
        self.cluster, self.job = cluster, job
        self.types = cluster.types
        self.model = model if model is not None else build_model(job, list(self.types.values()))
        self.clock = clock
        mix = job.mix if job.mix is not None else cluster.capacity
        bad = [p for p in mix if p not in self.types or mix[p] > cluster.capacity[p]]
        if bad or not mix:
            raise ConfigError(f"initial mix {mix!r} names unknown partitions or more GPUs than they have "
                              f"({', '.join(bad) or 'empty'}); partitions: {cluster.capacity}")
        self.mix0 = autoscale._norm_mix(mix)
        self._spaces: dict[tuple[Any, ...], BatchSpace] = {}      # each strategy's planner's space per mix
        # the epoch-end decisions (core/sim/epoch_decision.py), their pricing reused across decisions and
        # strategies with ``cache`` (the same decisions without, tests/test_simulate.py)
        self.cache = cache
        self.epoch_end = EpochEndDecision(cluster, job, self.model, self.types, clock=clock, cache=cache)
        ee = self.epoch_end              # its caches (the same objects), left empty by a run without ``cache``
        self._price_spaces, self._bounds, self._epoch_times = ee.price_spaces, ee.bounds, ee.epoch_times
        self.auto = job.autoscale
        for t in set(self.types.values()):
            self.model.profile(t)                                  # every type has a profile (one line if not)

    # ---- the iteration times: the planner's plans priced by the perf model ------------------------
    def speeds(self, gl: Sequence[str]) -> list[float]:
        """Per rank: its type's samples/s at the job's micro-batch (LB-BSP splits by measured speeds)."""
        b = self.job.micro_batch
        out = []
        for g in gl:
            prof = self.model.profile(g)
            out.append(b / prof.time(b) if b else peak_rate(self.model, g))
        return out

    def type_shares(self, mix: Mapping[str, int], planner: str) -> dict[str, float]:
        """GPU type -> the share of each global batch its ranks process (the per-type throughput of the
        report): equal split, its GPU count; LB-BSP and the optimal planner, in proportion to its GPUs'
        speeds (``speeds``; the optimal planner's rounding to whole micro-batches is not modelled)."""
        w: dict[str, float] = {}
        for part, n in mix.items():
            g = self.types[part]
            w[g] = w.get(g, 0.0) + n * (1.0 if planner == "equal" else self.speeds([g])[0])
        tot = sum(w.values())
        return {g: v / tot for g, v in sorted(w.items())} if tot > 0 else {}

    def strategy_spec(self, planner: str, gl: Sequence[str]) -> PlanSpec:
        """A strategy's planner on ranks ``gl`` as a PlanSpec: ``optimal`` the job's (its micro_batch), ``lbbsp``
        the job's micro-batch split by the perf model's speeds (``speeds``), ``equal`` the same with equal speeds."""
        mb = self.job.micro_batch
        if planner == "optimal":
            return PlanSpec("optimal", micro_batch=mb)
        speeds = [1.0] * len(gl) if planner == "equal" else self.speeds(gl)
        return PlanSpec("lbbsp", micro_batch=mb or 1, identical="true", speeds=tuple(speeds))

    def space(self, mix: Mapping[str, int], planner: str, lo: int, hi: int) -> BatchSpace:
        """The strategy's planner's pricing space on the mix (the identical-b optimal planner's times come
        from its rank groups, without 4,096-rank plans; core/planning/planner.py ``pricing_space``)."""
        key = (autoscale.mix_key(mix), planner, lo, hi)
        if key not in self._spaces:
            gl = autoscale.expand_mix(mix, self.types)
            self._spaces[key] = make_planner(self.strategy_spec(planner, gl), gl, self.model, identical_b=True,
                                             speed_factors=None, strict_speeds=False).pricing_space(lo, hi)
        return self._spaces[key]

    # ---- one strategy --------------------------------------------------------------------------
    def run(self, name: str, budget: float | None = None, fixed_B: int | None = None) -> Result:
        """One strategy, epoch after epoch: the periods (``_epoch``), then, for a strategy that auto-scales, the
        epoch-end decision and a move (``_epoch_end_move``), until the job's stop rule says it is done.
        ``fixed_B``: a fixed-B strategy's B instead of the job's ``batch`` (the progress stays counted at the
        job's batch, so a larger fixed B pays its statistical efficiency: a grid over fixed B)."""
        if name not in STRATEGIES:
            raise ConfigError(f"unknown strategy {name!r}; valid: {', '.join(STRATEGIES)}")
        if fixed_B is not None and (STRATEGIES[name].policy != "fixed" or isinstance(fixed_B, bool)
                                    or not isinstance(fixed_B, int) or fixed_B < 1):
            raise ConfigError(f"fixed_B={fixed_B!r} is invalid; give a whole B >= 1 to a fixed-B strategy "
                              "(static, lbbsp)")
        r = self._start(name, fixed_B)
        job = self.job
        overhead = autoscale.RestartOverhead(self.auto.restart_prior_s)
        budget_total = self.auto.budget if self.auto.budget is not None else budget
        max_epochs = job.epochs if job.stop == "samples" else job.epochs * MAX_EPOCH_FACTOR
        for epoch in range(max_epochs):
            rec = self._epoch(r, epoch)
            finished = (job.stop == "progress" and r.done_eff >= r.target * (1 - 1e-12)) or \
                (job.stop == "samples" and epoch + 1 >= job.epochs)
            if finished:
                break
            if r.st.objective is not None:
                self._epoch_end_move(r, epoch, rec, overhead, budget_total)
        r.res.totals = {"time_s": round(r.t, 6), "cost": round(r.cost, 9), "gpu_hours": round(r.gpu_h, 9),
                        "restarts": r.restarts, "queue_wait_s": round(r.qwait, 3), "epochs": len(r.res.epochs),
                        "samples": sum(e["samples"] for e in r.res.epochs), "iterations": r.it,
                        "progress": round(min(r.done_eff / r.target, 1.0), 6),
                        "final_mix": autoscale.mix_label(r.mix),
                        "decision_ms_max": max((d["decision_ms"] or 0.0 for d in r.res.decisions), default=0.0)}
        return r.res

    def _start(self, name: str, fixed_B: int | None = None) -> _Run:
        """The strategy's policy and lr rule, its first mix, space and B, and the first job's queue wait."""
        st, job = STRATEGIES[name], self.job
        N, B0 = job.samples, job.batch
        p = decision_period(job.p, N, B0)
        Bf = B0 if fixed_B is None else fixed_B
        lo, hi = (job.batch_min, job.batch_max) if st.policy != "fixed" else (Bf, Bf)
        pol = job.policy
        kw: dict[str, Any] = {"B_min": lo, "B_max": hi, "p": p}
        if st.policy == "similarity":
            kw.update(gamma=pol.gamma, alpha=pol.alpha)
        elif st.policy == "noise-scale":
            kw.update(B0=B0, warmup=pol.warmup, noise_memory=default_noise_memory(pol.noise_memory, B0, N),
                      kappa=pol.kappa, noise_trend=pol.noise_trend)
        elif st.policy == "ramp":
            kw.update(B0=B0, at=list(pol.ramp_at), factor=pol.ramp_factor)
        if st.objective is not None:
            forecast.preload()          # the import, once per process, is not part of a timed decision
        # the measurement noise's stream per strategy (the compared ones' as before goodput was added)
        rng = np.random.default_rng([job.seed, sorted(COMPARED).index(name) if name in COMPARED else len(COMPARED)])
        mix = dict(self.mix0)
        space = self.space(mix, st.planner, lo, hi)
        B = snap_nearest(space, Bf if st.policy == "fixed" else B0)
        wait0 = self.cluster.queue.wait(mix, 0.0)
        ov = run_overheads(job, st.policy, st.objective is not None, p)
        r = _Run(st, Result(name), make_policy(st.policy, **kw), make_lr_rule("auto", B0, st.policy), rng, p, lo, hi,
                 float(job.epochs * N), ov, mix, space, B, t=wait0, qwait=wait0)
        r.measure_every = k = default_measure_every(st.policy, pol.measure_every, p) if lo < hi else None
        r.reference = st.objective is not None      # the trainer's auto-scaler prices measuring
        if st.policy == "noise-scale" and k is not None and (k * (r.policy.warmup + 1)) < p:
            # the first decision once the warm-up's measurements are in
            r.early = k * (r.policy.warmup + 1)
        r.res.trajectory.append((0, B))
        r.res.timeline.append((round(r.t, 3), 0, B, round(r.lr_rule.lr_scale(B), 4)))
        return r

    def _epoch(self, r: _Run, epoch: int) -> dict[str, Any]:
        """One epoch on the current mix: its periods (``_periods``), the epoch end's time, the bill; its record."""
        rate = autoscale.mix_rate(r.mix, self.cluster.rates)
        gpus = sum(r.mix.values())
        B_start = r.B
        ep_t, ep_samples, sw = self._periods(r)
        ep_t += r.ov.epoch_end_s
        r.cost += ep_t * rate / 3600.0
        r.gpu_h += ep_t * gpus / 3600.0
        r.t += ep_t
        rec: dict[str, Any] = {
            "epoch": epoch, "mix": autoscale.mix_label(r.mix), "gpus": gpus, "B_start": B_start, "B_end": r.B,
            "B_mean": round(sw / ep_samples, 1) if ep_samples else r.B, "lr_scale": round(r.lr_rule.lr_scale(r.B), 4),
            "samples": ep_samples, "time_s": round(ep_t, 3), "cost": round(ep_t * rate / 3600.0, 6),
            "progress": round(min(r.done_eff / r.target, 1.0), 6), "restart": False, "queue_wait_s": 0.0,
            "wall_s": round(r.t, 3), "iterations": r.it,
            "samples_per_s": round(ep_samples / ep_t, 3) if ep_t > 0 else 0.0,
            "by_type": {g: round(ep_samples / ep_t * f, 3) if ep_t > 0 else 0.0
                        for g, f in self.type_shares(r.mix, r.st.planner).items()}}
        r.res.epochs.append(rec)
        return rec

    def _periods(self, r: _Run) -> tuple[float, int, float]:
        """An epoch's iterations, period by period, with the policy's decision at each period's end:
        (time, samples, samples x B)."""
        job, p, curve, B0 = self.job, r.p, self.job.gradstats, self.job.batch
        m_extra = r.ov.measure_factor - 1.0
        left, ep_t, ep_samples, sw = job.samples, 0.0, 0, 0.0
        while left > 0:
            u = min(r.done_eff / r.target, 1.0)
            T = r.space.iter_time(r.B)
            assert T is not None
            its = min(p - r.it % p, math.ceil(left / r.B))
            k = r.measure_every
            if k is not None:                 # a chunk ends at each noise-only measurement too
                its = min(its, k - r.it % k)
            eff = statistical_efficiency(r.B, curve.at(u), B0) if job.stop == "progress" else 1.0
            if job.stop == "progress":
                its = min(its, max(1, math.ceil((r.target - r.done_eff) / (r.B * eff))))
            n = min(its * r.B, left)
            tail = its * r.B > left           # the epoch's last iteration is short: the trainer measures nothing
            ep_t += its * T
            if m_extra > 0:
                ep_t += measurements(r.it, r.it + its, p, k, r.reference) * T * m_extra
            left -= n
            ep_samples += n
            sw += n * r.B
            r.done_eff += n * eff
            r.it += its
            r.since += n
            if job.stop == "progress" and r.done_eff >= r.target * (1 - 1e-12):
                break
            decides = r.st.policy != "fixed" and (r.it % p == 0 or r.it == r.early)
            if measures_between(r.it, p, k, r.reference) and not decides and not tail:
                # the controller's measure_every between decisions: goodput a fresh (G2, S) into its estimate,
                # similarity a cosine into the next decision's mean
                if r.st.policy == "similarity":
                    r.policy.observe(self._draw(r.B, min(r.done_eff / r.target, 1.0), r.rng)[2])
                else:
                    g2_, s_ = self._draw_between(r.B, min(r.done_eff / r.target, 1.0), r.rng)
                    if r.policy.observe(g2_, s_, r.since):
                        r.since = 0
            if decides and job.policy.headroom_probe > 0 and r.it >= r.probe_next:
                # the curvature-headroom probe at this decision round (the controller's OnlineProbe.due)
                r.probe_next = r.it + job.policy.headroom_every * p
                types = sorted({self.types[part] for part, k in r.mix.items() if k > 0})
                ep_t += probe_seconds(lambda g, b: self.model.t_micro(g, b), types, job.policy.headroom_probe,
                                      job.micro_batch)
            if decides:
                self._since, self._fresh = r.since or None, False
                nb = self._decide(r.policy, r.B, r.it, min(r.done_eff / r.target, 1.0), r.space, r.rng, r.res,
                                  fresh=measures(r.it, p, k, r.reference))
                if self._fresh:
                    r.since = 0
                if nb != r.B:
                    r.res.timeline.append((round(r.t + ep_t, 3), r.it, nb, round(r.lr_rule.lr_scale(nb), 4)))
                r.B = nb
        return ep_t, ep_samples, sw

    def _epoch_end_move(self, r: _Run, epoch: int, rec: dict[str, Any], overhead: autoscale.RestartOverhead,
                        budget_total: float | None) -> None:
        """The epoch-end decision (forecast, search) over the epochs left, and the move it chooses: the new
        mix's queue wait and restart (billed at its rate), its space, B snapped into it."""
        job, cl = self.job, self.cluster
        u = min(r.done_eff / r.target, 1.0)
        if job.stop == "samples":
            R = float(job.epochs - epoch - 1)
        else:
            R = max(0.05, (r.target - r.done_eff) / (job.samples * statistical_efficiency(r.B, job.gradstats.at(u),
                                                                                          job.batch)))
        choice, ms = self.epoch_end.choice(r.st, r.mix, r.res.trajectory, r.it, R, r.t, overhead,
                                     None if budget_total is None else float(budget_total) - r.cost, r.last_stay)
        r.res.decisions.append({"epoch": epoch, "it": r.it, "move": choice.move,
                                "mix": autoscale.mix_label(choice.mix), "reason": choice.reason, "decision_ms": ms,
                                "remaining_epochs": round(R, 3)})
        if not choice.move:
            r.last_stay = self.epoch_end.stay_key
            return
        r.last_stay = None
        new = dict(choice.mix)
        w = cl.queue.wait(new, r.t)
        new_rate = autoscale.mix_rate(new, cl.rates)
        r.t += w + cl.restart_s
        r.cost += cl.restart_s * new_rate / 3600.0
        r.gpu_h += cl.restart_s * sum(new.values()) / 3600.0
        r.restarts += 1
        r.qwait += w
        if r.st.overhead_aware:
            overhead.record(cl.restart_s)
        rec.update(restart=True, queue_wait_s=round(w, 3), moved_to=autoscale.mix_label(new))
        r.mix = new
        r.space = self.space(r.mix, r.st.planner, r.lo, r.hi)
        nb = snap_nearest(r.space, r.B, ref=r.B)
        if nb != r.B:
            r.B = nb
            r.res.trajectory.append((r.it, r.B))
            r.res.timeline.append((round(r.t, 3), r.it, r.B, round(r.lr_rule.lr_scale(r.B), 4)))
        if hasattr(r.policy, "last"):
            r.policy.last = None                          # B set from outside: the similarity policy restarts

    def _decide(self, policy: Any, B: int, it: int, u: float, space: BatchSpace, rng: np.random.Generator,
                res: Result, fresh: bool = True) -> int:
        """The policy's decision on simulated statistics (simconfig.py's module docstring); ``_since``: the samples
        trained since the last fresh measurement, what this one stands for (``_fresh``: whether it had one).
        ``fresh`` False: the trainer measured nothing at this decision (a reference iteration at p = 1, as
        core/autoscale/overheads.py): the draw is made (the same random stream) and dropped."""
        g2_, s_, sim_ = self._draw(B, u, rng)
        if not fresh:
            g2_, s_, sim_ = None, None, None
        self._fresh = g2_ is not None
        d = policy.decide(PolicyState(B=B, iteration=it, similarity=sim_, g2=g2_, s=s_, progress=u,
                                      samples=self._since), space)
        if d.B != B:
            res.trajectory.append((it, d.B))
        return int(d.B)

    def _draw_between(self, B: int, u: float, rng: np.random.Generator) -> tuple[float | None, float | None]:
        """A noise-only measurement between decisions: a trace's recorded iteration measurement nearest u (its
        lognormal noise drawn as a decision's), else one drawn from the curve as a decision's."""
        rec = self.job.gradstats.between_at(u)
        if rec is None:
            g2, s, _ = self._draw(B, u, rng)
            return g2, s
        z = rng.standard_normal(2) * self.job.gradstats.noise
        return rec[0] * math.exp(float(z[0])), rec[1] * math.exp(float(z[1]))

    def _draw(self, B: int, u: float, rng: np.random.Generator) -> tuple[float | None, float | None, float | None]:
        """One measurement's simulated (G2, S, similarity) at progress u (None: a recorded decision without a
        fresh measurement)."""
        curve = self.job.gradstats
        bn = curve.at(u)
        z = rng.standard_normal(2) * curve.noise
        g2, s = math.exp(float(z[0])), bn * math.exp(float(z[1]))
        sim = B / (B + 2.0 * s / g2)
        g2_: float | None = g2
        s_: float | None = s
        sim_: float | None = sim
        if curve.measured is not None:                # a trace: the recorded run's own measurements, as they were
            mg2, ms, msim, fresh = curve.measured_at(u)
            if not fresh:                             # that decision had no new measurement: neither has this one
                g2_, s_, sim_ = None, None, msim
            else:
                if mg2 is not None and ms is not None:
                    g2_, s_ = mg2 * math.exp(float(z[0])), ms * math.exp(float(z[1]))
                if msim is not None:
                    sim_ = msim
        return g2_, s_, sim_

    _since: int | None = None         # _decide's inputs and output beside its arguments (see there)
    _fresh: bool = False

    # ---- several strategies ------------------------------------------------------------------------
    def compare(self, names: Sequence[str] | None = None) -> dict[str, Result]:
        """Every named strategy (default: the eight of ``COMPARED``) on the same job, cluster and seed; the budget
        of hpcjabas-budget defaults to the SimiGrad row's cost (run first when needed)."""
        names = list(names or COMPARED)
        bad = [n for n in names if n not in STRATEGIES]
        if bad:
            raise ConfigError(f"unknown strategy {', '.join(bad)}; valid: {', '.join(STRATEGIES)}")
        out: dict[str, Result] = {}
        need_base = BASELINE in names or ("hpcjabas-budget" in names and self.auto.budget is None)
        if need_base:
            out[BASELINE] = self.run(BASELINE)
        for n in names:
            if n in out:
                continue
            out[n] = self.run(n, budget=out[BASELINE].totals["cost"] if BASELINE in out else None)
        return {n: out[n] for n in names} | ({BASELINE: out[BASELINE]} if BASELINE in out else {})


COLUMNS = ("time_s", "cost", "gpu_hours", "restarts", "queue_wait_s")


def relative(results: Mapping[str, Result], base: str = BASELINE) -> dict[str, dict[str, float | None]]:
    """Each strategy's totals relative to ``base``'s (ratio; None when the base's value is 0)."""
    ref = results[base].totals if base in results else None
    out: dict[str, dict[str, float | None]] = {}
    for n, r in results.items():
        row: dict[str, float | None] = {}
        for c in COLUMNS:
            v = float(r.totals[c])
            b = float(ref[c]) if ref else 0.0
            row[c] = v / b if b else None
        out[n] = row
    return out


def comparison_table(results: Mapping[str, Result], base: str = BASELINE) -> str:
    """The comparison table: totals, each relative to the base row (x1.00 = same as SimiGrad)."""
    rel = relative(results, base)
    head = (f"{'strategy':<16} {'time h':>13} {'cost':>15} {'GPU-h':>15} {'restarts':>13} {'queue wait h':>13} "
            f"{'epochs':>6}")
    lines = [head, "-" * len(head)]

    def cell(v: float, r: float | None, fmt: str, w: int) -> str:
        s = format(v, fmt) + (f" x{r:.2f}" if r is not None else "      ")
        return f"{s:>{w}}"
    for n, r in results.items():
        tt, rr = r.totals, rel[n]
        lines.append(f"{n:<16} {cell(tt['time_s'] / 3600, rr['time_s'], '.2f', 13)} "
                     f"{cell(tt['cost'], rr['cost'], '.2f', 15)} {cell(tt['gpu_hours'], rr['gpu_hours'], '.1f', 15)} "
                     f"{cell(tt['restarts'], rr['restarts'], 'd', 13)} "
                     f"{cell(tt['queue_wait_s'] / 3600, rr['queue_wait_s'], '.2f', 13)} {tt['epochs']:>6}")
    return "\n".join(lines)


def epoch_table(res: Result) -> str:
    """One strategy's epochs: B trajectory, allocation, epoch time, cost, restarts and queue wait."""
    head = f"{'epoch':>5} {'mix':<28} {'B start->end':>15} {'B mean':>9} {'time s':>10} {'cost':>9} " \
           f"{'restart':>7} {'wait s':>8}"
    lines = [f"strategy {res.strategy}", head]
    for e in res.epochs:
        lines.append(f"{e['epoch']:>5} {e['mix'][:28]:<28} {str(e['B_start']) + '->' + str(e['B_end']):>15} "
                     f"{e['B_mean']:>9.0f} {e['time_s']:>10.1f} {e['cost']:>9.3f} {'yes' if e['restart'] else '':>7} "
                     f"{e['queue_wait_s']:>8.0f}")
    tt = res.totals
    lines.append(f"total: {tt['time_s']:.1f} s, cost {tt['cost']:.3f}, {tt['gpu_hours']:.2f} GPU-h, "
                 f"{tt['restarts']} restarts, queue wait {tt['queue_wait_s']:.0f} s, final mix {tt['final_mix']}")
    return "\n".join(lines)
