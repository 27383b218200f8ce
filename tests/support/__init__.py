"""Fixtures that both the tests and the benchmarks use.

The tests import them as ``support.NAME`` (tests/conftest.py puts tests/ on sys.path); the benchmarks, which run
from the repository root as ``python -m bench.NAME``, as ``tests.support.NAME``. The modules import nothing from
the rest of tests/.
"""
