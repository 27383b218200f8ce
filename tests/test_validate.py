"""The core's one set of number checks (hpc_jabas/core/config/validate.py): what passes, what is refused, the line
said."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hpc_jabas
from hpc_jabas.core.config import validate as V
from hpc_jabas.errors import ConfigError

LINE = re.compile(r"^(?P<what>[^=]+)=(?P<val>.+) is invalid; it must be (?P<rule>.+)$")


def _refusal(fn, *a, **k) -> re.Match:
    with pytest.raises(ConfigError) as e:
        fn(*a, **k)
    m = LINE.match(str(e.value))
    assert m, str(e.value)
    return m


@given(st.floats(allow_nan=False, allow_infinity=False), st.floats(-1e6, 1e6), st.floats(0, 1e6))
def test_number_keeps_a_value_inside_its_bounds_and_names_it_outside(x, lo, width):
    hi = lo + width
    if lo <= x <= hi:
        assert V.number(x, "w", lo=lo, hi=hi) == x
    else:
        m = _refusal(V.number, x, "w", lo=lo, hi=hi)
        assert m["what"] == "w" and m["val"] == repr(x) and m["rule"] == f"a finite number in [{lo:g}, {hi:g}]"


@pytest.mark.parametrize("bad", [True, False, np.bool_(True), "3", b"3", 1 + 2j, None, [1.0], math.nan, math.inf,
                                 -math.inf, np.float64("nan")])
def test_number_refuses_what_is_not_a_finite_real(bad):
    assert _refusal(V.number, bad, "x")["rule"] == "a finite number"


def test_bounds_open_and_closed_are_spelt_as_they_are_checked():
    assert V.number(0.0, "t", lo=0.0) == 0.0
    assert _refusal(V.number, 0.0, "t", lo=0.0, lo_open=True)["rule"] == "a finite number > 0"
    assert _refusal(V.positive, -1, "speed")["rule"] == "a finite number > 0"
    assert _refusal(V.number, 1.0, "f", lo=0.0, hi=1.0, hi_open=True)["rule"] == "a finite number in [0, 1)"
    assert _refusal(V.number, 2.0, "f", hi=1.0)["rule"] == "a finite number <= 1"
    assert V.number(math.inf, "cap", finite=False) == math.inf
    assert _refusal(V.number, math.nan, "cap", finite=False)["rule"] == "a number"
    assert V.number(np.float32(0.5), "f", lo=0.0, hi=1.0) == 0.5 and type(V.number(np.int64(3), "n")) is float


@given(st.integers(-10**12, 10**12), st.integers(-100, 100), st.integers(0, 200))
def test_integer_keeps_an_integer_inside_its_bounds_and_names_it_outside(x, lo, width):
    hi = lo + width
    for given_as in (x, float(x), np.int64(x)):
        if lo <= x <= hi:
            got = V.integer(given_as, "n", lo=lo, hi=hi)
            assert got == x and type(got) is int
        else:
            assert _refusal(V.integer, given_as, "n", lo=lo, hi=hi)["rule"] == f"an integer in {lo}..{hi}"


@pytest.mark.parametrize("bad", [True, np.bool_(False), 2.5, "2", math.inf, math.nan, None, 1 + 0j])
def test_integer_refuses_what_is_not_an_integer(bad):
    assert _refusal(V.integer, bad, "n", lo=1)["rule"] == "an integer >= 1"


def test_is_number_is_the_same_test_everywhere():
    assert V.is_number(1) and V.is_number(np.float32(2)) and V.is_number(math.inf) and V.is_number(math.nan)
    assert not V.is_number(math.nan, nan=False) and not V.is_number(True) and not V.is_number("1")


def test_no_core_module_keeps_a_private_number_check_of_its_own():
    """The checks that used to be private copies, each with its own rules, are not written again."""
    core = Path(V.__file__).parent
    old = re.compile(r"^def (is_num|_is_number|check_num|check_int|int_param|float_param|check_speed|_pos|_pos_int|"
                     r"_positive|_check_int|_int_at_least|_num)\(", re.M)
    found = [f"{p.relative_to(core)}: {m[1]}" for p in core.rglob("*.py") for m in old.finditer(p.read_text())]
    assert not found, found


def test_parse_int_reads_text_and_names_a_bad_one_in_one_line():
    assert V.parse_int(" 42 ", "--epochs", lo=1) == 42 and V.parse_int("-3", "n") == -3 and V.parse_int("+7", "n") == 7
    for bad, rule in [("x", "an integer >= 1"), ("1.5", "an integer >= 1"), ("", "an integer >= 1"),
                      ("0", "an integer >= 1"), ("1e3", "an integer >= 1")]:
        m = _refusal(V.parse_int, bad, "--epochs", lo=1)
        assert (m["what"], m["val"], m["rule"]) == ("--epochs", repr(bad), rule)
    assert _refusal(V.parse_int, "65", "--ranks", lo=1, hi=64)["rule"] == "an integer in 1..64"
    with pytest.raises(ConfigError) as e:                  # thousands of digits: refused, shown cut, no traceback
        V.parse_int("9" * 5000, "--batch", lo=1, hi=10)
    assert str(e.value) == f"--batch='{'9' * 36}...' is invalid; it must be an integer in 1..10"
    with pytest.raises(ConfigError) as e:
        V.parse_int("v", "SLURM_NTASKS", lo=1, where="in the environment", hint="Slurm sets it")
    assert str(e.value) == "SLURM_NTASKS='v' in the environment is invalid; it must be an integer >= 1; Slurm sets it"
    assert V.parse_ints("1, 2,,8", "--b-list", lo=1) == [1, 2, 8]
    m = _refusal(V.parse_ints, "1,x", "--b-list", lo=1)
    assert (m["what"], m["val"], m["rule"]) == ("--b-list value", "'x'", "an integer >= 1")
    assert _refusal(V.parse_ints, " , ", "--b-list", lo=1, hint="e.g. 1,2,4,8")["rule"] == \
        "a list of at least one integer; e.g. 1,2,4,8"


#: the modules whose text-to-integer parsing goes through validate.parse_int / parse_ints (no private parser)
TEXT_PARSERS = ["slurm/env.py", "slurm/components.py", "cli/simulate.py", "cli/plan.py", "cli/profile.py",
                "core/planning/plan.py"]


@pytest.mark.parametrize("rel", TEXT_PARSERS)
def test_no_private_text_to_int_parser(rel):
    """No ``int(...)`` under a ``try`` that catches ValueError, and no ``str.isdigit()`` test: a text becomes an
    integer through core/config/validate.py only."""
    import ast
    tree = ast.parse((Path(hpc_jabas.__file__).parent / rel).read_text())
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Try) and any(h.type is not None and "ValueError" in ast.unparse(h.type)
                                          for h in n.handlers):
            found += [ast.unparse(c) for st in n.body for c in ast.walk(st)
                      if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "int"]
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "isdigit":
            found.append(ast.unparse(n))
    assert found == [], f"{rel} parses text itself: {found}"
