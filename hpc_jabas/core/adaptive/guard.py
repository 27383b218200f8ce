"""The divergence guard on adaptive moves: a move that raises B (and with it the lr) is judged on the training loss
after it, and undone when that loss rose beyond its noise band. Pure: plain Python, no torch, no clock.

What it reads: the loss of every iteration over the whole batch (what metrics.jsonl records as ``loss``: the sum of
every rank's loss over the batch's samples), fed in iteration order (``observe``). Those numbers are the same on
any GPU mix, and so is everything decided from them (allocation invariance); nothing here reads a time.

The rule (docs/formulas.md, section 8). A move up is a decision that raises B or the lr scale; it is watched from
the iteration it takes effect at. At the next decision round (``check``) the losses of the iterations run since
(the post window, n1 >= 1 of them, mean m1) are compared with the ``window`` iterations before it (the pre
window, n0 >= ``MIN_PRE``, mean m0, s0 the spread about its straight-line trend):

    revert  when  m1 - m0 > max(sigma * s0 * sqrt(1/n0 + 1/n1),  rise * |m0|)

or when a loss after the move is not finite. The first term is the noise band: under "nothing changed" the
difference of the two means has standard deviation s * sqrt(1/n0 + 1/n1), and s is estimated from the pre window
alone (a diverging post window's own spread would widen the band it is judged by). The second asks for a rise that
matters besides one that is real. Both must hold. A move up with fewer than ``MIN_PRE`` finite losses before it (the
first round of a job whose decision period is short) cannot be judged: it is accepted unjudged when it at most
doubles B and the lr scale (``UNJUDGED_STEP``: the risk of a fixed B twice as large), and a larger one waits
(``allow`` keeps B) until it can be judged. A rise within the band but past ``SUSPECT`` of it keeps the pre-move
level as the reference the next moves answer to (a creep of small rises is judged as a whole), and the good state a
revert returns to stays the one before it. A revert goes back to the last good state (B and lr scale) and starts a
cool-down: until ``cooldown`` x 2^(r - 1) iterations later (r: the reverts so far), no decision may raise B above
that B, nor the lr scale above that scale. When the loss after a revert is still above the band and no lower than
where it had risen to, the guard goes one good state further back. While a move up (or a revert) is not judged yet,
no further move up is allowed.

The weights are not rolled back: the guard restores the step size, not the parameters a diverging stretch left.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hpc_jabas.core.config.defaults import DEFAULT_GUARD_COOLDOWN as DEFAULT_GUARD_COOLDOWN
from hpc_jabas.core.config.defaults import DEFAULT_GUARD_RISE as DEFAULT_GUARD_RISE
from hpc_jabas.core.config.defaults import DEFAULT_GUARD_SIGMA as DEFAULT_GUARD_SIGMA
from hpc_jabas.core.config.validate import integer, is_number
from hpc_jabas.errors import ConfigError

#: the pre-move window: the decision period p, but at least this many and at most GUARD_MAX_WINDOW iterations
GUARD_MIN_WINDOW = 20
GUARD_MAX_WINDOW = 100
#: a move up with fewer finite losses before it than this cannot be judged (no noise band to judge it by)
MIN_PRE = 5
#: such a move may at most multiply B and the lr scale by this (a larger one waits until it can be judged)
UNJUDGED_STEP = 2.0
#: a rise of more than this fraction of the band (but within it) is kept as the level the next moves answer to
SUSPECT = 0.5
#: good states kept to fall back to
GOOD_STATES = 16
#: relative tolerance of "the lr scale rose" (equal B gives the bit-identical scale under sqrt / linear)
_LR_TOL = 1e-9


def guard_window(p: int) -> int:
    """The pre-move window for decision period ``p``: p iterations, clipped to [20, 100]."""
    return min(GUARD_MAX_WINDOW, max(GUARD_MIN_WINDOW, integer(p, "p", lo=1)))


@dataclass(frozen=True)
class Band:
    """One judgement: the two windows and the threshold the post-move mean was held to."""

    pre_mean: float
    pre_std: float
    pre_n: int
    post_mean: float
    post_n: int
    threshold: float          # m0 + max(sigma s0 sqrt(1/n0 + 1/n1), rise |m0|)
    exceeded: bool

    def to_dict(self) -> dict[str, Any]:
        return {"pre_mean": self.pre_mean, "pre_std": self.pre_std, "pre_n": self.pre_n,
                "post_mean": self.post_mean, "post_n": self.post_n, "threshold": self.threshold,
                "exceeded": self.exceeded}


@dataclass(frozen=True)
class Window:
    """A window of losses: mean, sample standard deviation, count."""

    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, losses: Sequence[float]) -> Window | None:
        """The finite losses' statistics (None: fewer than MIN_PRE)."""
        xs = [float(x) for x in losses if math.isfinite(float(x))]
        n = len(xs)
        if n < MIN_PRE:
            return None
        m = math.fsum(xs) / n
        # the spread about the window's straight-line trend (n - 2 degrees of freedom): a loss falling (or rising)
        # across the window is not noise; the iterations are taken as equally spaced
        c = (n - 1) / 2.0
        sxx = math.fsum((i - c) ** 2 for i in range(n))
        slope = math.fsum((i - c) * (x - m) for i, x in enumerate(xs)) / sxx
        res = math.fsum((x - m - slope * (i - c)) ** 2 for i, x in enumerate(xs))
        return cls(m, math.sqrt(res / (n - 2)), n)

    def to_list(self) -> list[float]:
        return [self.mean, self.std, float(self.n)]


def judge(ref: Window, post: Sequence[float], sigma: float = DEFAULT_GUARD_SIGMA,
          rise: float = DEFAULT_GUARD_RISE) -> Band | None:
    """The rule: the post-move losses against a reference window (None: no post-move loss yet). A non-finite
    post-move loss exceeds any band."""
    p1 = [float(x) for x in post]
    n1 = len(p1)
    if n1 == 0:
        return None
    m0, s0, n0 = ref.mean, ref.std, ref.n
    margin = max(sigma * s0 * math.sqrt(1.0 / n0 + 1.0 / n1), rise * abs(m0))
    if not all(math.isfinite(x) for x in p1):
        return Band(m0, s0, n0, math.inf, n1, m0 + margin, True)
    m1 = math.fsum(p1) / n1
    return Band(m0, s0, n0, m1, n1, m0 + margin, m1 - m0 > margin)


def band_verdict(pre: Sequence[float], post: Sequence[float], sigma: float = DEFAULT_GUARD_SIGMA,
                 rise: float = DEFAULT_GUARD_RISE) -> Band | None:
    """The rule on two windows of losses (module docstring); None: not judged (fewer than MIN_PRE finite pre-move
    losses, or no post-move loss yet)."""
    ref = Window.of(pre)
    return None if ref is None else judge(ref, post, sigma, rise)


@dataclass(frozen=True)
class Revert:
    """The guard's verdict on a move up: back to (B, lr_scale), no move above it until ``until``."""

    B: int
    lr_scale: float
    B_bad: int
    lr_bad: float
    moved_at: int              # the iteration the undone move took effect at
    band: Band
    until: int
    reverts: int

    def to_dict(self) -> dict[str, Any]:
        return {"B": self.B, "lr_scale": self.lr_scale, "B_from": self.B_bad, "lr_scale_from": self.lr_bad,
                "moved_at": self.moved_at, **self.band.to_dict(), "cooldown_until": self.until,
                "reverts": self.reverts}

    def line(self, iteration: int) -> str:
        """The one log line that says it."""
        b = self.band
        return (f"divergence guard: the loss rose from {b.pre_mean:.4g} (mean of {b.pre_n} iterations) to "
                f"{b.post_mean:.4g} (mean of {b.post_n}) at B={self.B_bad}, lr x{self.lr_bad:.4g} (from iteration "
                f"{self.moved_at}), above its noise band's {b.threshold:.4g}; back to B={self.B}, lr "
                f"x{self.lr_scale:.4g} from iteration {iteration}, no move above them until iteration {self.until} "
                f"(revert {self.reverts})")


def _raises(B_from: int, lr_from: float, B: int, lr: float) -> bool:
    return B > B_from or lr > lr_from * (1.0 + _LR_TOL)


class DivergenceGuard:
    """The rule's state across a run (module docstring). The caller (the rank-0 controller, or a simulation):

    - ``observe(it, loss)`` for every iteration, in order;
    - at each decision round after ``done`` iterations: ``check(done, at)`` first (a Revert: announce it for
      iteration ``at`` instead of the policy's decision), else the policy decides and
      ``allow(done, B_now, lr_now, B, lr)`` says whether its move may go ahead (a reason when not: keep B);
    - ``moved(at, B_from, lr_from, B, lr)`` for every policy decision announced (``at``: the iteration it takes
      effect at).
    """

    def __init__(self, sigma: float = DEFAULT_GUARD_SIGMA, rise: float = DEFAULT_GUARD_RISE,
                 window: int = GUARD_MIN_WINDOW, cooldown: int = DEFAULT_GUARD_COOLDOWN * GUARD_MIN_WINDOW) -> None:
        if not is_number(sigma, nan=False) or not 0.0 < float(sigma) < math.inf:
            raise ConfigError(f"guard_sigma={sigma!r} is invalid; the noise band in standard errors must be a "
                              "number > 0, e.g. 5")
        if not is_number(rise, nan=False) or not 0.0 <= float(rise) < math.inf:
            raise ConfigError(f"guard_rise={rise!r} is invalid; the smallest relative rise that reverts must be "
                              "a number >= 0, e.g. 0.1")
        self.sigma, self.rise = float(sigma), float(rise)
        self.window = integer(window, "guard window", lo=2)
        self.cooldown = integer(cooldown, "guard cooldown", lo=0)
        self.losses: list[tuple[int, float]] = []      # (iteration, loss): the pre window and everything since
        # the good states, oldest first, B and lr scale rising: a revert goes back to the last, a revert that did not
        # stop the rise to the one before it
        self.goods: list[tuple[int, float]] = []
        self.watch: tuple[int, int, float, int, float] | None = None   # (at, B_from, lr_from, B, lr): a move up
        self.ref: Window | None = None                 # a rise within the band: the level later moves answer to
        # a revert being watched: (at, threshold, the mean it had risen to, the reference's mean, std, count)
        self.after: tuple[int, float, float, float, float, float] | None = None
        self.cap: tuple[int, float, int] | None = None     # (B, lr scale, until): the cool-down after a revert
        self.reverts = 0
        self.last: Band | None = None                  # the last judgement (what a decision record shows)

    def configure(self, window: int, cooldown: int) -> None:
        """The windows in iterations, set once the decision period is known (a resumed state keeps its history)."""
        self.window = integer(window, "guard window", lo=2)
        self.cooldown = integer(cooldown, "guard cooldown", lo=0)

    @property
    def good(self) -> tuple[int, float] | None:
        return self.goods[-1] if self.goods else None

    def _push(self, B: int, lr: float) -> None:
        """A good state: those above it (larger B or lr) are no fallback from it any more."""
        st = (int(B), float(lr))
        self.goods = [g for g in self.goods if g[0] <= st[0] and g[1] <= st[1] * (1.0 + _LR_TOL) and g != st]
        self.goods = (self.goods + [st])[-GOOD_STATES:]

    # ---- the losses --------------------------------------------------------------------------------------
    def observe(self, iteration: int, loss: float) -> None:
        """The whole batch's loss of ``iteration`` (in order; an iteration seen already is ignored)."""
        it = int(iteration)
        if self.losses and it <= self.losses[-1][0]:
            return
        self.losses.append((it, float(loss)))
        self._prune()

    def _prune(self) -> None:
        ats = [w[0] for w in (self.watch, self.after) if w is not None]
        at = min(ats) if ats else None
        before = [x for x in self.losses if at is None or x[0] < at]
        after = [x for x in self.losses if at is not None and x[0] >= at]
        self.losses = before[-self.window:] + after[-GUARD_MAX_WINDOW * 10:]

    def _since(self, at: int) -> list[float]:
        return [x for i, x in self.losses if i >= at]

    # ---- the rounds --------------------------------------------------------------------------------------
    def check(self, iteration: int, at: int | None = None) -> Revert | None:
        """At a decision round after ``iteration`` iterations: judge the watched move (or revert) on the losses
        since it; a Revert to announce for iteration ``at`` (default: the next)."""
        self.last = None
        at_rev = int(iteration) if at is None else int(at)
        if self.after is not None:
            return self._check_after(iteration, at_rev)
        if self.watch is None:
            return None
        at_m, B_from, lr_from, B_bad, lr_bad = self.watch
        post = self._since(at_m)
        if not post:
            return None                                 # not in force yet: judged at a later round
        own = Window.of([x for i, x in self.losses if i < at_m][-self.window:])
        if self.ref is None or (own is not None and own.mean <= self.ref.mean):
            # no earlier rise pending, or the loss came back below it before this move: judged on its own window
            self.ref = own
            self._push(B_from, lr_from)
        ref = self.ref
        self.watch = None
        band = judge(ref, post, self.sigma, self.rise) if ref is not None else None
        self.last = band
        if band is None or not band.exceeded or self.good is None:
            if band is None or band.post_mean - band.pre_mean <= SUSPECT * (band.threshold - band.pre_mean):
                self.ref = None                         # no rise that counts (or unjudged): the new good state
                self._push(B_bad, lr_bad)
            # else: a rise within the band; the good state and its level stay what the next move answers to
            self._prune()
            return None
        self.ref = None
        return self._revert(iteration, at_rev, at_m, B_bad, lr_bad, band)

    def _revert(self, iteration: int, at: int, moved_at: int, B_bad: int, lr_bad: float, band: Band) -> Revert:
        assert self.good is not None
        self.reverts += 1
        until = int(iteration) + self.cooldown * 2 ** (self.reverts - 1)
        B, lr = self.good
        self.cap = (B, lr, until)
        self.after = (at, band.threshold, band.post_mean, band.pre_mean, band.pre_std, float(band.pre_n))
        self._prune()
        return Revert(B, lr, B_bad, lr_bad, moved_at, band, until, self.reverts)

    def _check_after(self, iteration: int, at: int) -> Revert | None:
        """After a revert: the loss still above the band and no lower than where it had risen to means the
        restored state is no remedy either: one good state further back (while there is one)."""
        assert self.after is not None
        at_r, threshold, diverged, pm, ps, pn = self.after
        post = self._since(at_r)
        if not post:
            return None
        self.after = None
        m = math.fsum(post) / len(post) if all(math.isfinite(x) for x in post) else math.inf
        if not (m > threshold and m >= diverged) or len(self.goods) < 2:
            self._prune()
            return None
        B_bad, lr_bad = self.goods.pop()
        band = Band(pm, ps, int(pn), m, len(post), threshold, True)
        return self._revert(iteration, at, at_r, B_bad, lr_bad, band)

    def allow(self, iteration: int, B_now: int, lr_now: float, B: int, lr: float) -> str | None:
        """None: the policy's (B, lr) may be announced; else why it may not (the caller keeps B and the lr)."""
        if not _raises(B_now, lr_now, B, lr):
            return None
        if self.watch is not None:
            return f"divergence guard: the move to B={self.watch[3]} is not judged yet (no loss after it); keep B"
        if self.after is not None:
            return "divergence guard: the revert is not judged yet (no loss after it); keep B"
        if self.ref is None and (B > UNJUDGED_STEP * B_now or lr > UNJUDGED_STEP * lr_now * (1.0 + _LR_TOL)):
            n = sum(1 for _, x in self.losses[-self.window:] if math.isfinite(x))
            if n < MIN_PRE:
                return (f"divergence guard: {n} losses so far, fewer than the {MIN_PRE} a move up is judged "
                        f"against, and a move that cannot be judged may at most double B and the lr; keep B")
        if self.cap is not None and int(iteration) < self.cap[2]:
            cB, clr, until = self.cap
            if B > cB or lr > clr * (1.0 + _LR_TOL):
                return (f"divergence guard cool-down: no move above B={cB} (lr x{clr:.4g}) until iteration "
                        f"{until}; keep B")
        return None

    def moved(self, at: int, B_from: int, lr_from: float, B: int, lr: float) -> None:
        """A policy decision announced for iteration ``at``: a move up is watched from then; a move down is a good
        state (lowering B and the lr is the guard's own remedy)."""
        if _raises(B_from, lr_from, B, lr):
            if self.ref is None:
                self._push(B_from, lr_from)
            self.watch = (int(at), int(B_from), float(lr_from), int(B), float(lr))
        elif B != B_from or lr != lr_from:
            self.ref, self.watch = None, None
            self._push(B, lr)
        self._prune()

    def cooling(self, iteration: int) -> bool:
        return self.cap is not None and int(iteration) < self.cap[2]

    # ---- checkpoint ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"losses": [[i, x] for i, x in self.losses], "goods": [list(g) for g in self.goods],
                "watch": list(self.watch) if self.watch else None, "ref": self.ref.to_list() if self.ref else None,
                "after": list(self.after) if self.after else None, "cap": list(self.cap) if self.cap else None,
                "reverts": self.reverts}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """The run's history (the parameters stay as configured: a resumed job may set them anew)."""
        self.losses = [(int(i), float(x)) for i, x in d.get("losses", [])]
        self.goods = [(int(g[0]), float(g[1])) for g in d.get("goods", [])]
        w, r, a, c = d.get("watch"), d.get("ref"), d.get("after"), d.get("cap")
        self.watch = (int(w[0]), int(w[1]), float(w[2]), int(w[3]), float(w[4])) if w else None
        self.ref = Window(float(r[0]), float(r[1]), int(r[2])) if r else None
        self.after = (int(a[0]), *(float(x) for x in a[1:6])) if a else None  # type: ignore[assignment]
        self.cap = (int(c[0]), float(c[1]), int(c[2])) if c else None
        self.reverts = int(d.get("reverts", 0))
        self._prune()
