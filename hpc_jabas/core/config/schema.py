"""Typed config fields: declaration (:func:`key`: default, help, constraints and section as field metadata),
normalising a value when it is assigned (:class:`Section`), checking a dataclass's values
(:func:`check_fields`), and their TOML text.

The generic half of :mod:`hpc_jabas.core.config.sections`, which declares the job's sections with it. Every
problem is one ConfigError line naming the key, the value and what is valid.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Any, Self, TypeVar, overload

from hpc_jabas.core.config.validate import integer, number
from hpc_jabas.errors import ConfigError

_S = TypeVar("_S")


def key(default: Any, help: str, *, choices: Sequence[str] | None = None, lo: float | None = None,
        hi: float | None = None, lo_open: bool = False, hi_open: bool = False, shown: str | None = None,
        metavar: str | None = None, canon: Callable[[Any], Any] | None = None, section: str | None = None) -> Any:
    """A config field: default, help text and constraints (``lo``/``hi`` bounds, each element of a list);
    ``canon`` maps an alias to its canonical name (any other value unchanged) before the checks; ``section``
    names the group the key belongs to (JobConfig's ``[train]``, ... : :func:`in_section`)."""
    # a list or tuple is copied; another sequence is kept as given: a live view (defaults.POLICIES grows with the
    # policy registry)
    live = choices is not None and not isinstance(choices, (list, tuple))
    meta = {"help": help, "choices": (choices if live else tuple(choices)) if choices else None, "lo": lo, "hi": hi,
            "lo_open": lo_open, "hi_open": hi_open, "shown": shown, "metavar": metavar, "canon": canon,
            "section": section}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def in_section(section: str) -> Callable[..., Any]:
    """:func:`key` with ``section`` given: ``_train = in_section("train")``, then ``batch: int = _train(256, ...)``."""
    def declare(default: Any, help: str, **kw: Any) -> Any:
        return key(default, help, section=section, **kw)
    return declare


def key_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of dataclass ``cls`` that are config keys (declared with :func:`key` or :func:`like`), in order."""
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


_UNSET: Any = object()


def like(cls: type, name: str, default: Any = _UNSET, **meta: Any) -> Any:
    """A field declared as ``cls``'s field ``name`` (its help text, bounds, choices: one declaration of a key
    that two files read), with its default unless ``default`` is given, and any metadata in ``meta`` replaced; in
    no section unless ``section`` is given (the section is ``cls``'s grouping)."""
    f = next(x for x in dataclasses.fields(cls) if x.name == name)
    m = {**f.metadata, "section": None, **meta}
    d = default_of(f) if default is _UNSET else default
    if isinstance(d, (dict, list)):
        return field(default_factory=lambda: type(d)(d), metadata=m)
    return field(default=d, metadata=m)


def read_table(cls: type[_S], d: Any, where: str) -> _S:
    """A TOML table as the section dataclass ``cls``: every key checked by its field (one ConfigError line
    naming ``where``, the key, the value and what is valid), unknown keys refused, absent ones their defaults."""
    if d is None:
        d = {}
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where} must be a table, got {d!r}")
    keys = _keys_of(cls)
    bad = sorted(str(k) for k in d if k not in keys)
    if bad:
        near = difflib.get_close_matches(bad[0], list(keys), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{where}: unknown key(s) {', '.join(bad)}{hint}; valid keys: {', '.join(keys)}")
    given = {name: convert(f"{where}: {name}", d[name], tp, m) for name, (tp, m) in keys.items() if name in d}
    return cls(**given)


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
    """One value of type int/float/bool/str, checked against the field's choices and bounds. The numbers are
    checked by core/config/validate.py (the one number checker); this says it in the config's words."""
    given = v
    has_bounds = m["lo"] is not None or m["hi"] is not None
    if tp is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{name}={v!r} must be true or false")
        return v
    if tp is int:
        lo = None if m["lo"] is None else math.floor(m["lo"]) + 1 if m["lo_open"] else math.ceil(m["lo"])
        hi = None if m["hi"] is None else math.ceil(m["hi"]) - 1 if m["hi_open"] else math.floor(m["hi"])
        try:
            v = integer(v, name, lo=lo, hi=hi, whole_float=False)
        except ConfigError:
            raise ConfigError(f"{name}={given!r} must be an integer" + (f" {_bounds_text(m)}" if has_bounds else "")) \
                from None
    if tp is float:
        try:
            v = number(v, name)
        except ConfigError:
            raise ConfigError(f"{name}={given!r} must be a finite number" +
                              (f" {_bounds_text(m)}" if has_bounds else "")) from None
        try:
            number(v, name, lo=m["lo"], hi=m["hi"], lo_open=m["lo_open"], hi_open=m["hi_open"])
        except ConfigError:
            raise ConfigError(f"{name}={given!r} must be {_bounds_text(m)}") from None
    if tp is str and not isinstance(v, str):
        raise ConfigError(f"{name}={v!r} must be a string")
    if m["choices"] and v not in m["choices"]:
        raise ConfigError(f"{name}={v!r} is unknown; valid: {', '.join(m['choices'])}")
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
    canon = m.get("canon")
    if canon is not None:
        v = canon(v)
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


_KEYS: dict[type, dict[str, tuple[Any, Mapping[str, Any]]]] = {}


def _keys_of(cls: type) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    """name -> (type, metadata) of every key of a section dataclass (made once per class)."""
    keys = _KEYS.get(cls)
    if keys is None:
        tps = field_types(cls)
        keys = _KEYS[cls] = {f.name: (tps[f.name], f.metadata) for f in key_fields(cls)}
    return keys


class Freezable:
    """An object that :meth:`freeze` makes refuse every assignment (FrozenInstanceError); its copies (``copy``,
    ``deepcopy``, pickle) are not frozen."""

    def freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)

    @property
    def is_frozen(self) -> bool:
        return bool(self.__dict__.get("_frozen"))

    def _refuse_if_frozen(self, name: str) -> None:
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(f"cannot assign to {name!r}: this configuration is resolved and "
                                                  "frozen; make a changed copy with JobConfig.replace")

    def __delattr__(self, name: str) -> None:
        self._refuse_if_frozen(name)
        object.__delattr__(self, name)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_frozen"}


class Section(Freezable):
    """Base of a dataclass of config keys: a value assigned to a key (in the constructor too) is stored
    normalised when it is valid (an alias as its canonical name, a comma-separated list as a list, an
    int as a float, ...) and as given when it is not, for :func:`check_fields` to name the problem."""

    def __setattr__(self, name: str, value: Any) -> None:
        self._refuse_if_frozen(name)
        tm = _keys_of(type(self)).get(name)
        if tm is not None:
            try:
                value = convert(name, value, *tm)
            except ConfigError:
                pass
        object.__setattr__(self, name, value)


class SectionView:
    """``cfg.train``: the keys of one section of a config dataclass (its fields whose metadata names the section:
    :func:`in_section`), read and written through to the config: ``cfg.train.batch`` is ``cfg.batch``, one value,
    normalised when assigned; a frozen config refuses the write."""

    def __init__(self, obj: Any, section: str) -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_section", section)

    def keys(self) -> list[str]:
        """The section's keys, in their order."""
        return [k for k, (_, m) in _keys_of(type(self._obj)).items() if m["section"] == self._section]

    def _key(self, name: str) -> str:
        if name.startswith("_") or name not in self.keys():
            raise AttributeError(f"[{self._section}] has no key {name!r}; its keys: {', '.join(self.keys())}")
        return name

    def __getattr__(self, name: str) -> Any:      # called for the keys only (_obj and _section are attributes)
        return getattr(self._obj, self._key(name))

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._obj, self._key(name), value)

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.keys()]

    def __repr__(self) -> str:
        return f"[{self._section}] " + ", ".join(f"{k}={getattr(self._obj, k)!r}" for k in self.keys())


class SectionOf:
    """A class attribute named after a section (``JobConfig.train``): on an instance, that section's
    :class:`SectionView`; it cannot be assigned (its keys can)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.section = name

    @overload
    def __get__(self, obj: None, owner: type) -> Self: ...
    @overload
    def __get__(self, obj: Any, owner: type) -> SectionView: ...

    def __get__(self, obj: Any, owner: type) -> SectionView | Self:
        return self if obj is None else SectionView(obj, self.section)

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"{self.section} is a view of its section's keys; assign the keys themselves")


def check_fields(obj: Any, prefix: str = "") -> None:
    """Check every key of a config dataclass: the first bad one is one ConfigError line. The values are
    not changed (a :class:`Section` normalised them when they were assigned)."""
    for name, (tp, m) in _keys_of(type(obj)).items():
        convert(prefix + name, getattr(obj, name), tp, m)


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
