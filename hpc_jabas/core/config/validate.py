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

Text (a flag, an environment variable, a field of a spec such as ``v100:4``) becomes a number here too, in one
place: :func:`parse_int` and :func:`parse_ints`, with the same line (``where`` and an example may follow).

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


def _int_rule(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"an integer in {lo}..{hi}"
    bounds = _range_text(lo, hi, False, False, "d")
    return "an integer" + (" " + bounds if bounds else "")


#: text that :func:`parse_int` (and :func:`integer` with ``digits``) reads as an integer: decimal digits, a sign,
#: blanks around them; at most 30 digits (a longer one is out of any range this package checks, and ``int()`` of
#: thousands of digits is refused by Python itself)
_INT_TEXT = re.compile(r"\s*[-+]?[0-9]{1,30}\s*")


def integer(x: Any, what: str, *, lo: int | None = None, hi: int | None = None, whole_float: bool = True,
            digits: bool = False) -> int:
    """``x`` as an int, checked: an integer (or, with ``whole_float``, an integral float; with ``digits``, a
    string of decimal digits such as a flag's "60") within the closed bounds."""
    v: int | None = None
    if digits and isinstance(x, str) and _INT_TEXT.fullmatch(x):
        v = int(x)
    elif isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        v = int(x)
    elif whole_float and isinstance(x, (float, np.floating)) and math.isfinite(float(x)) and float(x).is_integer():
        v = int(x)
    if v is None or (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ConfigError(f"{what}={x!r} is invalid; it must be {_int_rule(lo, hi)}")
    return v


def parse_int(text: Any, what: str, *, lo: int | None = None, hi: int | None = None, where: str = "",
              hint: str = "") -> int:
    """Text (a flag, an environment variable, a field of a spec such as ``v100:4``) as an int within the closed
    bounds: decimal digits, an optional sign, blanks around them. Otherwise one line::

        <what>=<the text> [<where>] is invalid; it must be an integer [<bounds>][; <hint>]

    (``where``: where the text came from, e.g. "in the environment"; ``hint``: an example of a good value;
    a text longer than 40 characters is shown cut)."""
    t = str(text)
    v = int(t) if _INT_TEXT.fullmatch(t) else None
    if v is None or (lo is not None and v < lo) or (hi is not None and v > hi):
        shown = t if len(t) <= 40 else t[:36] + "..."
        raise ConfigError(f"{what}={shown!r}{' ' + where if where else ''} is invalid; it must be "
                          f"{_int_rule(lo, hi)}{'; ' + hint if hint else ''}")
    return v


def parse_ints(text: Any, what: str, *, lo: int | None = None, hi: int | None = None, hint: str = "") -> list[int]:
    """A comma-separated list of integers (``1,2,4,8``; blanks and empty items ignored), each read by
    :func:`parse_int` as ``<what> value``; a list with no item is refused in one line too."""
    out = [parse_int(part, f"{what} value", lo=lo, hi=hi, hint=hint) for part in str(text).split(",") if part.strip()]
    if not out:
        raise ConfigError(f"{what}={str(text)!r} is invalid; it must be a list of at least one integer"
                          f"{'; ' + hint if hint else ''}")
    return out


def passes(check: Callable[..., Any], x: Any, **rule: Any) -> bool:
    """Whether ``check`` (:func:`number`, :func:`integer`, :func:`positive`) accepts ``x`` under ``rule``: for a
    caller that words its own refusal (a mix's counts, a rate) but decides by the same rules."""
    try:
        check(x, "value", **rule)
    except ConfigError:
        return False
    return True
