"""Pure gradient-statistics estimators: noise scale terms and their EMA.

No torch here: the optimizer wrapper (runtime/optim.py) computes, on measurement iterations,
the squared norms of the micro-batch and global mean gradients and feeds the numbers in; it also
computes SimiGrad's half-batch cosine similarity itself (docs/formulas.md, section 2). Background for
the noise scale: docs/formulas.md, section 3 (McCandlish et al. 2018, used by Pollux).

Noise scale. With g_b the mean gradient over b samples, E|g_b|^2 = |G|^2 + tr(Sigma)/b, where
G is the true gradient and Sigma the per-sample gradient covariance. Two batch sizes
b_small < b_big give the unbiased estimators of ``noise_scale_terms``; the simple noise scale is
B_noise = tr(Sigma) / |G|^2 = S / G2. Single estimates are very noisy (G2 can be negative), so
``NoiseScale`` smooths G2 and S separately with a bias-corrected EMA and takes the ratio of the
averages, as McCandlish et al. recommend (what the controller logs); ``NoiseWindow`` averages them
uniformly over the last measurements (the goodput policy's estimate when built without a memory, e.g. by
``make_policy``); ``NoiseMemory`` averages them with weights that decay per training sample, so its memory is
fixed in samples whatever the measurement period (Pollux's; a job's default, ``policy.default_noise_memory``).
"""
from __future__ import annotations

import math
from typing import Any

from hpc_jabas.core.config.validate import is_number, positive
from hpc_jabas.errors import ConfigError


def noise_scale_terms(b_small: float, sq_small: float, b_big: float, sq_big: float) -> tuple[float, float]:
    """Unbiased estimates (G2, S) of |G|^2 and tr(Sigma) from two batch sizes.

    ``sq_small``: the mean over micro-batches of |g_micro|^2, each micro-batch of ``b_small``
    samples. ``sq_big``: |g_global|^2 of the mean gradient over ``b_big`` samples.

        G2 = (b_big*sq_big - b_small*sq_small) / (b_big - b_small)
        S  = (sq_small - sq_big) / (1/b_small - 1/b_big)

    Either value may come out negative for one sample; smooth before taking a ratio.
    Raises ConfigError unless 0 < b_small < b_big.
    """
    bs = positive(b_small, "b_small")
    bb = positive(b_big, "b_big")
    if not bb > bs:
        raise ConfigError(f"noise scale needs b_small < b_big, got b_small={b_small!r}, b_big={b_big!r}")
    ss, sb = float(sq_small), float(sq_big)
    g2 = (bb * sb - bs * ss) / (bb - bs)
    s = (ss - sb) / (1.0 / bs - 1.0 / bb)
    return g2, s


class EMA:
    """Bias-corrected exponential moving average (Adam-style).

    m_t = beta*m_{t-1} + (1-beta)*x_t, value = m_t / (1 - beta^t); the first value equals the
    first observation. ``value`` is None before any update.
    """

    def __init__(self, beta: float = 0.9) -> None:
        try:
            b = float(beta)
        except (TypeError, ValueError):
            b = float("nan")
        if not 0.0 <= b < 1.0:
            raise ConfigError(f"EMA beta={beta!r} is invalid; it must be in [0, 1)")
        self.beta = b
        self._m = 0.0
        self._t = 0

    def update(self, x: float) -> float:
        x = float(x)
        if not math.isfinite(x):
            raise ConfigError(f"EMA got a non-finite observation {x!r}")
        self._m = self.beta * self._m + (1.0 - self.beta) * x
        self._t += 1
        return self.value  # type: ignore[return-value]

    @property
    def count(self) -> int:
        return self._t

    @property
    def value(self) -> float | None:
        if self._t == 0:
            return None
        return self._m / (1.0 - self.beta ** self._t)

    def state_dict(self) -> dict[str, Any]:
        return {"beta": self.beta, "m": self._m, "t": self._t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.beta = float(state["beta"])
        self._m = float(state["m"])
        self._t = int(state["t"])


class NoiseScale:
    """Tracks the gradient noise scale B_noise = S_ema / G2_ema.

    ``update(b_small, sq_small, b_big, sq_big)`` adds one pair of measurements.
    ``b_noise``: None before any update; ``math.inf`` when G2_ema <= 0 (the gradient signal is
    not distinguishable from noise yet, i.e. any batch is "small"); 0.0 when S_ema <= 0 < G2_ema
    (no measurable noise). A policy clips whatever comes out to its [B_min, B_max].
    """

    def __init__(self, beta: float = 0.9) -> None:
        self.g2 = EMA(beta)
        self.s = EMA(beta)

    def update(self, b_small: float, sq_small: float, b_big: float, sq_big: float) -> float | None:
        g2, s = noise_scale_terms(b_small, sq_small, b_big, sq_big)
        self.g2.update(g2)
        self.s.update(s)
        return self.b_noise

    @property
    def G2(self) -> float | None:
        return self.g2.value

    @property
    def S(self) -> float | None:
        return self.s.value

    @property
    def b_noise(self) -> float | None:
        return noise_ratio(self.g2.value, self.s.value)

    def state_dict(self) -> dict[str, Any]:
        return {"g2": self.g2.state_dict(), "s": self.s.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.g2.load_state_dict(state["g2"])
        self.s.load_state_dict(state["s"])


class NoiseWindow:
    """The last ``size`` unbiased estimates (G2, S) of |G|^2 and tr(Sigma), averaged separately.

    ``b_noise`` = mean(S) / mean(G2), the ratio of the averages (McCandlish et al. 2018: a single
    measurement's ratio is biased and often undefined); None before any estimate, ``math.inf``
    while mean(G2) <= 0 (unresolved), 0.0 when mean(S) <= 0 < mean(G2). Uniform weights over a
    bounded window, so the estimate follows a noise scale that grows during training, and
    ``count`` says how many fresh measurements it holds.
    """

    def __init__(self, size: int = 20) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"noise window size={size!r} is invalid; it must be an integer >= 1")
        self.size = size
        self._g2: list[float] = []
        self._s: list[float] = []

    def add(self, g2: float, s: float, samples: float | None = None) -> float | None:
        """One fresh estimate (``samples``: ignored here; the window counts measurements)."""
        g, v = float(g2), float(s)
        if not (math.isfinite(g) and math.isfinite(v)):
            raise ConfigError(f"noise window got a non-finite estimate (G2={g2!r}, S={s!r})")
        self._g2 = (self._g2 + [g])[-self.size:]
        self._s = (self._s + [v])[-self.size:]
        return self.b_noise

    @property
    def count(self) -> int:
        return len(self._g2)

    @property
    def G2(self) -> float | None:
        return sum(self._g2) / len(self._g2) if self._g2 else None

    @property
    def S(self) -> float | None:
        return sum(self._s) / len(self._s) if self._s else None

    @property
    def b_noise(self) -> float | None:
        return noise_ratio(self.G2, self.S)

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size, "g2": list(self._g2), "s": list(self._s)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.size = int(state.get("size", self.size))
        self._g2 = [float(x) for x in state["g2"]][-self.size:]
        self._s = [float(x) for x in state["s"]][-self.size:]


#: the noise scale priced ahead (``NoiseMemory.ahead``) differs from the estimate by at most this factor either way
AHEAD_CAP = 4.0


class NoiseMemory:
    """Unbiased estimates (G2, S) averaged with a memory of ``memory`` training samples (Pollux's estimate).

    A measurement that stands for the ``n`` samples trained since the previous one enters with weight
    1 - exp(-n / memory) and everything before it decays by exp(-n / memory): the weight left on what was
    measured T samples ago is exp(-T / memory) however often it was measured. The averages are
    bias-corrected (divided by the total weight, so the first value is the first estimate).
    Pollux's per-step factor 0.999^(B / B0) is ``memory`` = B0 / -ln(0.999), about 1,000 x B0 samples.
    ``b_noise``, ``count`` as :class:`NoiseWindow`."""

    def __init__(self, memory: float) -> None:
        if not is_number(memory, nan=False) or not 0.0 < float(memory) < math.inf:
            raise ConfigError(f"noise_memory={memory!r} is invalid; it must be a number of training samples > 0, "
                              "e.g. 32000 (about 1,000 x the initial batch, as Pollux)")
        self.memory = float(memory)
        self._g2 = self._s = self._w = 0.0
        # the averages of the (bias-corrected) averages, with the same memory: their ratio to the first ones is the
        # trend the first ones lag by (``ahead``)
        self._g2b = self._sb = 0.0
        self._n = 0

    def add(self, g2: float, s: float, samples: float | None = None) -> float | None:
        """One fresh estimate, standing for the ``samples`` trained since the previous one (> 0)."""
        g, v = float(g2), float(s)
        if not (math.isfinite(g) and math.isfinite(v)):
            raise ConfigError(f"noise memory got a non-finite estimate (G2={g2!r}, S={s!r})")
        if not is_number(samples, nan=False) or not float(samples) > 0:   # type: ignore[arg-type]
            raise ConfigError(f"noise memory got samples={samples!r}; each estimate stands for > 0 trained samples")
        d = math.exp(-float(samples) / self.memory)   # type: ignore[arg-type]
        self._g2 = d * self._g2 + (1.0 - d) * g
        self._s = d * self._s + (1.0 - d) * v
        self._w = d * self._w + (1.0 - d)
        self._g2b = d * self._g2b + (1.0 - d) * self._g2 / self._w
        self._sb = d * self._sb + (1.0 - d) * self._s / self._w
        self._n += 1
        return self.b_noise

    @property
    def count(self) -> int:
        return self._n

    @property
    def G2(self) -> float | None:
        return self._g2 / self._w if self._n and self._w > 0 else None

    @property
    def S(self) -> float | None:
        return self._s / self._w if self._n and self._w > 0 else None

    @property
    def b_noise(self) -> float | None:
        return noise_ratio(self.G2, self.S)

    def ahead(self, samples: float) -> float | None:
        """B_noise priced ``samples`` training samples ahead of the last measurement, the averages' lag removed.

        An average with memory tau of a quantity growing as exp(r t) lags it: it holds x / (1 + r tau), and its own
        average x / (1 + r tau)^2. So each of G2 and S is read as a1^2 / a2 (its value now, exact for an exponential
        trend) times exp((a1 / a2 - 1) samples / tau) (carried ahead), and B_noise is their ratio. The correction
        (ahead / b_noise) is held within [1/AHEAD_CAP, AHEAD_CAP]; without a trend it is 1. An unresolved estimate
        (|G|^2 <= 0 on either level) is returned as ``b_noise``."""
        bn = self.b_noise
        if bn is None or math.isinf(bn) or bn <= 0.0 or not float(samples) >= 0.0:
            return bn
        w = self._w
        g1, g2, s1, s2 = self._g2 / w, self._g2b / w, self._s / w, self._sb / w
        if min(g1, g2, s1, s2) <= 0.0:
            return bn
        h = float(samples) / self.memory

        def now_and_ahead(a1: float, a2: float) -> float:
            r = a1 / a2
            return a1 * r * math.exp(max(-50.0, min(50.0, (r - 1.0) * h)))

        factor = now_and_ahead(s1, s2) / now_and_ahead(g1, g2) / bn
        return bn * min(AHEAD_CAP, max(1.0 / AHEAD_CAP, factor))

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.memory, "g2": self._g2, "s": self._s, "w": self._w, "n": self._n,
                "g2b": self._g2b, "sb": self._sb}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.memory = float(state.get("memory", self.memory))
        self._g2, self._s, self._w = float(state["g2"]), float(state["s"]), float(state["w"])
        self._n = int(state["n"])
        # a checkpoint from before the second level: it starts at the first (no trend yet)
        self._g2b = float(state.get("g2b", self._g2))
        self._sb = float(state.get("sb", self._s))


def noise_ratio(g2: float | None, s: float | None) -> float | None:
    """B_noise = tr(Sigma) / |G|^2 from the two estimates: None without both, ``math.inf`` while |G|^2 <= 0
    (unresolved: the noise dominates), never negative."""
    if g2 is None or s is None:
        return None
    if g2 <= 0.0:
        return math.inf
    return max(0.0, s) / g2


def statistical_efficiency(B: float, b_noise: float, B0: float) -> float:
    """Pollux's E(B) = (B_noise + B_0) / (B_noise + B): progress per sample at B relative to B_0.

    b_noise = inf -> 1 (no noise limit); b_noise = 0 -> B_0 / B.
    """
    if math.isinf(b_noise):
        return 1.0
    bn = max(0.0, float(b_noise))
    return (bn + float(B0)) / (bn + float(B))


def goodput(B: float, t_iter: float, b_noise: float, B0: float) -> float:
    """(B / t_iter) * E(B): samples per second times statistical efficiency."""
    return B / t_iter * statistical_efficiency(B, b_noise, B0)
