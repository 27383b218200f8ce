"""A test's optional package: skipped on a developer's machine without it, but in CI (``CI`` set, as .ci/run sets
it) imported outright, so that a missing package fails the run instead of hiding behind a skip: set-up
(scripts/setup.sh) installs every package a test needs."""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def need(name: str) -> ModuleType:
    """``name`` imported; outside CI a skip when it is missing, in CI the ImportError (a missing set-up step)."""
    if os.environ.get("CI"):
        return importlib.import_module(name)
    return pytest.importorskip(name)
