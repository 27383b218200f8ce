#!/usr/bin/env bash
# GPU readiness check for a bare CUDA machine (root, Python 3, pip to PyPI; no compiler needed): at most
# 8 minutes, install included. The trainer runs on the torch backend (backend = "torch": NCCL on CUDA).
#
#   bash scripts/gpu_check.sh [--cpu] [--horovod] [OUT_DIR]          (default OUT_DIR: runs/gpu-check)
#
#   --cpu      no install, no GPU: the same Python checks on the CPU with this checkout's .venv (or $PYTHON);
#              tests/test_gpu_check.py runs it so that the script's logic is tested where no GPU is
#   --horovod  an optional last step: build Horovod 0.28.1 with NCCL (needs a compiler; time-boxed to 4 min)
#   --only=info,equiv,...  run only these python steps (the others say skipped)
#   PYTHON=... use this interpreter (its torch must see CUDA) instead of installing into $HJ_GPU_VENV
#
# Steps (each prints one "gpu_check: ..." line; the python ones come from scripts/gpu_check.py):
#   1. install: none when python3's torch already sees CUDA; else a virtual environment (HJ_GPU_VENV, default
#      /opt/hj-gpu-venv; the system python when venv is missing) with the CUDA torch wheel from PyPI
#      (torch==2.13.0) and numpy
#   2. info: torch, CUDA, the devices
#   3. equiv: 2 ranks (torchrun) against one big batch on the GPU (2 ranks share one device if only one)
#   4. nccl: one rank on NCCL against the same reference
#   4b. stats: the half-batch statistics through the DDP reducer (similarity measuring every iteration)
#   5. timing: CUDA events, the optimizer step inside its own iteration
#   6. amp: bf16 and fp16 (loss scaling)
#   7. oom: the profiler's out-of-memory probe under a memory cap
#   8. horovod (only with --horovod)
# The last line holds key=value pairs: every step's ok flag and its main figures.
set -uo pipefail
cd "$(dirname "$0")/.."
CPU=0 HOROVOD=0 OUT=runs/gpu-check ONLY=""
STEPS="info equiv nccl stats timing amp oom"
for a in "$@"; do
  case $a in
    --cpu) CPU=1 ;;
    --horovod) HOROVOD=1 ;;
    --only=*) ONLY=" ${a#--only=} "; ONLY=${ONLY//,/ }
              for s in $ONLY; do [[ " $STEPS " == *" $s "* ]] || { echo "gpu_check: --only: unknown step $s; valid: ${STEPS// /,}"; exit 2; }; done ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown flag $a; valid: --cpu, --horovod, --only=STEP[,STEP], OUT_DIR"; exit 2 ;;
    *) OUT=$a ;;
  esac
done
START=$(date +%s)
say() { echo "gpu_check: $*"; }
since() { echo $(( $(date +%s) - $1 )); }
cuda_ok() { "$1" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }
mkdir -p "$OUT" && rm -f "$OUT"/*.json
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
SUMMARY=()

# ---- 1. install ----------------------------------------------------------------------------------------
T=$(date +%s)
if (( CPU )); then
  PY=${PYTHON:-.venv/bin/python}; [[ -x $PY ]] || PY=python3
  say "install skipped (--cpu): $PY"; SUMMARY+=("install=skipped")
else
  PY=${PYTHON:-}
  # a machine whose python3 already holds a CUDA torch (a site's module, a lent GPU machine that reaches no
  # registry) is used as it is: nothing to install
  if [[ -z $PY ]] && cuda_ok python3; then PY=python3; fi
  if [[ -z $PY ]]; then
    VENV=${HJ_GPU_VENV:-/opt/hj-gpu-venv}
    if [[ -x $VENV/bin/python ]] || python3 -m venv "$VENV" >"$OUT/venv.log" 2>&1; then
      PY=$VENV/bin/python
    else
      PY=python3; say "no venv module ($(tail -n 1 "$OUT/venv.log")); installing into the system python"
    fi
  fi
  rc=0
  if ! cuda_ok "$PY"; then
    pip_args=(-m pip install -q --disable-pip-version-check --no-input torch==2.13.0 numpy)
    timeout 420 "$PY" "${pip_args[@]}" >"$OUT/install.log" 2>&1 \
      || timeout 420 "$PY" "${pip_args[@]}" --break-system-packages >>"$OUT/install.log" 2>&1 || rc=$?
  fi
  say "install rc=$rc python=$PY in $(since "$T") s (log: $OUT/install.log)"; SUMMARY+=("install_rc=$rc install_s=$(since "$T")")
  if ! cuda_ok "$PY"; then
    say "no CUDA device visible to $PY's torch"; echo "cuda=0 ${SUMMARY[*]} total_s=$(since "$START")"; exit 2
  fi
fi

# ---- 2..7. the python checks ----------------------------------------------------------------------------
run_step() {   # NAME TIMEOUT_S [launcher words...]: one line from scripts/gpu_check.py, its log in OUT/NAME.log
  local name=$1 limit=$2; shift 2
  if [[ -n $ONLY && $ONLY != *" $name "* ]]; then say "$name skipped (--only)"; SUMMARY+=("${name}=skipped"); return; fi
  local t; t=$(date +%s)
  timeout "$limit" "$@" scripts/gpu_check.py "$name" "$OUT" >"$OUT/$name.out" 2>"$OUT/$name.log"
  local rc=$? line
  line=$(grep '^gpu_check: ' "$OUT/$name.out" | tail -n 1)
  [[ -n $line ]] || line="gpu_check: $name ok=0 rc=$rc (no result; see $OUT/$name.log: $(tail -n 1 "$OUT/$name.log"))"
  echo "$line (${name} $(since "$t") s)"
  local ok; ok=$(sed -n 's/.* ok=\([01]\).*/\1/p' <<<"$line"); SUMMARY+=("${name}_ok=${ok:-0}")
}
run_step info 60 "$PY"
run_step equiv 180 "$PY" -m torch.distributed.run --standalone --nproc_per_node=2
run_step nccl 120 "$PY"
run_step stats 120 "$PY"
run_step timing 120 "$PY"
run_step amp 150 "$PY"
run_step oom 150 "$PY"
# the main figures of the steps, from their JSON files
FIG=$("$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
keys = {"info": ["gpu", "torch", "devices"], "equiv": ["backend", "max_rel_err"], "nccl": ["backend", "max_rel_err"],
        "stats": ["reducer", "measured", "B"],
        "timing": ["events", "slow_iter_s", "next_compute_s"], "amp": ["bf16_loss", "fp16_loss"], "oom": ["max_b"]}
out = []
for step, ks in keys.items():
    f = Path(sys.argv[1]) / f"{step}.json"
    d = json.loads(f.read_text()) if f.exists() else {}
    for k in ks:
        if k in d:
            v = d[k]
            out.append(f"{step}_{k}={v:.3g}" if isinstance(v, float) else f"{step}_{k}={v}")
print(" ".join(out))
EOF
)

# ---- 8. optional: Horovod with NCCL (a compile) ----------------------------------------------------------
if (( HOROVOD )); then
  T=$(date +%s)
  hvd_nccl() { "$PY" -c "import horovod.torch as h,sys; sys.exit(0 if h.nccl_built() else 1)" >/dev/null 2>&1; }
  if ! hvd_nccl; then
    WRAP=$(mktemp -d); printf '#!/bin/sh\nexec g++ "$@" -std=c++17\n' >"$WRAP/g++17"; chmod +x "$WRAP/g++17"
    env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CPU_OPERATIONS=GLOO CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        CXX="$WRAP/g++17" MAKEFLAGS="-j$(nproc)" \
        timeout 240 "$PY" -m pip install -q --no-build-isolation --no-deps --no-cache-dir horovod==0.28.1 \
        >"$OUT/horovod-build.log" 2>&1 || true
  fi
  if hvd_nccl; then H=1; else H=0; fi
  say "horovod ok=$H (Horovod 0.28.1 with NCCL; log: $OUT/horovod-build.log) in $(since "$T") s"
  SUMMARY+=("horovod_ok=$H")
else
  SUMMARY+=("horovod=skipped")
fi
echo "cuda=$(( 1 - CPU )) ${SUMMARY[*]} $FIG total_s=$(since "$START")"
