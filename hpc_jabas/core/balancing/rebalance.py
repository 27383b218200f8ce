"""The rebalancing decision of LB-BSP on GPUs, with hysteresis and damping. Pure: plain Python + numpy.

LB-BSP (docs/formulas.md, section 6) keeps the global batch B fixed and re-splits it so that all
ranks reach the barrier together, in proportion to predicted speeds; on GPUs it moves samples
between workers and halves the step when the sizes oscillate. Here the split is a
:class:`~hpc_jabas.core.planning.plan.Plan` (b, n) and the decision is :meth:`Rebalancer.propose`:

1. **Candidate.** ``plan_fn(B, factors)`` - the planner, injected - gives the best plan for the
   predicted speed factors (per rank, > 1 faster than profiled, < 1 slower).
2. **Hysteresis.** Predicted gain = 1 - time_fn(candidate)/time_fn(current), both priced under the
   *predicted* factors by ``time_fn(plan, factors)`` (the perf model, injected). Only a gain above
   ``threshold`` is worth a re-plan (a re-plan costs a broadcast and a sampler reshuffle, and a
   small predicted gain is within the prediction error).
3. **Damping.** Each rank's share n_i/M moves up or down. When a proposal would move some rank's
   share opposite to that rank's last move (up, then down, ...) the plan oscillates - typically
   because the speeds driving it are measured under the plan being changed, or the slowdown is
   intermittent - and the move is damped: the new plan goes only a fraction ``step`` of the way
   from the current plan to the candidate, with step = 1/2 ** (number of reversing proposals
   among the last ``max_history`` proposals), never below ``min_step``. So the first reversal
   moves halfway (LB-BSP's halving rule), repeated reversals a quarter, an eighth, ...; the step
   recovers as reversals age out of the history. If the damped move's gain is not above the
   threshold either, the current plan is kept.

Per-rank plans (planning/plan.py): shares are sample shares x_i / B; the damped plan interpolates the
sample counts x_i (largest remainder, sum B exactly, >= 1 on the candidate's running ranks) and
runs them with the candidate's micro-batch sizes b_i (more micro-batches where x_i grew).

The damped plan of identical-b plans: with the same micro-batch size b as the current plan it is, per rank,
n_i = n_cur_i + step (n_cand_i - n_cur_i) rounded by largest remainder so that sum n = M exactly
(every n_i lies between its current and candidate values; a rank with n >= 1 in both keeps
n >= 1). When the candidate changes b, the interpolation is done on the shares n_i/M and realised
with the candidate's b and M over the candidate's participating ranks only (a rank the candidate
leaves out may not fit the new b); each of those keeps at least one micro-batch.

B never changes: plan_fn must return a plan with exactly B samples (ConfigError otherwise).
Memory caps, b candidates and dropping ranks are plan_fn's business: the candidate is plan_fn's;
a damped plan uses the candidate's b on ranks that run at the candidate's b, and with an unchanged
b every n_i lies between two values plan_fn (or the caller) accepted. Nothing else is re-checked.

``propose`` assumes the returned plan is applied; the next call's ``current_plan`` is taken as the
truth anyway (directions are measured from it).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpc_jabas.core.balancing.speed_models import restoring
from hpc_jabas.core.config.validate import positive
from hpc_jabas.core.planning.plan import Plan
from hpc_jabas.errors import ConfigError, StateError

STATE_VERSION = 1

PlanFn = Callable[[int, list[float]], Plan]
TimeFn = Callable[[Plan, list[float]], float]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------

def _round_to_sum(targets: Sequence[float], total: int, mins: Sequence[int]) -> list[int]:
    """Integers close to targets (largest remainder), each >= its min, summing to total exactly.

    Requires sum(mins) <= total. Ties: the lower rank first.
    """
    k = len(targets)
    base = [max(m, math.floor(t + 1e-9)) for t, m in zip(targets, mins)]
    left = total - sum(base)
    while left > 0:   # give to the largest shortfall target - base
        order = sorted(range(k), key=lambda i: (-(targets[i] - base[i]), i))
        for i in order[:left]:
            base[i] += 1
        left = total - sum(base)
    while left < 0:   # take from the largest excess base - target, never below min
        order = sorted((i for i in range(k) if base[i] > mins[i]), key=lambda i: (-(base[i] - targets[i]), i))
        if not order:
            raise ConfigError(f"cannot place {total} micro-batches with minimums {list(mins)}")
        for i in order[:-left]:
            base[i] -= 1
        left = total - sum(base)
    return base


def interpolate_plan(current: Plan, candidate: Plan, step: float) -> Plan:
    """The plan a fraction ``step`` (0..1) of the way from current to candidate (module docstring)."""
    if current.world_size != candidate.world_size:
        raise ConfigError(f"plans have {current.world_size} and {candidate.world_size} ranks; "
                          "they must have one count per rank each")
    if not 0.0 <= step <= 1.0:
        raise ConfigError(f"step={step!r} is invalid; it must be in [0, 1]")
    if step >= 1.0:
        return candidate
    R = current.world_size
    if not (current.identical_b and candidate.identical_b):
        # per-rank plans: interpolate the sample counts x_i (sum B), realised with the candidate's b_i
        B = candidate.B
        targets = [c + step * (d - c) for c, d in zip(current.xs, candidate.xs)]
        tot = sum(targets)
        targets = [B * t / tot for t in targets]
        mins = [1 if d >= 1 else 0 for d in candidate.xs]
        xs = _round_to_sum(targets, B, mins)
        bs = [b if x > b else max(x, 1) for b, x in zip(candidate.bs, xs)]
        return Plan(tuple(bs), tuple(-(-x // b) for x, b in zip(xs, bs)), tuple(xs))
    if current.b == candidate.b:
        M = current.M
        targets = [c + step * (d - c) for c, d in zip(current.n, candidate.n)]
        mins = [1 if (c >= 1 and d >= 1) else 0 for c, d in zip(current.n, candidate.n)]
        n = _round_to_sum(targets, M, mins)
        return Plan(candidate.b, tuple(n))
    M = candidate.M
    part = [i for i in range(R) if candidate.n[i] > 0]
    sh = {i: (1 - step) * current.n[i] / current.M + step * candidate.n[i] / candidate.M for i in part}
    tot = sum(sh.values())
    targets = [M * sh[i] / tot if i in sh else 0.0 for i in range(R)]
    mins = [1 if i in sh else 0 for i in range(R)]
    return Plan(candidate.b, tuple(_round_to_sum(targets, M, mins)))


# ---------------------------------------------------------------------------------------------
# the decision
# ---------------------------------------------------------------------------------------------

def _checked_speeds(B: int, current_plan: Plan, predicted_speed_factors: Sequence[float]) -> list[float]:
    """The predicted speed factors, one positive number per rank of ``current_plan``, whose B is ``B``."""
    if not isinstance(current_plan, Plan):
        raise ConfigError(f"current_plan is a {type(current_plan).__name__}, not a Plan")
    if isinstance(B, bool) or not isinstance(B, int) or B != current_plan.B:
        raise ConfigError(f"global batch B={B!r} differs from the current plan's B={current_plan.B} "
                          f"({current_plan}); rebalancing keeps B fixed")
    R = current_plan.world_size
    sf = list(predicted_speed_factors)
    if len(sf) != R:
        raise ConfigError(f"{len(sf)} predicted speed factors for {R} ranks; give one per rank")
    return [positive(f, f"predicted speed factor of rank {i}") for i, f in enumerate(sf)]


def _candidate(plan_fn: PlanFn, B: int, R: int, sf: list[float]) -> Plan:
    """plan_fn's plan for the speed factors, checked: a Plan of the same B on the same R ranks."""
    cand = plan_fn(B, list(sf))
    if not isinstance(cand, Plan):
        raise ConfigError(f"plan_fn returned a {type(cand).__name__}, not a Plan")
    if cand.B != B or cand.world_size != R:
        raise ConfigError(f"plan_fn returned {cand} (B={cand.B}, {cand.world_size} ranks) for B={B} on "
                          f"{R} ranks; it must keep B and give one count per rank")
    return cand


def share_directions(current: Plan, cand: Plan) -> list[int]:
    """Per rank, which way its share of the samples moves from ``current`` to ``cand``: +1, -1, or 0 within
    half a micro-batch (plans of identical micro-batches) or half a sample (otherwise)."""
    s_cur = [x / current.B for x in current.xs]      # sample shares (n_i / M for identical b)
    s_cand = [x / cand.B for x in cand.xs]
    if current.identical_b and cand.identical_b:
        tol = 0.5 / min(current.M, cand.M)             # half a micro-batch
    else:
        tol = 0.5 / min(current.B, cand.B)             # half a sample
    return [0 if abs(c - p) <= tol else (1 if c > p else -1) for p, c in zip(s_cur, s_cand)]


class Rebalancer:
    """LB-BSP re-plan decision with hysteresis (threshold) and oscillation damping.

    threshold: re-plan only when the predicted relative gain exceeds it (0 <= threshold < 1).
    damping: halve the move on direction reversals (False: always jump to the candidate).
    max_history: proposals remembered for counting reversals (>= 1). min_step: smallest move
    fraction (0 < min_step <= 1).
    """

    def __init__(self, threshold: float = 0.05, damping: bool = True, max_history: int = 8,
                 min_step: float = 1 / 16) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
                or not math.isfinite(threshold) or not 0.0 <= threshold < 1.0:
            raise ConfigError(f"threshold={threshold!r} is invalid; it must be a number in [0, 1), e.g. 0.05")
        if not isinstance(damping, bool):
            raise ConfigError(f"damping={damping!r} is invalid; it must be True or False")
        if isinstance(max_history, bool) or not isinstance(max_history, int) or not 1 <= max_history <= 10_000:
            raise ConfigError(f"max_history={max_history!r} is invalid; it must be an integer in 1..10000")
        if isinstance(min_step, bool) or not isinstance(min_step, (int, float)) \
                or not math.isfinite(min_step) or not 0.0 < min_step <= 1.0:
            raise ConfigError(f"min_step={min_step!r} is invalid; it must be a number in (0, 1]")
        self.threshold = float(threshold)
        self.damping = damping
        self.max_history = max_history
        self.min_step = float(min_step)
        self.reset()

    def reset(self) -> None:
        """Forget the direction memory and history (e.g. after the set of ranks changed)."""
        self.world_size: int | None = None
        self.last_dir: list[int] = []
        self.history: deque[dict[str, Any]] = deque(maxlen=self.max_history)
        self.n_proposals = 0
        self.n_replans = 0

    @property
    def step(self) -> float:
        """Fraction of the way to the candidate a move takes now: 1/2 ** (reversing proposals in the
        history), at least min_step; 1.0 without damping or without recent reversals."""
        if not self.damping:
            return 1.0
        r = sum(1 for h in self.history if h["reversal"])
        return max(self.min_step, 0.5 ** r)

    def _record(self, entry: dict[str, Any]) -> None:
        self.history.append(entry)
        self.n_proposals += 1

    def propose(self, B: int, current_plan: Plan, predicted_speed_factors: Sequence[float],
                plan_fn: PlanFn, time_fn: TimeFn) -> tuple[Plan | None, dict[str, Any]]:
        """A new plan for the predicted speed factors, or None to keep the current one.

        info: gain (predicted, of the candidate), gain_applied (of the returned plan, 0 if kept),
        t_current / t_candidate / t_new (predicted seconds), candidate (str), damped (bool), step,
        reversed_ranks, kept (bool), reason (str).
        """
        sf = _checked_speeds(B, current_plan, predicted_speed_factors)
        R = current_plan.world_size
        if self.world_size != R:
            self.reset()
            self.world_size = R
            self.last_dir = [0] * R

        cand = _candidate(plan_fn, B, R, sf)
        t_cur = positive(time_fn(current_plan, list(sf)), "time_fn(current plan)")
        t_cand = positive(time_fn(cand, list(sf)), "time_fn(candidate plan)")
        gain = 1.0 - t_cand / t_cur
        info: dict[str, Any] = {"gain": gain, "gain_applied": 0.0, "t_current": t_cur, "t_candidate": t_cand,
                                "t_new": t_cur, "candidate": str(cand), "current": str(current_plan),
                                "damped": False, "step": 1.0, "reversed_ranks": [], "kept": True,
                                "threshold": self.threshold}
        entry = {"reversal": False, "moved": False, "current": list(current_plan.n), "b": list(current_plan.bs),
                 "candidate": list(cand.n), "candidate_b": list(cand.bs), "new": None, "gain": gain}

        if cand == current_plan:
            self._record(entry)
            info["reason"] = "the candidate is the current plan"
            return None, info
        if not gain > self.threshold:
            self._record(entry)
            info["reason"] = f"predicted gain {gain:.2%} is not above the threshold {self.threshold:.2%}"
            return None, info

        # direction of every rank's share, and reversals versus its last move
        dirs = share_directions(current_plan, cand)
        rev = [i for i in range(R) if dirs[i] and self.last_dir[i] == -dirs[i]]
        for i, dr in enumerate(dirs):
            if dr:
                self.last_dir[i] = dr
        entry["reversal"] = bool(rev)
        entry["moved"] = True
        self._record(entry)
        step = self.step
        info["reversed_ranks"] = rev
        info["step"] = step

        new = cand if step >= 1.0 else interpolate_plan(current_plan, cand, step)
        t_new = t_cand if new is cand else positive(time_fn(new, list(sf)), "time_fn(damped plan)")
        g_new = 1.0 - t_new / t_cur
        info["damped"] = new is not cand
        if new == current_plan or not g_new > self.threshold:
            info["reason"] = (f"damped move (step {step:g}) has predicted gain {g_new:.2%}, not above the "
                              f"threshold {self.threshold:.2%}")
            return None, info
        entry["new"] = list(new.n)
        self.n_replans += 1
        info.update(kept=False, gain_applied=g_new, t_new=t_new,
                    reason=(f"re-plan: predicted gain {g_new:.2%}" +
                            (f" (damped, step {step:g}, candidate gain {gain:.2%})" if info["damped"] else "")))
        return new, info

    # -- checkpointing ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"kind": "rebalancer", "version": STATE_VERSION,
                "config": {"threshold": self.threshold, "damping": self.damping,
                           "max_history": self.max_history, "min_step": self.min_step},
                "world_size": self.world_size, "last_dir": list(self.last_dir),
                "history": [dict(h) for h in self.history],
                "n_proposals": self.n_proposals, "n_replans": self.n_replans}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("kind") != "rebalancer" \
                or state.get("version") != STATE_VERSION:
            raise ConfigError("rebalancer state is not a state_dict() of this version of Rebalancer")
        with restoring("rebalancer", "Rebalancer.state_dict()"):
            new = Rebalancer(**dict(state["config"]))
            ws = state["world_size"]
            new.world_size = None if ws is None else int(ws)
            new.last_dir = [int(x) for x in state["last_dir"]]
            for h in state["history"]:
                new.history.append(dict(h))
            new.n_proposals = int(state["n_proposals"])
            new.n_replans = int(state["n_replans"])
        if new.world_size is not None and len(new.last_dir) != new.world_size:
            raise StateError(f"rebalancer state has {len(new.last_dir)} directions for "
                              f"{new.world_size} ranks; give a dict made by state_dict()")
        self.__dict__.update(new.__dict__)
