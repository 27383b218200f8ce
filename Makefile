# The README's two commands: `make demo` and `make test`. Both do all set-up themselves.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
# mypy's and ruff's caches live with the Horovod wheel (scripts/setup.sh), so a fresh clone reuses them
CACHE := $(or $(HPC_JABAS_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/hpc-jabas)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
export OMPI_MCA_mpi_yield_when_idle := 1
export PYTHONUNBUFFERED := 1

.PHONY: setup lint test demo bench slurm-up slurm-down clean

setup:
	@bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check --cache-dir $(CACHE)/ruff hpc_jabas tests bench scripts examples
	$(VENV)/bin/mypy --cache-dir $(CACHE)/mypy hpc_jabas

# Three pytest-xdist workers on two cores (19:51 and 24:10 with three, 23:10 with two, 22:21 with four: within
# the spread; the suite is CPU-bound, docs/toolchain.md). The Slurm tests share the cluster under a lock
# (tests/conftest.py).
# --durations=15 prints the slowest 15 tests.
TEST_WORKERS ?= 3

test: lint
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS) --dist loadgroup --durations=15 tests

demo: setup
	@bash scripts/demo.sh

# the benchmarks, each run as a module from the repository root (bench/common/ holds what they share); results
# and protocols: bench/RESULTS.md
BENCHES := straggler adaptive_tta perfmodel_error perfmodel_error_emulated interference autoscale_search \
           planner_speed overhead simulate_scale sim_validation sim_validation_chain input_pipeline faults \
           resubmit_latency horovod_spin sim_fixed_grid measure_cost branch_probe adaptive_experiments \
           compile_recompiles
bench: setup
	@for b in $(BENCHES); do echo "== bench.$$b"; $(PY) -m bench.$$b || exit 1; done

slurm-up:
	@bash slurm/local/up.sh

slurm-down:
	@bash slurm/local/down.sh

# the shared environment and the Horovod wheel stay in $(CACHE) (scripts/setup.sh)
clean:
	rm -rf $(VENV) runs .pytest_cache
