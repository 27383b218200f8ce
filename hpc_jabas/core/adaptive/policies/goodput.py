"""The goodput policy (Pollux's goodput on the gradient noise scale, docs/formulas.md section 3): the realisable B
that maximises (B / t_iter(B)) * E(B), within a trust region around the current B, from a noise scale it estimates
itself from the fresh (|G|^2, tr(Sigma)) measurements it is given (core/adaptive/policy.py's docstring says the whole
rule).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from hpc_jabas.core.adaptive.headroom import HeadroomCap, e_lin_h
from hpc_jabas.core.adaptive.policies.base import NOISE, BatchPolicy, Observation, PolicyState, Wish
from hpc_jabas.core.adaptive.stats import NoiseMemory, NoiseWindow, goodput, statistical_efficiency
from hpc_jabas.core.config.defaults import (
    DEFAULT_EFFICIENCY,
    DEFAULT_GOODPUT_KAPPA,
    DEFAULT_HEADROOM_C,
    DEFAULT_NOISE_TREND,
    DEFAULT_P,
    EFFICIENCIES,
)
from hpc_jabas.core.config.validate import integer, is_number
from hpc_jabas.core.planning.space import GROW, SET, STAY, BatchSpace
from hpc_jabas.errors import ConfigError

if TYPE_CHECKING:
    from hpc_jabas.core.config.sections import JobConfig


#: noise-scale measurements the goodput policy waits for before it moves B (its first decisions)
DEFAULT_GOODPUT_WARMUP = 3
#: the goodput policy moves B by at most this factor per decision (a trust region around the current B)
DEFAULT_GOODPUT_MAX_STEP = 2.0
#: the goodput policy averages the |G|^2 and tr(Sigma) estimates of its last this many measurements (with a
#: memory in samples unset: ``make_policy`` and the API; a job's default is the memory, ``default_noise_memory``)
DEFAULT_GOODPUT_WINDOW = 20
#: the trust region's widest factor: after decisions that each stop at the region's edge on the same side (the
#: goodput argmax lies further out), the next may move by max_step^k, up to this (Pollux has no region at all)
DEFAULT_GOODPUT_MAX_REACH = 16.0
#: a job's goodput policy measures the noise scale this many times per decision period (measure_every = p / this,
#: at least every iteration): noise-only measurements cost a few scalars, not a gradient-sized allreduce
GOODPUT_MEASUREMENTS_PER_PERIOD = 10
#: Pollux's estimate decays by 0.999^(B / B0) per step: a memory of B0 / -ln(0.999), about 1,000 x B0 samples
POLLUX_MEMORY_PER_B0 = 1.0 / -math.log(0.999)
#: the goodput policy moves B only for a predicted goodput gain of at least this fraction (Pollux's 5%: a
#: smaller predicted gain is within the estimate's noise, and each move also moves the lr)
DEFAULT_GOODPUT_MIN_GAIN = 0.05


def default_noise_memory(noise_memory: float | None, batch: int, samples_per_epoch: int) -> float:
    """The goodput estimate's memory in training samples: as set, else Pollux's (about 1,000 x the initial batch)
    but at most one epoch, so the estimate follows a noise scale that grows as the loss falls within a run of a
    few epochs (Pollux's runs are hundreds of epochs long)."""
    if noise_memory is not None:
        return float(noise_memory)
    b = integer(batch, "batch", lo=1)
    n = integer(samples_per_epoch, "samples per epoch", lo=1)
    return float(min(POLLUX_MEMORY_PER_B0 * b, n))


class GoodputPolicy(BatchPolicy):
    """Pollux's goodput on our planner: B = argmax over realisable B of (B / t_iter(B)) * E(B).

    The noise scale: each fresh measurement brings the unbiased estimates (G2, S) of |G|^2 and
    tr(Sigma) (``PolicyState.g2`` / ``s``, stats.noise_scale_terms); the policy averages each over
    its last ``window`` measurements and divides the averages (``stats.NoiseWindow``, McCandlish et
    al.); with ``noise_memory`` (a job's default: ``default_noise_memory``, set at attach through
    :meth:`use_memory`) it averages them with a memory of that many training samples instead
    (``stats.NoiseMemory``, Pollux's estimate). Measurements between decisions come in through
    :meth:`observe` (the controller's ``measure_every``). A caller without raw estimates may pass a smoothed
    ``b_noise`` instead (used only while the estimate is empty).

    As Pollux, B moves only for a predicted goodput gain of at least ``min_gain`` (5%) over the current B.
    Guards beyond Pollux: no move before ``warmup`` fresh measurements (a decision without a new
    measurement, e.g. after a skipped fp16 step, does not count), and at most ``max_step`` x per
    decision (the argmax within [B / max_step, B * max_step]; when no realisable B lies inside,
    the nearest realisable B on the side of the global argmax). An unresolved noise scale (the
    averaged |G|^2 <= 0, B_noise = inf) is read as Pollux reads it: noise dominates the gradient,
    E(B) = 1, so B grows to the fastest B above it within the trust region."""

    name = "noise-scale"
    reads = frozenset({NOISE})
    uses_times = True
    #: Pollux pairs goodput with AdaScale, whose gain is ~B/B_ref while B << B_noise (the regime goodput picks), so
    #: linear scaling is the closest rule we offer (bench/adaptive_tta.py: with sqrt, goodput's large B never
    #: reached the target accuracy)
    auto_lr_rule = "linear"
    options = frozenset({"B0", "B_min", "B_max", "p", "warmup", "max_step", "max_reach", "window", "noise_memory",
                         "kappa", "noise_trend", "efficiency", "headroom_c"})

    def __init__(self, B0: int | None = None, B_min: int = 1, B_max: int | None = None, p: int = DEFAULT_P,
                 warmup: int = DEFAULT_GOODPUT_WARMUP, max_step: float = DEFAULT_GOODPUT_MAX_STEP,
                 window: int = DEFAULT_GOODPUT_WINDOW, min_gain: float = DEFAULT_GOODPUT_MIN_GAIN,
                 noise_memory: float | None = None, max_reach: float = DEFAULT_GOODPUT_MAX_REACH,
                 kappa: float = DEFAULT_GOODPUT_KAPPA, noise_trend: bool = DEFAULT_NOISE_TREND,
                 efficiency: str = DEFAULT_EFFICIENCY, headroom_c: float = DEFAULT_HEADROOM_C) -> None:
        super().__init__(B_min, B_max, p)
        if efficiency not in EFFICIENCIES:
            raise ConfigError(f"efficiency={efficiency!r} is invalid; valid: {', '.join(EFFICIENCIES)}")
        self.efficiency = str(efficiency)
        if not is_number(headroom_c, nan=False) or not 0.0 < headroom_c < math.inf:
            raise ConfigError(f"headroom_c={headroom_c!r} is invalid; it must be a finite number > 0, e.g. 4")
        # moves up beyond headroom_c x the measured curvature headroom are refused (off until one is measured);
        # with efficiency "linear" B is priced with E_lin on the same calibrated edge (c x h)
        self.cap = HeadroomCap(float(headroom_c))
        if not isinstance(noise_trend, bool):
            raise ConfigError(f"noise_trend={noise_trend!r} is invalid; it must be true or false")
        self.noise_trend, self._measured = noise_trend, cast("float | None", None)   # the last measured B_noise
        if not is_number(kappa, nan=False) or not 0.0 < kappa < math.inf:
            raise ConfigError(f"kappa={kappa!r} is invalid; the factor on the measured noise scale must be a "
                              "finite number > 0, e.g. 1 (Pollux's pricing) or 4")
        self.kappa = float(kappa)
        if not is_number(min_gain, nan=False) or not 0.0 <= min_gain < 1.0:
            raise ConfigError(f"min_gain={min_gain!r} is invalid; the smallest predicted goodput gain that moves "
                              "B must be in [0, 1), e.g. 0.05")
        self.min_gain = float(min_gain)
        self.B0 = self.B_min if B0 is None else integer(B0, "B0", lo=1)
        self.warmup = integer(warmup, "warmup", lo=0)
        if not is_number(max_step, nan=False) or not max_step > 1.0:
            raise ConfigError(f"max_step={max_step!r} is invalid; the largest factor per decision must be > 1, "
                              "e.g. 2 (math.inf: no limit)")
        self.max_step = float(max_step)
        self.window = integer(window, "window", lo=1)
        self.noise_memory = None if noise_memory is None else float(noise_memory)
        self.asked_memory = self.noise_memory      # what ``start`` resolves a job's memory from (None: the default)
        self.noise: NoiseWindow | NoiseMemory = NoiseWindow(self.window) if noise_memory is None \
            else NoiseMemory(noise_memory)
        self.seen = 0
        if not is_number(max_reach, nan=False) or not max_reach > 1.0:
            raise ConfigError(f"max_reach={max_reach!r} is invalid; the trust region's widest factor must be > 1, "
                              "e.g. 16 (at most max_step: the region never widens)")
        self.max_reach = max(float(max_reach), self.max_step)
        # the trust region's factor for the next decision, and the side its last decision stopped at the edge of
        # (+1 up, -1 down, 0: the argmax was inside): two edge stops in a row on one side widen it (x max_step)
        self.reach = self.max_step
        self.edge = 0

    @classmethod
    def job_options(cls, cfg: JobConfig) -> dict[str, Any]:
        # its memory in samples: resolved at start (default_noise_memory), once the epoch is known
        return {"B0": cfg.batch, "kappa": cfg.kappa, "noise_trend": cfg.noise_trend, "noise_memory": cfg.noise_memory,
                "efficiency": cfg.efficiency, "headroom_c": cfg.headroom_c}

    @classmethod
    def default_measure_every(cls, measure_every: int | None, p: int) -> int | None:
        """As set; unset, GOODPUT_MEASUREMENTS_PER_PERIOD times a period (p / 10, at least every iteration)."""
        if measure_every is not None:
            return integer(measure_every, "measure_every", lo=1)
        return max(1, round(integer(p, "p", lo=1) / GOODPUT_MEASUREMENTS_PER_PERIOD))

    def start(self, samples_per_epoch: int) -> None:
        """The job's estimate memory: as asked, else ``default_noise_memory`` (Pollux's, at most one epoch)."""
        self.use_memory(default_noise_memory(self.asked_memory, self.B0, samples_per_epoch))

    def first_round(self, measure_every: int | None) -> int | None:
        """With measurements between decisions: the first decision once the warm-up's measurements are in."""
        return None if measure_every is None else (self.warmup + 1) * measure_every

    def noise_estimate(self) -> NoiseWindow | NoiseMemory | None:
        """Its estimate with a memory in samples (one estimate for B and the lr, as Pollux); None with a window."""
        return self.noise if self.noise_memory is not None else None

    def decision_stats(self, B: int, *, fresh: bool, between: bool) -> dict[str, Any]:
        """Its own estimate (what it decided on) and, with the trend on, the noise scale B was priced with."""
        win = self.noise
        out: dict[str, Any] = {"b_noise_window": win.b_noise, "window_count": win.count, "fresh": fresh,
                               "est_G2": win.G2, "est_S": win.S, "kappa": self.kappa}
        if self.noise_trend:
            out["b_noise_priced"] = self.priced(win.b_noise, B)
        return out

    def observe(self, stats: Observation | float | None, s: float | None = None,
                samples: float | None = None) -> bool:
        """One fresh estimate (G2, S) into the noise-scale estimate, between decisions or at one: an
        ``Observation``, or (g2, s, samples) as numbers; ``samples``: the samples trained since the previous fresh
        one (None: counted as one). A missing or non-finite estimate is left out. Whether it was taken."""
        if isinstance(stats, Observation):
            self.cap.observe(stats.headroom, stats.headroom_B)
            g2, s, samples = stats.g2, stats.s, stats.samples
        else:
            g2 = stats
        if g2 is None or s is None or not (is_number(g2, nan=False) and is_number(s, nan=False)) \
                or not (math.isfinite(g2) and math.isfinite(s)):
            return False
        n = samples if is_number(samples, nan=False) and samples is not None and samples > 0 else 1.0
        self.noise.add(float(g2), float(s), float(n))
        self.seen += 1
        return True

    def _observe(self, state: PolicyState) -> float | None:
        """Take this state's fresh measurement, if any; the noise scale to decide on (None: none)."""
        g2, s = state.g2, state.s
        if g2 is not None or s is not None:
            self.observe(g2, s, state.samples if state.samples is not None else state.B)
        elif state.b_noise is not None and is_number(state.b_noise, nan=False) and state.b_noise >= 0 \
                and not self.noise.count:
            self.seen += 1                         # a caller's smoothed estimate: one measurement per call
            return float(state.b_noise)
        return self.noise.b_noise

    def priced(self, b_noise: float | None, B: float | None = None) -> float | None:
        """The noise scale B is priced with: kappa x the measured one (None stays None), with ``noise_trend``
        carried p B / 2 samples ahead, halfway to the next decision (``NoiseMemory.ahead``)."""
        if b_noise is not None and self.noise_trend and B is not None and isinstance(self.noise, NoiseMemory):
            b_noise = self.noise.ahead(self.p * float(B) / 2.0) or b_noise
        return None if b_noise is None else self.kappa * b_noise

    def _bn_text(self, bn: float) -> str:
        m, k = self._measured, "" if self.kappa == 1.0 else f"kappa={self.kappa:g} x "
        ahead = self.noise_trend and m is not None and bn != self.kappa * m
        return f"B_noise={bn:.4g}" + (f" (trend: {m:.4g} measured, {k}priced ahead)" if ahead else
                                       f" ({k}measured)" if k else "")

    def linear_priced(self) -> bool:
        """B is priced with E_lin: efficiency "linear" and a headroom measured (else Pollux's E)."""
        return self.efficiency == "linear" and self.cap.h is not None

    def efficiency_at(self, B: float, bn: float, cur: float) -> float:
        """The per-sample efficiency B is priced with: Pollux's E(B) against B0, or (``linear_priced``) E_lin on
        the calibrated edge c x h from the batch h was measured at, B_noise the proxy for B_n (unresolved: 0)."""
        if not self.linear_priced():
            return statistical_efficiency(B, bn, self.B0)
        lim = self.cap.limit(cur)
        assert lim is not None and self.cap.B_h is not None
        return e_lin_h(B, self.cap.B_h, lim / self.cap.B_h, 0.0 if math.isinf(bn) else bn)

    def _goodput(self, B: float, t: float, bn: float, cur: float) -> float:
        if not self.linear_priced():
            return goodput(B, t, bn, self.B0)
        return B / t * self.efficiency_at(B, bn, cur)

    def wish(self, state: PolicyState, space: BatchSpace) -> Wish:
        self.cap.observe(state.headroom, state.headroom_B or state.B)
        self._measured = self._observe(state)
        bn = self.priced(self._measured, state.B)
        if bn is None:
            return Wish(STAY, float(state.B), "no noise scale yet; keep B")
        if self.seen <= self.warmup:
            # the first estimates of |G|^2 are noisy (often <= 0): wait for a few before moving B
            return Wish(STAY, float(state.B), f"noise scale warming up ({self.seen} of {self.warmup} "
                                              f"measurements, B_noise={bn:.4g}); keep B")
        rows: list[tuple[int, float]] = []
        for B, t in space.table():
            if t is None:
                raise ValueError("the goodput policy needs a batch space with iteration times (a perf model)")
            rows.append((B, t))
        if not rows:
            return Wish(STAY, float(state.B), "no realisable batch in range; keep B")
        cur = int(state.B)
        capped = ""
        if self.cap.h is not None:
            kept = [r for r in rows if self.cap.allows(cur, r[0])]
            if len(kept) < len(rows):
                capped = f" ({self.cap.text(cur)})"
            rows = kept
            if not rows:
                return Wish(STAY, float(cur), f"no realisable batch within the headroom cap{capped}; keep B")
        unresolved = math.isinf(bn)
        if unresolved:
            # |G|^2 averaged <= 0: the noise swamps the signal at this B, so every B is statistically
            # as efficient (E = 1) and the argmax is the fastest B; only growing can resolve it
            rows = [r for r in rows if r[0] > cur]
            if not rows:
                return Wish(STAY, float(cur), f"noise scale unresolved (|G|^2 estimate <= 0 over "
                                              f"{self.noise.count} measurements); B={cur} is already the "
                                              f"largest{capped}")
        # a trust region: at most reach x (or / reach) per decision, so one noisy estimate cannot move B (and
        # the lr that follows it) across the whole range at once; reach = max_step, wider after edge stops
        # (wider only toward the side where the last decisions found the argmax beyond the edge)
        reach = self.reach
        lo = cur / (reach if self.edge < 0 else self.max_step)
        hi = cur * (reach if self.edge > 0 else self.max_step)
        key = lambda r: (-self._goodput(r[0], r[1], bn, cur), abs(r[0] - cur), r[0])  # noqa: E731
        near = [r for r in rows if lo <= r[0] <= hi]
        Bg = min(rows, key=key)[0]
        # an unresolved estimate (E = 1 everywhere) is no confident argmax: it never widens the region
        self._next_reach(0 if unresolved else 1 if Bg > hi else -1 if Bg < lo else 0)
        how = "goodput argmax" if reach == self.max_step else f"goodput argmax within x{reach:g}"
        if not near:
            # nothing realisable inside the trust region: one step to the nearest realisable B on the
            # side of the global argmax (never a jump across the range, never silently unbounded)
            side = [r for r in rows if (r[0] > cur if Bg > cur else r[0] < cur)]
            if Bg == cur or not side:
                return Wish(STAY, float(cur), f"{self._bn_text(bn)}: goodput argmax is B={cur}; keep B")
            near = [min(side, key=lambda r: abs(r[0] - cur))]
            how = f"one step toward the goodput argmax B={Bg} (none realisable in [{lo:.4g}, {hi:.4g}])"
        Bs, ts = min(near, key=key)
        E = self.efficiency_at(Bs, bn, cur)
        now = dict(rows).get(cur) if not unresolved else None
        if self.linear_priced():
            e_cur = self.efficiency_at(cur, bn, cur)
            if self._goodput(Bs, ts, bn, cur) <= 0.0:
                return Wish(STAY, float(cur), f"{self._bn_text(bn)}: E_lin is 0 at every B in reach (B + B_n "
                                              f"beyond the calibrated edge{capped or ' c x h'}); keep B")
            E = E / e_cur if e_cur > 0 else math.inf       # said against the current B
        if now is not None and Bs != cur:
            g_now = self._goodput(cur, now, bn, cur)
            gain = self._goodput(Bs, ts, bn, cur) / g_now - 1.0 if g_now > 0 else math.inf
            if gain < self.min_gain:
                return Wish(STAY, float(cur), f"{self._bn_text(bn)}: {how} B={Bs} predicts {100 * gain:.1f}% more "
                                              f"goodput, under the {100 * self.min_gain:g}% a move needs; keep B")
        pre = (f"noise scale unresolved (|G|^2 estimate <= 0 over {self.noise.count} measurements): grow; "
               if unresolved else f"{self._bn_text(bn)}, ")
        what = "E" if not self.linear_priced() else "E_lin/E_lin(B)"
        return Wish(GROW if unresolved else SET, float(Bs),
                    f"{pre}{how} B={Bs} ({Bs / ts:.4g} samples/s x {what}={E:.3f}){capped}")

    def use_memory(self, memory: float | None) -> None:
        """The estimate's memory in training samples (None: the last ``window`` measurements), set once the job
        knows its epoch (the controller's attach, the simulator's start); a change restarts the estimate."""
        m = None if memory is None else float(memory)
        if m == self.noise_memory:
            return
        self.noise = NoiseWindow(self.window) if m is None else NoiseMemory(m)
        self.noise_memory = m
        self.seen = 0

    def _next_reach(self, edge: int) -> None:
        """After a decision whose goodput argmax lay beyond the trust region's edge on side ``edge`` (0: inside):
        the same side as the decision before widens the next region on that side by max_step (up to max_reach): two
        estimates in a row put the argmax out there, so B need not crawl to it one factor of 2 a period; a
        turn, or an argmax inside, resets it to max_step."""
        self.reach = min(self.reach * self.max_step, self.max_reach) if edge and edge == self.edge else self.max_step
        self.edge = edge

    def config(self) -> dict[str, Any]:
        return {**super().config(), "B0": self.B0, "warmup": self.warmup, "max_step": self.max_step,
                "max_reach": self.max_reach, "window": self.window, "min_gain": self.min_gain, "kappa": self.kappa,
                "noise_trend": self.noise_trend, **({} if self.noise_memory is None else
                                                    {"noise_memory": self.noise_memory}),
                # named only where not the default (a default job's config and checkpoint are as before)
                **({} if self.efficiency == DEFAULT_EFFICIENCY else {"efficiency": self.efficiency}),
                **({} if self.cap.c == DEFAULT_HEADROOM_C else {"headroom_c": self.cap.c})}

    def state_dict(self) -> dict[str, Any]:
        return {**self.config(), "seen": self.seen, "noise": self.noise.state_dict(), "reach": self.reach,
                "edge": self.edge, **({} if self.cap.h is None else {"headroom": self.cap.state_dict()})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.seen = int(state.get("seen", self.warmup))
        self.reach = min(max(float(state.get("reach", self.max_step)), self.max_step), self.max_reach)
        self.edge = int(state.get("edge", 0))
        if "headroom" in state:
            self.cap.load_state_dict(state["headroom"])
        if state.get("noise_memory") != self.noise_memory:
            # the estimate's kind changed since the checkpoint (window <-> memory in samples): it restarts
            self.noise = NoiseWindow(self.window) if self.noise_memory is None else NoiseMemory(self.noise_memory)
            self.seen = 0
        elif "noise" in state:
            self.noise.load_state_dict(state["noise"])
