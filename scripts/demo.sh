#!/usr/bin/env bash
# `make demo`: (1) a 3-rank heterogeneous Horovod run (mpirun; torch.distributed where set-up went on without Horovod) on three emulated GPU types with
# adaptive batching (similarity policy) and online rebalancing after an injected slowdown,
# training on scikit-learn's digits, printing per-rank throughput and drawing the report PNG;
# (2) the Slurm lifecycle on the local cluster (when slurm/local is available): a job submitted
# from Python onto a partition mix, moved at an epoch end to another mix, the chain printed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# the venv scripts/setup.sh made (with HPC_JABAS_SIMULATE_HOROVOD_FAILURE=1: its own, without Horovod; as setup.sh)
CACHE="${HPC_JABAS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpc-jabas}"
if [[ "${HPC_JABAS_SIMULATE_HOROVOD_FAILURE:-0}" == 1 ]]; then
  VENV="${HPC_JABAS_VENV:-$CACHE/venv-no-horovod-$(echo "$ROOT" | sha256sum | cut -c1-8)}"
else
  VENV="${HPC_JABAS_VENV:-$ROOT/.venv}"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1 OMPI_MCA_mpi_yield_when_idle=1
RUN="${HPC_JABAS_DEMO_DIR:-runs/demo-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$RUN"
echo "== 1. mpirun: 3 ranks emulating v100, p100, rtx2060; adaptive B (similarity, JABAS's defaults"
echo "      gamma = 0.1 and a +-10% step; p = 4 for digits' short epochs; cosine lr); rank 0 slowed 3x"
echo "      from iteration 60 (injected), rebalanced online; run dir $RUN"
mpirun --oversubscribe -np 3 --bind-to none "$VENV"/bin/python examples/train_digits.py \
  --emulate --gpu-types v100,p100,rtx2060 --batch 32 --batch-min 32 --batch-max 512 \
  --policy similarity --p 4 --cosine --balance reactive --p-balance 5 \
  --slowdown 0:factor=3,start=60 --epochs 12 --run-dir "$RUN" --summary "$RUN/summary.json" 2>&1 \
  | { grep -v "EMULATES" || true; }   # pipefail: a failed mpirun fails the demo
"$VENV"/bin/python - "$RUN" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
its = [r for r in recs if r["type"] == "iteration"]
print("B over the run:", " -> ".join(str(b) for i, b in enumerate(r["B"] for r in its) if i == 0 or b != its[i - 1]["B"]))
print("B at the epoch ends:", [r["B"] for r in recs if r["type"] == "epoch_end"])
for r in recs:
    if r["type"] == "balance" and not r["info"].get("kept", True):
        how = "rebalanced" if r["info"].get("reason", "").find("batch-size") < 0 else "re-planned with the new B"
        print(f"{how} at iteration {r['it']}: measured speed factors "
              f"{[round(x, 2) if x else x for x in r['measured']]} -> plan {r['plan']}")
PY
"$VENV"/bin/hpc-jabas report "$RUN"
if [[ -x slurm/local/up.sh && -f scripts/demo_slurm.py ]]; then
  echo "== 2. Slurm: submit onto a partition mix, auto-scale at the epoch end, resubmit, resume"
  bash slurm/local/up.sh
  "$VENV"/bin/python scripts/demo_slurm.py "$RUN/slurm"
fi
