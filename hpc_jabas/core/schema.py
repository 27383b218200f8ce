"""Typed config fields: declaration (:func:`key`: default, help, constraints as field metadata),
checking and normalising a dataclass's values (:func:`check_fields`), and their TOML text.

The generic half of :mod:`hpc_jabas.core.config`, which declares the job's sections with it. Every
problem is one ConfigError line naming the key, the value and what is valid.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from hpc_jabas.errors import ConfigError


def key(default: Any, help: str, *, choices: Sequence[str] | None = None, lo: float | None = None,
        hi: float | None = None, lo_open: bool = False, hi_open: bool = False, shown: str | None = None,
        metavar: str | None = None) -> Any:
    """A config field: default, help text and constraints (``lo``/``hi`` bounds, each element of a list)."""
    meta = {"help": help, "choices": tuple(choices) if choices else None, "lo": lo, "hi": hi,
            "lo_open": lo_open, "hi_open": hi_open, "shown": shown, "metavar": metavar}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def reject_unknown(d: Mapping[str, Any], valid: Sequence[str], what: str) -> None:
    bad = [k for k in d if k not in valid]
    if bad:
        near = difflib.get_close_matches(str(bad[0]), valid, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"unknown {what} {bad[0]!r}{hint}; valid keys: {', '.join(valid)}")


def field_types(cls: type) -> dict[str, Any]:
    return dict(typing.get_type_hints(cls))


def split_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (types.UnionType, typing.Union) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return tp, False


def type_name(tp: Any) -> str:
    base, opt = split_optional(tp)
    name = base.__name__ if isinstance(base, type) and not typing.get_args(base) else str(base)
    return name + (" | None" if opt else "")


def _bounds_text(m: Mapping[str, Any]) -> str:
    lo, hi = m["lo"], m["hi"]
    if lo is not None and hi is not None:
        return f"in {'(' if m['lo_open'] else '['}{lo:g}, {hi:g}{')' if m['hi_open'] else ']'}"
    if lo is not None:
        return f"{'>' if m['lo_open'] else '>='} {lo:g}"
    return f"{'<' if m['hi_open'] else '<='} {hi:g}"


def _scalar(name: str, v: Any, tp: Any, m: Mapping[str, Any]) -> Any:
    """One value of type int/float/bool/str, checked against the field's choices and bounds."""
    given = v
    if tp is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{name}={v!r} must be true or false")
        return v
    if tp is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ConfigError(f"{name}={v!r} must be an integer" + (f" {_bounds_text(m)}" if m["lo"] is not None else ""))
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{name}={v!r} must be a finite number" +
                              (f" {_bounds_text(m)}" if m["lo"] is not None or m["hi"] is not None else ""))
        v = float(v)
    if tp is str and not isinstance(v, str):
        raise ConfigError(f"{name}={v!r} must be a string")
    if m["choices"] and v not in m["choices"]:
        raise ConfigError(f"{name}={v!r} is unknown; valid: {', '.join(m['choices'])}")
    lo, hi = m["lo"], m["hi"]
    if (lo is not None and (v <= lo if m["lo_open"] else v < lo)) or \
            (hi is not None and (v >= hi if m["hi_open"] else v > hi)):
        kind = "an integer " if tp is int else ""
        raise ConfigError(f"{name}={given!r} must be {kind}{_bounds_text(m)}")
    return v


def _mapping_items(name: str, v: Any, metavar: str) -> list[tuple[str, Any]]:
    """Items of a table, or of the flag form ['K:V', ...]."""
    if isinstance(v, Mapping):
        return [(str(k), x) for k, x in v.items()]
    if isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v):
        out = []
        for s in v:
            k, sep, x = s.partition(":")
            if not sep or not k.strip() or not x.strip():
                raise ConfigError(f"{name} item {s!r} must be {metavar}")
            out.append((k.strip(), x.strip()))
        return out
    raise ConfigError(f"{name}={v!r} must be a table, e.g. {name} = {{...}}, or items {metavar}")


def convert(name: str, v: Any, tp: Any, m: Mapping[str, Any]) -> Any:
    """The value of field ``name`` (type ``tp``, metadata ``m``) checked and normalised: a list may be
    given as a comma-separated string, a table as 'K:V' items (the flag forms)."""
    base, opt = split_optional(tp)
    if v is None:
        if opt:
            return None
        raise ConfigError(f"{name} must be set (type {type_name(tp)})")
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin is list:
        if isinstance(v, str):
            text, v = v, [s.strip() for s in v.split(",") if s.strip()]
            if args[0] is float:
                try:
                    v = [float(s) for s in v]
                except ValueError:
                    raise ConfigError(f"{name}={text!r} must be numbers separated by commas, e.g. 1,0.5") from None
        if not isinstance(v, (list, tuple)) or not v:
            raise ConfigError(f"{name}={v!r} must be a non-empty list of {args[0].__name__}, e.g. "
                              f"{m['metavar'] or 'a,b'}")
        return [_scalar(f"{name}[{i}]", x, args[0], m) for i, x in enumerate(v)]
    if origin is dict:
        out: dict[Any, Any] = {}
        for k, x in _mapping_items(name, v, m["metavar"] or "KEY:VALUE"):
            if args[0] is int:
                if not k.isdigit():
                    raise ConfigError(f"{name} key {k!r} must be a rank number, e.g. 0")
                out[int(k)] = _scalar(f"{name}[{k}]", x, args[1], m)
            else:
                out[k] = _scalar(f"{name}[{k}]", x, args[1], m)
        return out
    return _scalar(name, v, base, m)


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check and normalise every field of a section dataclass in place (one ConfigError line)."""
    tps = field_types(type(obj))
    for f in dataclasses.fields(obj):
        setattr(obj, f.name, convert(prefix + f.name, getattr(obj, f.name), tps[f.name], f.metadata))

def default_of(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def toml_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_text(x)}" for k, x in v.items()) + "}"
    return repr(v)


def default_text(f: dataclasses.Field[Any]) -> str:
    d = default_of(f)
    return f.metadata["shown"] if d is None and f.metadata["shown"] else toml_text(d) if d is not None else "none"
