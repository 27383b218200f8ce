"""The one loader of "module:callable" names: training tasks, profiled models, job entry points.

    fn = load_callable("examples.train_digits:build", "task")       # -> the function, not called

The module is imported with the current directory importable (as with ``python -m``); the
callable may be dotted (``module:Class.method``). Every problem is one ConfigError line that
starts with ``{what} {spec!r}`` and says what is valid.
"""
from __future__ import annotations

import importlib
import os
import sys
import typing
from collections.abc import Callable
from typing import Any

from hpc_jabas.errors import ConfigError


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and message, whitespace folded."""
    return " ".join(f"{type(e).__name__}: {e}".split())


def load_callable(spec: str, what: str = "task", example: str = "examples.train_digits:build") -> Callable[..., Any]:
    """The callable named by ``module:callable``."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ConfigError(f"{what} {spec!r} must be MODULE:CALLABLE, e.g. {example}")
    mod_name, attr = spec.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:
        raise ConfigError(f"{what} {spec!r}: cannot import module {mod_name!r} ({one_line(e)}); "
                          f"give an importable MODULE:CALLABLE, e.g. {example}") from e
    obj: Any = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {spec!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{what} {spec!r}: {attr!r} is a {type(obj).__name__}, not a callable")
    return typing.cast(Callable[..., Any], obj)
