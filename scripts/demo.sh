#!/usr/bin/env bash
# `make demo`: a 3-rank heterogeneous Horovod run (mpirun) on three emulated GPU types,
# training on scikit-learn's digits, printing per-rank throughput.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
RUN="runs/demo-$(date +%Y%m%d-%H%M%S)"
echo "== hpc-jabas demo: 3 ranks (mpirun) emulating v100, p100, rtx2060; run dir $RUN"
mpirun --oversubscribe -np 3 --bind-to none .venv/bin/python examples/train_digits.py \
  --emulate --gpu-types v100,p100,rtx2060 --batch 128 --epochs 8 --run-dir "$RUN" \
  --summary "$RUN/summary.json"
