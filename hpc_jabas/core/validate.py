"""The one set of number checks of the pure core: a bad value gets one line naming it and what is valid.

Every check takes the value and the name to print, and returns the value converted (``float`` or ``int``)
or raises :class:`~hpc_jabas.errors.ConfigError` with the line::

    <name>=<repr of the value> is invalid; it must be <rule>

The rules are the same everywhere:

* a **number** is an ``int``, ``float`` or numpy scalar of those kinds; never a ``bool``, a string or a
  complex number (``"3"`` is refused: the config layer converts text before a value reaches the core);
* a number is **finite** unless a check says otherwise: NaN and infinities are refused;
* an **integer** is an ``int`` or numpy integer, or a float with an integral value (``2.0``, as TOML and
  JSON may give it), returned as ``int``;
* bounds are closed unless marked open: ``lo_open=True`` makes ``lo`` strict, ``hi_open=True`` makes ``hi``
  strict, and the message spells the range as ``> 0``, ``>= 1``, ``in [0, 1)``, ``in 1..64``.

Saved state that fails a check is the caller's to report as a :class:`~hpc_jabas.errors.StateError`.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from hpc_jabas.errors import ConfigError

_REAL = (int, float, np.integer, np.floating)


def is_number(x: Any, *, nan: bool = True) -> bool:
    """A real number of a numeric type (infinities included, NaN unless ``nan=False``; bool, str and
    complex excluded)."""
    return isinstance(x, _REAL) and not isinstance(x, (bool, np.bool_)) and (nan or not math.isnan(float(x)))


def _range_text(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool, fmt: str = "g") -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo:{fmt}}, {hi:{fmt}}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:{fmt}}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi:{fmt}}"
    return ""


def number(x: Any, what: str, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
           hi_open: bool = False, finite: bool = True) -> float:
    """``x`` as a float, checked: a number (finite unless ``finite=False``) within the bounds."""
    ok = is_number(x) and not math.isnan(float(x)) and (not finite or math.isfinite(float(x)))
    if ok:
        v = float(x)
        ok = (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or (v < hi if hi_open else v <= hi))
    if not ok:
        kind = "a finite number" if finite else "a number"
        bounds = _range_text(lo, hi, lo_open, hi_open)
        raise ConfigError(f"{what}={x!r} is invalid; it must be {kind}{' ' + bounds if bounds else ''}")
    return float(x)


def positive(x: Any, what: str) -> float:
    """A finite number > 0 (a time, a speed, a rate)."""
    return number(x, what, lo=0.0, lo_open=True)


def integer(x: Any, what: str, *, lo: int | None = None, hi: int | None = None, whole_float: bool = True,
            digits: bool = False) -> int:
    """``x`` as an int, checked: an integer (or, with ``whole_float``, an integral float; with ``digits``, a
    string of decimal digits such as a flag's "60") within the closed bounds."""
    v: int | None = None
    if digits and isinstance(x, str) and re.fullmatch(r"\s*-?[0-9]+\s*", x):
        v = int(x)
    elif isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        v = int(x)
    elif whole_float and isinstance(x, (float, np.floating)) and math.isfinite(float(x)) and float(x).is_integer():
        v = int(x)
    if v is None or (lo is not None and v < lo) or (hi is not None and v > hi):
        if lo is not None and hi is not None:
            bounds = f" in {lo}..{hi}"
        else:
            bounds = " " + _range_text(lo, hi, False, False, "d") if lo is not None or hi is not None else ""
        raise ConfigError(f"{what}={x!r} is invalid; it must be an integer{bounds}")
    return v


def passes(check: Callable[..., Any], x: Any, **rule: Any) -> bool:
    """Whether ``check`` (:func:`number`, :func:`integer`, :func:`positive`) accepts ``x`` under ``rule``: for a
    caller that words its own refusal (a mix's counts, a rate) but decides by the same rules."""
    try:
        check(x, "value", **rule)
    except ConfigError:
        return False
    return True
