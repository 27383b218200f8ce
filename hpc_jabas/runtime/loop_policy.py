"""Adaptive B in the script's own loop: ``hpc_jabas.Jabas(policy=...)`` runs the decision code ``fit()`` runs.

The policy is the core's (core/adaptive/policies: ``policy_for_job``, the class the rank-0 AdaptiveController of
runtime/controller.py holds), built from a JobConfig of the keys the loop was given; the lr rule is
``make_lr_rule``'s; the batch space is the job planner's (``make_planner``: the ``lbbsp`` planner, whose plan of B is
``proportional_plan(B, micro_batch, speeds)``, the split the loop runs, timed by the perf model a job without
profiles plans with, ``job_perf_model``). What fit()'s controller does around the policy at a decision round
(statistics -> PolicyState -> policy -> plan -> lr rule) is done here in the same order and from the same measured
terms, without a Trainer: rank 0 decides and broadcasts (B, lr scale); every rank applies them at the next
iteration boundary. Not here: the divergence guard, the headroom probe, Seesaw, online balancing, goal = "final".
"""
from __future__ import annotations

from typing import Any

from hpc_jabas.core.adaptive.policies import NOISE, SIMILARITY, Observation, PolicyState, policy_for_job
from hpc_jabas.core.adaptive.policies.registry import policy_class
from hpc_jabas.core.adaptive.policy import decision_period, make_lr_rule
from hpc_jabas.core.adaptive.scaling import AdaScaleRule
from hpc_jabas.core.adaptive.stats import NoiseScale, noise_scale_terms
from hpc_jabas.core.autoscale.overheads import measures
from hpc_jabas.core.config import gpus
from hpc_jabas.core.config.sections import SECTION_OF, JobConfig
from hpc_jabas.core.perf.perfmodel import job_perf_model
from hpc_jabas.core.planning.planner import Planner, make_planner
from hpc_jabas.core.planning.space import BatchSpace
from hpc_jabas.errors import ConfigError, JabasError
from hpc_jabas.runtime.comm import seam as comm

#: the policy keys a Jabas takes besides policy, p, batch_min, batch_max, lr_rule, batch_ref, epochs, measure_every
#: (JobConfig's [adaptive] keys the loop's policies read: gamma, alpha, ramp_at, ramp_factor, kappa, ...)
LOOP_KEYS = frozenset({"policy", "p", "batch_min", "batch_max", "lr_rule", "batch_ref", "epochs", "measure_every"})
#: the [adaptive] keys of fit()'s extras the loop does not run (refused, not silently ignored)
NOT_IN_LOOP = frozenset({"batch_start", "headroom_probe", "headroom_every", "seesaw", "goal", "wd_rule", "guard",
                         "guard_sigma", "guard_rise", "guard_cooldown"})


def option_keys() -> list[str]:
    """The keyword arguments a Jabas passes to its policy: JobConfig's [adaptive] keys, less the loop's own and
    fit()'s extras."""
    return sorted(k for k, s in SECTION_OF.items() if s == "adaptive" and k not in LOOP_KEYS | NOT_IN_LOOP)


class LoopPolicy:
    """One Jabas's batch-size policy and lr rule (module docstring). Built in two steps: the keys are checked at
    construction (one ConfigError line each); the policy, its decision period, range and batch space once the
    dataset's length is known (:meth:`start`, at ``Jabas.setup``)."""

    def __init__(self, name: str, *, batch: int, micro_batch: int, speeds: tuple[float, ...], p: int | None,
                 batch_min: int | None, batch_max: int | None, lr_rule: str, batch_ref: int | None,
                 epochs: int | None, measure_every: int | None, options: dict[str, Any]) -> None:
        if not isinstance(name, str):
            raise ConfigError(f"policy={name!r} must be a policy name (fixed, similarity, noise-scale, ramp, or a "
                              "registered one)")
        policy_class(name)                        # an unknown name: one line naming the valid ones
        # (``options``: keys of option_keys() only, checked by Jabas before it builds this)
        if p is not None and (isinstance(p, bool) or not isinstance(p, int) or p < 1):
            raise ConfigError(f"p={p!r} must be an integer >= 1 (the iterations between decisions; None: a tenth "
                              "of an epoch's iterations, at most 100)")
        for key, v in (("batch_min", batch_min), ("batch_max", batch_max)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < micro_batch
                                  or v % micro_batch):
                raise ConfigError(f"{key}={v!r} must be a multiple of micro_batch={micro_batch} (>= {micro_batch})")
        lo, hi = batch_min if batch_min is not None else micro_batch, batch_max
        if not lo <= batch <= (hi if hi is not None else batch):
            raise ConfigError(f"batch={batch} is outside [batch_min={lo}, batch_max={hi}]; need batch_min <= "
                              "batch <= batch_max")
        self.b, self.speeds, self.batch = micro_batch, speeds, batch
        self.keys: dict[str, Any] = dict(options, policy=name, p=p, batch_min=batch_min, batch_max=batch_max,
                                         lr_rule=lr_rule, batch_ref=batch_ref, measure_every=measure_every)
        if epochs is not None:
            self.keys["epochs"] = epochs
        self.cfg = self._config(batch_max if batch_max is not None else batch)
        self.cfg.validate()                       # every key's range, one line (gamma, ramp_at, lr_rule, ...)
        self.lr_scale = 1.0                       # the lr scale in force (fit()'s start: 1)
        self.trajectory: list[tuple[int, int]] = []
        self.noise = NoiseScale()                 # the controller's moving average (the AdaScale rule's default)
        self._since = self._fed = 0
        self.p = 1
        self.measure_every: int | None = None
        self._early: int | None = None
        self.space: BatchSpace | None = None
        self.planner: Planner | None = None

    def _config(self, hi: int) -> JobConfig:
        """The job's keys; an unset range as fit()'s (``default_batch_range``): from one micro-batch up to ``hi``."""
        return JobConfig(batch=self.batch, micro_batch=self.b, planner="lbbsp", speeds=list(self.speeds),
                         identical_micro_batch="true", **{**self.keys, "batch_max": self.keys["batch_max"] or hi,
                                                          "batch_min": self.keys["batch_min"] or self.b})

    def start(self, num_samples: int, B_now: int, iteration: int) -> None:
        """The dataset's length is known: the decision period, the range (unset: fit()'s, ``default_batch_range``,
        one epoch rounded down to whole micro-batches), the policy, the lr rule, the batch space."""
        if self.keys["batch_max"] is None:
            hi = max(self.batch, self.b * (num_samples // self.b))
            self.cfg = self._config(hi)
        cfg = self.cfg
        self.p = decision_period(cfg.p, num_samples, cfg.batch)
        self.policy = policy_for_job(cfg, self.p)
        self.moves = self.policy.adaptive and cfg.B_min < cfg.B_max
        self.lr_rule = make_lr_rule(cfg.lr_rule, B_ref=cfg.batch_ref or cfg.batch, policy=self.policy.name)
        self.measure_every = self.policy.default_measure_every(cfg.measure_every, self.p) if self.moves else None
        self.policy.start(num_samples)
        types = [gpus.REFERENCE] * len(self.speeds)
        self.planner = make_planner(cfg, types, lambda: job_perf_model(cfg, types, calibrated=False),
                                    identical_b=True)
        if self.policy.adaptive:
            self.space = self.planner.batch_space(cfg.B_min, cfg.B_max)
        early = self.policy.first_round(self.measure_every)
        self._early = early if early is not None and early < self.p else None
        if not self.trajectory:
            self.trajectory.append((iteration, B_now))

    @property
    def name(self) -> str:
        return str(self.policy.name)

    def measures(self, done: int) -> bool:
        """Whether the iteration that completes ``done`` iterations measures the gradient statistics."""
        return self.moves and bool(self.policy.reads) and measures(done, self.p, self.measure_every, False)

    def similarity(self, done: int) -> bool:
        """Whether that measurement takes the half-batch cosine (else noise only)."""
        return SIMILARITY in self.policy.reads or self.measure_every is None

    def round(self, done: int) -> bool:
        return self.moves and (done % self.p == 0 or done == self._early)

    def _fresh(self, st: Any) -> tuple[float | None, float | None]:
        """A measurement's unbiased (G2, S), into the moving average too (None: none, or non-finite)."""
        if st is None or not st.S > st.b:
            return None, None
        try:
            g2, s = noise_scale_terms(st.b, st.sq_micro, st.S, st.sq_global)
            self.noise.update(st.b, st.sq_micro, st.S, st.sq_global)
        except ConfigError:
            return None, None
        return g2, s

    def after_step(self, done: int, samples: int, stats: Any, B_now: int, progress: float | None
                   ) -> tuple[int, float] | None:
        """After the iteration that completes ``done`` iterations (``samples``: its B; ``stats``: its GradStats or
        None; ``B_now``: the B announced). Rank 0 takes the measurement (between decisions: into the policy);
        on a decision round (collective) it decides and every rank returns rank 0's (B, lr scale)."""
        if comm.rank() == 0:
            if NOISE in self.policy.reads:
                self._since += int(samples)
            if self.measure_every is not None and stats is not None and not self.round(done):
                g2 = s = None
                if NOISE in self.policy.reads:
                    g2, s = self._fresh(stats)
                if g2 is not None or NOISE not in self.policy.reads:
                    seen = Observation(similarity=stats.similarity, g2=g2, s=s, samples=self._since)
                    if self.policy.observe(seen) and g2 is not None:
                        self._since, self._fed = 0, self._fed + 1
        if not self.round(done):
            return None
        out: Any = None
        if comm.rank() == 0:
            try:
                out = self._decide(done, stats, B_now, progress)
            except JabasError as e:
                out = str(e)
            except (ValueError, ArithmeticError) as e:
                out = f"the batch-size decision failed: {e}"
        out = comm.broadcast_object(out, name="hj.loop.decision")
        if isinstance(out, str):
            raise JabasError(out)
        B, lr = int(out[0]), float(out[1])
        self.lr_scale = lr
        if B != self.trajectory[-1][1]:
            self.trajectory.append((done, B))
        return B, lr

    def _decide(self, done: int, st: Any, B_now: int, progress: float | None) -> tuple[int, float]:
        """Rank 0: statistics -> PolicyState -> policy -> the planner's B -> lr rule (the controller's order)."""
        g2, s = self._fresh(st)
        since = self._since or None
        if g2 is not None:
            self._since, self._fed = 0, self._fed + 1
        bd = self.policy.decide(PolicyState(B=B_now, iteration=done, similarity=st.similarity if st else None,
                                            b_noise=self.noise.b_noise, g2=g2, s=s, progress=progress,
                                            samples=since), self.space)
        assert self.planner is not None
        B = self.planner.plan(bd.B, None).B
        if isinstance(self.lr_rule, AdaScaleRule):
            own = self.policy.noise_estimate()
            est = own if own is not None else self.noise
            self.lr_rule.observe(est.G2, est.S)
        return B, float(self.lr_rule.lr_scale(B))

    def state_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.state_dict(), "lr_rule": self.lr_rule.state_dict(),
                "noise": self.noise.state_dict(), "lr_scale": self.lr_scale, "measured": [self._since, self._fed],
                "trajectory": [list(t) for t in self.trajectory]}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.policy.load_state_dict(d["policy"])
        self.lr_rule.load_state_dict(d["lr_rule"])
        self.noise.load_state_dict(d["noise"])
        self.lr_scale = float(d["lr_scale"])
        self._since, self._fed = (int(x) for x in d["measured"])
        self.trajectory = [(int(a), int(b)) for a, b in d["trajectory"]]
