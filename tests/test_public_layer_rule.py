"""Jabas's adaptive rule (hpc_jabas/runtime/loop.py ``adapt_batch``): B follows the measured noise scale, as a
multiple of the micro-batch within [B_min, B_max]; checked against a brute-force reference (the multiple of b in
range nearest to the noise scale, ties up), and its argument checks."""
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.loop import _check_adapt, adapt_batch


def brute(noise: float, lo: int, hi: int, b: int) -> int:
    """Every allowed B scanned: the nearest to ``noise`` (ties: the larger); no finite noise: the largest."""
    allowed = list(range(lo, hi + 1, b))
    if not noise < math.inf:
        return hi
    return min(allowed, key=lambda B: (abs(B - noise), -B))


@given(b=st.integers(1, 16), k_lo=st.integers(1, 8), k_span=st.integers(0, 8),
       noise=st.one_of(st.floats(0, 400, allow_nan=False), st.just(math.inf), st.just(math.nan)))
def test_the_rule_picks_the_allowed_batch_nearest_the_noise_scale(b, k_lo, k_span, noise):
    lo, hi = b * k_lo, b * (k_lo + k_span)
    got = adapt_batch(noise, lo, hi, b)
    assert got % b == 0 and lo <= got <= hi
    assert got == brute(noise, lo, hi, b)


@pytest.mark.parametrize("adapt,every,says", [((5, 20), 1, "multiples of micro_batch=4"),
                                              ((8, 4), 1, "4 <= B_min <= B_max"),
                                              ((8, 16), 0, "needs measure_every >= 1"),
                                              ("8,16", 1, "must be (B_min, B_max)")])
def test_bad_adapt_arguments_are_one_line(adapt, every, says):
    with pytest.raises(ConfigError) as e:
        _check_adapt(adapt, 4, every)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert _check_adapt((8, 16), 4, 1) == (8, 16) and _check_adapt(None, 4, 0) is None
