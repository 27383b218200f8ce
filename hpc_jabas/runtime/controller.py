"""Rank-0 decisions, applied by every rank at the same iteration (invariants 4 and 8).

A controller (hooks.Controller) is called by the trainer on every rank after every iteration.
On a decision round (every p iterations) rank 0 decides from the gradient statistics of that
iteration (policy -> new B -> planner -> lr rule); the decision protocol (protocol.py, reached
as ``trainer.decisions``) broadcasts it, or a no-op when rank 0's decide step raised; every rank
applies it at ``at_iteration``, not earlier or later: the next iteration, or, when a DataLoader's
workers draw ahead, ``trainer.decision_lead`` iterations later (``announce_at``; the decision
is then pending, runtime/persist/pending.py). Controllers decide from the state as announced so far
(``announced``), so a decision made while another is pending builds on that one.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpc_jabas.core.adaptive.decision import Decision
from hpc_jabas.core.adaptive.guard import DivergenceGuard, guard_window
from hpc_jabas.core.adaptive.headroom import HeadroomCap
from hpc_jabas.core.adaptive.policies import NOISE, SIMILARITY, Observation, Policy, PolicyState, policy_for_job
from hpc_jabas.core.adaptive.policies.base import BatchDecision
from hpc_jabas.core.adaptive.policy import DEFAULT_P, decision_period, make_lr_rule, make_wd_rule
from hpc_jabas.core.adaptive.progress import ProgressBudget, progress_efficiency
from hpc_jabas.core.adaptive.scaling import AdaScaleRule
from hpc_jabas.core.adaptive.seesaw import SeesawFloor, floor_batch
from hpc_jabas.core.adaptive.stats import NoiseScale, noise_scale_terms
from hpc_jabas.core.autoscale.overheads import measures
from hpc_jabas.core.planning import Plan, Planner, snap_nearest
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger
from hpc_jabas.runtime.guard_round import GuardRound
from hpc_jabas.runtime.headroom_probe import OnlineProbe
from hpc_jabas.runtime.hooks import Controller, TrainerView
from hpc_jabas.runtime.online_balance import OnlineBalance
from hpc_jabas.runtime.record import StepRecord
from hpc_jabas.runtime.wd_scaling import WeightDecayScaling

if TYPE_CHECKING:
    from torch.utils.hooks import RemovableHandle

    from hpc_jabas.core.balancing import RankPredictors
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.planning import BatchSpace


def announce_at(trainer: TrainerView) -> int:
    """The iteration a decision made now takes effect at: the next one, past the loader's lookahead."""
    return int(trainer.iteration) + int(trainer.decision_lead)


def announced(trainer: TrainerView) -> tuple[int, Plan, float]:
    """(B, plan, lr_scale) with every decision announced so far (pending ones included)."""
    return trainer.announced()


class BaseController(Controller):
    """Subclass and override ``is_round`` and ``decide`` (rank 0); the round itself is done here."""

    p: int = 1

    def attach(self, trainer: TrainerView) -> None:
        self.trainer = trainer

    def wants_stats(self, iteration: int) -> bool:
        return False

    def is_round(self, done_iterations: int) -> bool:
        return done_iterations % self.p == 0

    def has_rounds(self) -> bool:
        """Its rounds are the trainer's calibration rounds (runtime/calibrate.py)."""
        return True

    def decide(self, trainer: TrainerView, rec: StepRecord) -> Decision | None:  # rank 0 only
        return None

    def after_step(self, trainer: TrainerView, rec: StepRecord) -> Decision | None:
        """Collective on decision rounds: rank 0 decides, everyone receives the same Decision."""
        if not self.is_round(trainer.iteration):
            return None
        return self.decision_round(trainer, lambda: self.decide(trainer, rec))

    def decision_round(self, trainer: TrainerView, decide: Callable[[], Decision | None]) -> Decision | None:
        """The protocol: ``decide`` on rank 0 (contained), broadcast, the same Decision on every rank."""
        d: Decision | None = trainer.decisions.run("decision", trainer.iteration, decide, Decision.from_dict,
                                                   noop=lambda: trainer.noop_decision("contained error in the "
                                                                                      "decision step"),
                                                   validate=trainer.check_decision)
        if d is not None and d.kind != "noop":
            self.on_decision(trainer, d)
        return d

    def on_decision(self, trainer: TrainerView, d: Decision) -> None:
        if trainer.rank == 0:
            trainer.metrics.write({"type": "decision", **d.to_dict()})

    def b_trajectory(self) -> list[tuple[int, int]]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        pass


class ScriptedController(BaseController):
    """Applies a given schedule {iteration: plan or B}: a known B trajectory (tests, replays).

    Each change is in force from its iteration, with or without a loader's lookahead: it is
    announced ``trainer.decision_lead`` iterations before (so it must be >= lead + 1).
    """

    def __init__(self, schedule: dict[int, Plan | str | int], lr_rule: Callable[[int], float] | None = None) -> None:
        self.schedule = {int(k): v for k, v in schedule.items()}
        self.lr_rule = lr_rule
        self.p = 1
        self.lead = 0

    def attach(self, trainer: TrainerView) -> None:
        super().attach(trainer)
        self.lead = int(trainer.decision_lead)
        early = [k for k in self.schedule if trainer.iteration < k <= self.lead]
        if early:
            raise ConfigError(f"scripted change at iteration {min(early)} cannot be announced {self.lead} iterations "
                              f"ahead (the DataLoader's lookahead); schedule changes at iteration {self.lead + 1} "
                              "or later")

    def is_round(self, done_iterations: int) -> bool:
        return done_iterations + self.lead in self.schedule

    def decide(self, trainer: TrainerView, rec: StepRecord) -> Decision | None:
        at = announce_at(trainer)
        v = self.schedule[at]
        if isinstance(v, int):
            plan = trainer.planner.plan(v, None)
        elif isinstance(v, str):
            plan = Plan.parse(v)
        else:
            plan = v
        lr = self.lr_rule(plan.B) if self.lr_rule else announced(trainer)[2]
        return Decision(at, plan.B, plan, float(lr), reason="scripted")


class AdaptiveController(BaseController):
    """JABAS's fine-grained loop with either statistic (docs/design.md, section 3), plus LB-BSP's online
    load balancing (docs/formulas.md, section 6) on its own period p_balance.

    Measurement: the iteration that completes each period of p iterations measures the
    gradient statistics (one extra gradient-sized allreduce, nothing on other iterations).
    Decision (rank 0): noise-scale EMA update -> policy -> new B (clipped, snapped to a B the
    planner realises exactly) -> planner -> lr scale -> Decision(at_iteration = next iteration).

    Balancing (runtime/online_balance.py): every p_balance iterations the ranks' measured speeds against
    the perf model give predicted speed factors, and a new plan at the same B when the Rebalancer asks for
    one, broadcast as a normal Decision. The divergence guard's round: runtime/guard_round.py.

    Odd M on a measurement iteration: the even/odd halves then hold (M+1)/2 and (M-1)/2
    micro-batches; the cosine similarity is still computed between the two half means, with
    the smaller half slightly noisier (a small downward bias; no error is raised).
    """

    def __init__(self, cfg: JobConfig, space: BatchSpace | None = None) -> None:
        """``space``: the BatchSpace to snap into (tests); default: built from the trainer at attach."""
        self.cfg = cfg
        self.p = cfg.p or DEFAULT_P          # unset: resolved from the epoch's length at attach
        self.space = space
        # the policy object (core/policies: registered by name); what it reads and how it decides is its own
        self.policy: Policy = policy_for_job(cfg, self.p)
        self.policy_name = self.policy.name
        # a policy whose range holds one B cannot move: it measures nothing and decides nothing (said at attach)
        self.moves = self.policy.adaptive and cfg.B_min < cfg.B_max
        self.lr_rule = make_lr_rule(cfg.lr_rule, B_ref=cfg.batch_ref or cfg.batch, policy=self.policy_name)
        self.wd_rule = make_wd_rule(cfg.wd_rule, B_ref=cfg.batch_ref or cfg.batch)
        self.wd = WeightDecayScaling(self.wd_rule)       # runtime/wd_scaling.py: installed at attach
        self._wd_hook: RemovableHandle | None = None
        self.noise = NoiseScale()
        # measure every measure_every iterations between decisions too (rank 0 feeds the policy): goodput the noise
        # scale only (no half-batch sum), each fresh (G2, S) into its estimate; similarity the cosine, averaged at
        # the next decision. None: at decisions only. Resolved at attach (policy.default_measure_every, from p)
        self.measure_every: int | None = None
        self.reference = False             # a hook prices measuring: reference iterations (core/autoscale/overheads.py)
        self._since = 0                    # samples trained since the last fresh measurement (rank 0)
        self._fed = 0                      # fresh measurements given to the policy (rank 0)
        self._early: int | None = None     # with measure_every: one early decision round (attach)
        self.trajectory: list[tuple[int, int]] = []
        self.last_stats: dict[str, Any] = {}
        self.balance = cfg.balance != "off"
        self.balancing = OnlineBalance(cfg) if self.balance else None     # runtime/online_balance.py
        self.planner: Planner | None = None       # the trainer's (attach)
        # the divergence guard on moves up (core/adaptive/guard.py) and its part of the rounds (runtime/guard_round.py)
        self.guard = DivergenceGuard(cfg.guard_sigma, cfg.guard_rise) if cfg.guard and self.moves else None
        self.guarding = GuardRound(self.guard) if self.guard is not None else None
        # the curvature headroom probed at decision rounds (runtime/headroom_probe.py; headroom_probe = 0: never), the
        # cap it sets (Seesaw's floor reads it), Seesaw's late-phase floor (core/adaptive/seesaw.py; built at attach)
        self.probe = OnlineProbe(cfg.headroom_probe, cfg.headroom_every, cfg.seed) \
            if cfg.headroom_probe and self.moves else None
        self._probe_now = False
        self.hcap = HeadroomCap(cfg.headroom_c)
        self.seesaw: SeesawFloor | None = None
        # goal = "final": the epoch budget in statistical progress (core/adaptive/progress.py), every rank's ledger
        # the same (each iteration's samples x the E the last decision's record carries); built at attach
        self.budget: ProgressBudget | None = None

    def attach(self, trainer: TrainerView) -> None:
        super().attach(trainer)
        cfg = self.cfg
        self.p = self.policy.p = decision_period(cfg.p, trainer.sampler.num_samples, cfg.batch)
        pol = self.policy
        self.measure_every = pol.default_measure_every(cfg.measure_every, self.p) if self.moves else None
        hook = trainer.epoch_end_hook
        self.reference = hook is not None and bool(hook.prices_measuring)
        pol.start(trainer.sampler.num_samples)
        if trainer.rank == 0 and pol.adaptive:
            if not self.moves:
                get_logger(__name__).warning(
                    "policy %r cannot move B: batch_min=%d = batch_max=%d; it measures nothing (set a wider "
                    "range, or policy='fixed')", self.policy_name, cfg.B_min, cfg.B_max)
            elif cfg.p is None and self.p == 1 and pol.reads:
                get_logger(__name__).warning(
                    "p=1: an epoch has only %d iterations at B=%d, so every iteration measures the gradient "
                    "statistics (an extra allreduce each); set p to decide less often",
                    -(-trainer.sampler.num_samples // cfg.batch), cfg.batch)
        self.planner = trainer.planner
        if self.space is None and pol.adaptive:
            # the B the trainer's planner realises on this mix, timed by the job's perf model
            self.space = self.planner.batch_space(cfg.B_min, cfg.B_max)
        if self.guard is not None:
            self.guard.configure(guard_window(self.p), cfg.guard_cooldown * self.p)
        opt = trainer.opt.optimizer
        if self.probe is not None:
            self.probe.attach(trainer, trainer.sampler.num_samples, cfg.micro_batch or max(trainer.plan.bs), opt)
        if cfg.seesaw and self.moves and self.seesaw is None:
            import torch
            adam = isinstance(opt, (torch.optim.Adam, torch.optim.AdamW))
            self.seesaw = SeesawFloor(cfg.batch_ref or cfg.batch, adam)
        if cfg.goal == "final" and self.moves and not trainer.runs_progress_budget:
            raise ConfigError("goal='final' needs a trainer that runs to the progress budget (hpc_jabas.Trainer); "
                              "this one ends after its epochs of samples: use goal='time'")
        if cfg.goal == "final" and self.moves and self.budget is None:
            # the budget: the epochs fit() trains to (its argument, set before it attaches us; else the key)
            epochs = int(trainer.fit_epochs or cfg.epochs)
            self.budget = ProgressBudget(float(epochs) * trainer.sampler.num_samples, trainer.sampler.num_samples)
        if not self.trajectory:
            self.trajectory.append((trainer.iteration, trainer.B))
        if self.wd_rule.name != "none" and self._wd_hook is None and hasattr(trainer.opt, "add_pre_step_hook"):
            self._wd_hook = trainer.opt.add_pre_step_hook(self._apply_wd)
        if self.balancing is not None:
            self.balancing.attach(trainer)
        # measure_every: the first decision comes once the warm-up's measurements are in (iteration (warmup + 1) k),
        # when that is before the first period's end; then every p iterations as without
        early = pol.first_round(self.measure_every)
        self._early = early if early is not None and early < self.p else None

    def has_rounds(self) -> bool:
        return self.balance or self.policy.adaptive

    @property
    def factors(self) -> list[float] | None:
        """The ranks' predicted speed factors the planner gets (None: balancing off, or none predicted yet)."""
        return self.balancing.factors if self.balancing is not None else None

    @property
    def predictors(self) -> RankPredictors | None:
        return self.balancing.predictors if self.balancing is not None else None

    def _policy_round(self, done: int) -> bool:
        """Whether the policy decides after ``done`` iterations: every p, and the early first round (measure_every)."""
        return self.moves and (done % self.p == 0 or done == self._early)

    def model_changed(self) -> None:
        """The perf model was recalibrated in place: a policy that prices B with the batch space's times (goodput)
        gets its space rebuilt on it (kept, with a warning, when that fails)."""
        if self.space is None or not self.policy.uses_times or self.planner is None:
            return
        try:
            self.space = self.planner.batch_space(self.cfg.B_min, self.cfg.B_max)
        except ConfigError as e:
            get_logger(__name__).warning("batch space kept on the previous model: %s", e)

    def _apply_wd(self, opt: Any) -> None:
        """The optimizer's pre-step hook: the wd rule at the B in force (runtime/wd_scaling.py)."""
        self.wd.apply(opt.optimizer.param_groups, self.trainer.B)

    def progress(self, trainer: TrainerView) -> float | None:
        """The fraction of the configured run done (what the ramp policy reads): in samples, or with goal = "final"
        in statistical progress."""
        if self.budget is not None:
            return self.budget.fraction
        sampler, epochs = trainer.sampler, self.cfg.epochs
        n = sampler.num_samples
        if not epochs or not n:
            return None
        return (sampler.epoch + sampler.cursor / n) / epochs

    def wants_stats(self, iteration: int) -> bool:
        k = self.measure_every
        return self.moves and bool(self.policy.reads) and measures(iteration + 1, self.p, k, self.reference)

    def measures_similarity(self, iteration: int) -> bool:
        """Whether a measurement iteration needs the half-batch cosine: False for the measurements of a policy that
        reads the noise scale only, taken between decisions (goodput's noise-only measurements)."""
        return SIMILARITY in self.policy.reads or self.measure_every is None

    def defers_stats(self, iteration: int) -> bool:
        """Whether this iteration's measurement may be read later (noise-only measurements between decisions): the
        trainer then hands it to :meth:`observe_held` before the next iteration's ``after_step``, so that the
        policy takes it with the same samples and in the same order as if it were read at once."""
        return not self.measures_similarity(iteration) and not self._policy_round(iteration + 1)

    def observe_held(self, trainer: TrainerView, rec: StepRecord) -> None:
        """A deferred measurement (``rec``: its iteration's record, its stats added), read after that iteration's
        ``after_step`` and before the next one's: rank 0's policy takes it as ``after_step`` would have."""
        if trainer.rank == 0 and rec.stats:
            self._observe_between(rec.stats)

    def _observe_between(self, st: dict[str, Any]) -> None:
        """Rank 0: one measurement between decisions into the policy. A policy that reads the noise scale gets this
        measurement's fresh (G2, S) (the controller's moving average takes them too) and the samples since the
        previous one; one that does not, the cosine alone."""
        g2 = s_tr = None
        if NOISE in self.policy.reads:
            g2, s_tr = self._fresh_terms(st)
            if g2 is None:
                return
        seen = Observation(similarity=st.get("similarity"), g2=g2, s=s_tr, samples=self._since)
        if self.policy.observe(seen) and g2 is not None:
            self._since = 0
            self._fed += 1

    def _fresh_terms(self, st: dict[str, Any] | None) -> tuple[float | None, float | None]:
        """This measurement's unbiased (G2, S) (None, None: none, one micro-batch, or non-finite); the controller's
        moving average takes them too."""
        if not st or not st["S"] > st["b"]:
            return None, None
        try:
            g2, s_tr = noise_scale_terms(st["b"], st["sq_micro"], st["S"], st["sq_global"])
            self.noise.update(st["b"], st["sq_micro"], st["S"], st["sq_global"])
        except ConfigError:
            return None, None              # a non-finite measurement: keep the smoothed value
        return g2, s_tr

    def is_round(self, done: int) -> bool:
        return self._policy_round(done) or (self.balance and done % self.cfg.p_balance == 0)

    def finished(self) -> bool:
        """goal = "final": the progress budget is made (every rank alike); False with goal = "time"."""
        return self.budget is not None and self.budget.finished()

    def runs_on(self) -> bool:
        """goal = "final": the run goes on (past its epochs of samples) until the progress budget is made."""
        return self.budget is not None and not self.budget.finished()

    def epochs_due(self) -> int | None:
        """goal = "final": the epochs of progress completed since the last call, a per-epoch scheduler's steps (the
        Trainer then steps it here, not at the data's epoch ends); None with goal = "time"."""
        return None if self.budget is None else self.budget.epochs_due()

    def after_step(self, trainer: TrainerView, rec: StepRecord) -> Decision | None:
        if self.balancing is not None:
            self.balancing.record(rec)
        if self.budget is not None:
            self.budget.add(rec.samples)
        if self.guarding is not None:
            self.guarding.record(rec)
        done = trainer.iteration
        if trainer.rank == 0:
            if NOISE in self.policy.reads:                           # the samples a fresh (G2, S) stands for
                self._since += int(rec.samples)
            between = not self._policy_round(done)                  # a decision round takes its own in decide
            if self.measure_every is not None and rec.stats and between:
                self._observe_between(rec.stats)
        if not self.is_round(done):
            return None
        bal = self.balancing is not None and self.balancing.due(done)
        pol = self._policy_round(done)
        self._probe_now = pol and self.probe is not None and self.probe.due(done, self.p)   # every rank alike
        meas = self.balancing.gather(trainer) if bal and self.balancing is not None else None
        if pol and self.guarding is not None:
            self.guarding.gather(trainer)
        return self.decision_round(trainer, lambda: self._decide_round(trainer, rec, pol, meas))

    def _decide_round(self, trainer: TrainerView, rec: StepRecord, pol: bool,
                      meas: list[dict[str, Any]] | None) -> Decision | None:
        if meas is not None:
            assert self.balancing is not None
            measured = self.balancing.update(meas)
            if not pol:
                return self.balancing.rebalance(trainer, meas, measured, announce_at(trainer), announced(trainer))
            d = self.decide(trainer, rec)
            self.balancing.write_kept(trainer, meas, measured, d, d.plan == announced(trainer)[1])
            return d
        return self.decide(trainer, rec)

    def decide(self, trainer: TrainerView, rec: StepRecord) -> Decision:
        """Rank 0: the divergence guard's verdict on the last move up (a revert is the decision), else
        statistics -> policy wish -> direction-preserving snap (core/planning/space.py) -> plan -> lr -> the
        guard's consent (a move up during its cool-down, or before the last one is judged, keeps B)."""
        d = self._decide_policy(trainer, rec)        # first: should it raise, the guard's state is left as it was
        if self.guarding is None:
            return d
        return self.guarding.consent(trainer, d, announced(trainer), self._revert_plan, get_logger(__name__))

    def _revert_plan(self, B: int) -> Plan:
        """The plan of a B the guard reverts to (snapped into the space: a resumed job on another mix)."""
        if self.space is not None and not self.space.is_realisable(B):
            B = snap_nearest(self.space, B)
        return self.trainer.planner.plan(B, list(self.factors) if self.factors else None)

    def _decide_policy(self, trainer: TrainerView, rec: StepRecord) -> Decision:
        """Rank 0: statistics -> policy wish -> direction-preserving snap (core/planning/space.py) -> plan -> lr."""
        st = rec.stats
        sim = st["similarity"] if st else None
        g2, s_tr = self._fresh_terms(st)   # this iteration's fresh estimates (None: no fresh measurement)
        bnoise = self.noise.b_noise
        B_now, plan_now, _ = announced(trainer)
        since = self._since or None        # the samples this decision's measurement stands for (goodput)
        if g2 is not None:
            self._since = 0
            self._fed += 1
        hd = self.probe.measure(trainer, trainer.opt.optimizer, rec.B, trainer.iteration, rec.lr_scale * (
            rec.lr_warmup or 1.0)) if self._probe_now and self.probe is not None else None
        if hd is not None:
            self.hcap.observe(hd["h"], hd["B"])
        bd = self.policy.decide(PolicyState(B=B_now, iteration=trainer.iteration, similarity=sim,
                                            b_noise=bnoise, g2=g2, s=s_tr, progress=self.progress(trainer),
                                            samples=since, headroom=hd["h"] if hd else None,
                                            headroom_B=hd["B"] if hd else None),
                                self.space)
        floor = self._seesaw(trainer, bd.B)
        if floor is not None:
            bd = BatchDecision(floor[0], "set", float(floor[0]), floor[0] != B_now, f"{bd.reason}; {floor[2]}")
        if bd.B == B_now and self.factors is None:
            plan = plan_now
        else:
            plan = trainer.planner.plan(bd.B, list(self.factors) if self.factors else None)
        if plan.B != bd.B:
            raise RuntimeError(f"planner realised B={plan.B} for the decided B={bd.B} (batch space out of step)")
        if isinstance(self.lr_rule, AdaScaleRule):
            # its gain reads the smoothed noise-scale terms: the policy's own estimate where it has one (goodput's
            # with a memory in samples, as Pollux: one estimate for B and the lr), else the controller's moving average
            own = self.policy.noise_estimate()
            est = own if own is not None else self.noise
            self.lr_rule.observe(est.G2, est.S)
        lr = self.lr_rule.lr_scale(plan.B) if floor is None else floor[1]
        # G2/S_trace: the controller's smoothed terms; g2/s: this decision's fresh estimates as the policy got
        # them (None: none), which a simulation replays ([gradstats] curve = "trace", core/sim/simconfig.py)
        stats = {"similarity": sim, "b_noise": bnoise, "G2": self.noise.G2, "S_trace": self.noise.S,
                 "g2": g2, "s": s_tr, "direction": bd.direction, "target": bd.target, "moved": bd.moved,
                 "B_before": B_now}
        # what the policy read (similarity: the period's mean cosine; goodput: its own estimate and pricing)
        stats.update(self.policy.decision_stats(B_now, fresh=g2 is not None, between=self.measure_every is not None))
        if NOISE in self.policy.reads and self.measure_every is not None:
            stats.update(measurements=self._fed)   # the fresh measurements fed so far, decisions' included
        if self.probe is not None and self.probe.last is not None:
            stats.update(headroom=self.probe.record(), headroom_fresh=hd is not None)   # the h in force, and when
        if self.seesaw is not None:
            stats.update(seesaw={"alpha": self.seesaw.alpha, "floor": floor[0] if floor else None})
        if self.budget is not None:       # E of the decided B on the estimate now: what every rank's ledger counts
            own = self.policy.noise_estimate()
            est = own if own is not None else self.noise
            stats.update(progress_E=progress_efficiency(est.G2, est.S, plan.B, self.cfg.batch),
                         progress=self.budget.fraction)
        self.last_stats = stats
        return Decision(announce_at(trainer), plan.B, plan, float(lr), reason=f"{self.policy.name}: {bd.reason}",
                        stats=stats)

    def _seesaw(self, trainer: TrainerView, B: int) -> tuple[int, float, str] | None:
        """Rank 0, Seesaw on: (B, lr scale, why) where the schedule's cut lifts the decided ``B`` (None: it does
        not bind); the floor capped by the measured headroom (core/adaptive/seesaw.py)."""
        if self.seesaw is None or self.space is None:
            return None
        alpha = self.seesaw.observe(float(trainer.opt.optimizer.param_groups[0]["lr"]))
        lim = self.hcap.limit(B)
        nb = floor_batch(self.space, B, self.seesaw.floor(B_max=self.space.B_max), lim)
        if nb is None:
            return None
        why = f"seesaw: the schedule's lr at {alpha:.3g} of its peak: B >= {self.seesaw.B_ref / alpha:.4g}" + (
            f", capped at c x h x B_h = {lim:.4g}" if lim is not None and nb < self.seesaw.B_ref / alpha else "")
        return nb, self.seesaw.lr_scale(nb), f"{why} -> B={nb}"

    def on_decision(self, trainer: TrainerView, d: Decision) -> None:
        if self.budget is not None:
            self.budget.set_efficiency(d.stats.get("progress_E"))
        super().on_decision(trainer, d)
        if d.B != (self.trajectory[-1][1] if self.trajectory else None):
            self.trajectory.append((d.at_iteration, d.B))

    def b_trajectory(self) -> list[tuple[int, int]]:
        return list(self.trajectory)

    def state_dict(self) -> dict[str, Any]:
        bal = self.balancing.state_dict() if self.balancing is not None else dict.fromkeys(
            ("factors", "predictors", "rebalancer"))
        return {"policy": self.policy.state_dict(), "lr_rule": self.lr_rule.state_dict(),
                "noise": self.noise.state_dict(), "trajectory": list(self.trajectory),
                "factors": bal["factors"], "wd": self.wd.state(),
                "measured": [self._since, self._fed], "predictors": bal["predictors"], "rebalancer": bal["rebalancer"],
                **(self.guarding.state_dict(self._one_rank()) if self.guarding is not None
                   else {"guard": None, "guard_pending": None}),
                **({} if self.probe is None else {"probe": self.probe.state_dict(), "hcap": self.hcap.state_dict()}),
                **({} if self.seesaw is None else {"seesaw": self.seesaw.state_dict()}),
                **({} if self.budget is None else {"budget": self.budget.state_dict()})}

    def _one_rank(self) -> bool:
        """One rank: its pending losses are the whole batch's, so a checkpoint can hold them (with more ranks each
        holds its own part until the next round, and rank 0 alone writes the checkpoint)."""
        tr = getattr(self, "trainer", None)
        return self.guard is not None and tr is not None and int(tr.world) == 1

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.policy.load_state_dict(d["policy"])
        self.lr_rule.load_state_dict(d["lr_rule"])
        self.noise.load_state_dict(d["noise"])
        self.trajectory = [tuple(x) for x in d["trajectory"]]
        self._since, self._fed = (int(x) for x in d.get("measured", (0, 0)))
        if self.guarding is not None:
            self.guarding.load_state_dict(d, self._one_rank())
        if self.probe is not None and d.get("probe"):
            self.probe.load_state_dict(d["probe"])
            self.hcap.load_state_dict(d["hcap"])
        if self.seesaw is not None and d.get("seesaw"):
            self.seesaw.load_state_dict(d["seesaw"])
        if self.budget is not None and d.get("budget"):
            self.budget.load_state_dict(d["budget"])
        self.wd.load(d.get("wd"))          # the optimizer's state holds the scaled values
        if self.balancing is not None:
            self.balancing.load_state_dict(d)


def final_goal(ctl: Controller | None) -> AdaptiveController | None:
    """The adaptive controller when its goal is "final" (the Trainer runs on to its progress budget and steps a
    per-epoch scheduler at its epochs of progress: ``runs_on``, ``finished``, ``epochs_due``), else None."""
    return ctl if isinstance(ctl, AdaptiveController) and ctl.budget is not None else None
