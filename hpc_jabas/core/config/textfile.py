"""Reading an input file as text: every way it can be unreadable is one ConfigError line naming the file and
what was expected (the CLI prints it and exits 2).

A missing file, a directory where a file belongs, no permission, an I/O error, bytes that are not UTF-8 (a
binary file, another encoding) and, for :func:`read_toml` and :func:`read_json`, a file that does not parse.
"""
from __future__ import annotations

import json
import os
import tomllib
from typing import Any

from hpc_jabas.errors import ConfigError


def unreadable(path: str | os.PathLike[str], what: str, expected: str, e: BaseException) -> ConfigError:
    """The one line for ``e`` (an OSError or UnicodeDecodeError met reading ``path``)."""
    p = os.fspath(path)
    if isinstance(e, FileNotFoundError):
        why = "does not exist"
    elif isinstance(e, IsADirectoryError):
        why = "is a directory"
    elif isinstance(e, NotADirectoryError):
        why = "does not exist (a part of its path is a file)"
    elif isinstance(e, UnicodeDecodeError):
        bad = e.object[e.start:e.start + 1] if isinstance(e.object, (bytes, bytearray)) else b""
        byte = f"byte 0x{bad[0]:02x}" if bad else "a byte"
        why = f"is not UTF-8 text ({byte} at offset {e.start}; a binary file or another encoding?)"
    elif isinstance(e, OSError):
        why = f"cannot be read ({e.strerror or type(e).__name__})"
    else:
        why = f"cannot be read ({type(e).__name__})"
    return ConfigError(f"{what} {p!r} {why}; expected {expected}")


def read_text(path: str | os.PathLike[str], what: str = "file", expected: str = "a UTF-8 text file") -> str:
    """The file's text; ConfigError (one line) when it is missing, a directory, unreadable or not UTF-8."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise unreadable(path, what, expected, e) from None


def read_toml(path: str | os.PathLike[str], what: str = "config file", expected: str = "a TOML file") -> dict[str, Any]:
    """A TOML file as a dict; ConfigError (one line) when it cannot be read or is not valid TOML."""
    text = read_text(path, what, expected)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = " ".join(str(e).split())
        raise ConfigError(f"{what} {os.fspath(path)!r} is not valid TOML ({msg}); expected {expected}") from None


def read_json(path: str | os.PathLike[str], what: str = "file", expected: str = "a JSON file") -> Any:
    """A JSON file's value; ConfigError (one line) when it cannot be read or is not valid JSON."""
    text = read_text(path, what, expected)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} {os.fspath(path)!r} is not valid JSON ({e.msg} at line {e.lineno}); "
                          f"expected {expected}") from None
