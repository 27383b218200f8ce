"""The profiler's public names in one place (``from hpc_jabas.runtime import profiler``).

The code lives in :mod:`hpc_jabas.runtime.profiling` (see its docstring for what is measured
and how): loading, timing, memory probing, allreduce fitting, profiles, the whole run.
"""
from __future__ import annotations

from hpc_jabas.core.loader import load_callable
from hpc_jabas.runtime.profiling.allreduce import fit_allreduce, measure_allreduce
from hpc_jabas.runtime.profiling.compute import ComputeMeasurement, measure_compute, measured_profile
from hpc_jabas.runtime.profiling.defaults import DEFAULT_ALLREDUCE_SIZES, DEFAULT_B_LIMIT, DEFAULT_B_LIST, OPTIMIZERS
from hpc_jabas.runtime.profiling.emulated import EmulationOverhead, emulated_profile, measure_emulation_overhead
from hpc_jabas.runtime.profiling.load import (
    ModelBundle,
    check_bundle,
    grad_bytes,
    load_model,
    make_optimizer,
)
from hpc_jabas.runtime.profiling.memory import estimate_bytes, max_b_from_memory, probe_max_b_cuda, search_max_b
from hpc_jabas.runtime.profiling.run import ProfileResult, parse_types, run_profile

__all__ = [
    "DEFAULT_ALLREDUCE_SIZES", "DEFAULT_B_LIMIT", "DEFAULT_B_LIST", "OPTIMIZERS", "ComputeMeasurement",
    "EmulationOverhead", "ModelBundle", "ProfileResult", "check_bundle", "emulated_profile", "estimate_bytes",
    "fit_allreduce", "grad_bytes", "load_callable", "load_model", "make_optimizer", "max_b_from_memory",
    "measure_allreduce", "measure_compute", "measure_emulation_overhead", "measured_profile", "parse_types",
    "probe_max_b_cuda", "run_profile", "search_max_b",
]
