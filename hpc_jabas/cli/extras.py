"""The optional extras of the pip package (pyproject.toml's [project.optional-dependencies]) and the one-line
refusal of a command that needs a missing one. The base install trains, submits and resumes without any of them.

- ``report``: matplotlib, for ``hpc-jabas report``'s pictures;
- ``forecast``: scikit-learn, whose Gaussian process the auto-scaler's forecast uses where it is installed (without
  it the same model is fitted in numpy, core/autoscale/forecast.py);
- ``examples``: pillow and scikit-learn, for the example scripts' data (JPEG files, the digits data set).
"""
from __future__ import annotations

import importlib.util

from hpc_jabas.errors import ConfigError

#: extra -> (import name, pip distribution) of what it brings
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "report": (("matplotlib", "matplotlib"),),
    "forecast": (("sklearn", "scikit-learn"),),
    "examples": (("PIL", "pillow"), ("sklearn", "scikit-learn")),
}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(extra: str) -> list[str]:
    """The pip distributions of ``extra`` that are not installed."""
    return [dist for mod, dist in EXTRAS[extra] if not installed(mod)]


def require(extra: str, what: str) -> None:
    """ConfigError (one line naming the pip extra) when ``what`` (a command) needs ``extra`` and it is missing."""
    lack = missing(extra)
    if lack:
        raise ConfigError(f"{what} needs {' and '.join(lack)}, which is not installed: "
                          f"pip install 'hpc-jabas[{extra}]'")
