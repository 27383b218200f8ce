#!/usr/bin/env bash
# GPU readiness check, for a CUDA machine; about 10 minutes at most.
#   bash scripts/gpu_check.sh [OUT_DIR]        (PYTHON=... to pick the interpreter; default: the
#                                               venv's if its torch sees CUDA, else python3)
# 1. Horovod 0.28.1 with NCCL: imported if present, else built as a wheel (HOROVOD_GPU_OPERATIONS=NCCL,
#    the C++17 and CMake-policy fixes of docs/toolchain.md), time-boxed to 6 minutes.
# 2. The profiler's CUDA path: `hpc-jabas profile` on ResNet-18 with CUDA events and the
#    out-of-memory probe (the largest micro-batch that fits), written to OUT_DIR/profile.
# 3. ResNet-18 (examples/train_resnet.py) on generated JPEG files with DataLoader workers, one GPU,
#    AMP bf16 and then fp16 (GradScaler), one epoch each: samples/s, loss, peak GPU memory.
# Every step prints one "gpu_check: ..." line; the last line sums up as key=value pairs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/gpu-check}
mkdir -p "$OUT"
say() { echo "gpu_check: $*"; }
cuda_ok() { "$1" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  for cand in .venv/bin/python python3; do
    if command -v "$cand" >/dev/null 2>&1 && cuda_ok "$cand"; then PY=$cand; break; fi
  done
fi
if [[ -z "$PY" ]] || ! cuda_ok "$PY"; then
  say "no Python whose torch sees a CUDA device (set PYTHON=...)"; echo "cuda=0"; exit 2
fi
"$PY" -c "import torch; p=torch.cuda.get_device_properties(0); print('gpu_check: torch', torch.__version__, \
'cuda', torch.version.cuda, '|', p.name, f'{p.total_memory/2**30:.0f} GiB')"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# ---- 1. Horovod with NCCL ------------------------------------------------------------------
hvd_nccl() { "$PY" -c "import horovod.torch as h,sys; sys.exit(0 if h.nccl_built() else 1)" >/dev/null 2>&1; }
if ! hvd_nccl; then
  say "building Horovod 0.28.1 with NCCL (time-boxed: 6 minutes)"
  WRAP=$(mktemp -d); printf '#!/bin/sh\nexec g++ "$@" -std=c++17\n' > "$WRAP/g++17"; chmod +x "$WRAP/g++17"
  env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CPU_OPERATIONS=GLOO CMAKE_POLICY_VERSION_MINIMUM=3.5 \
      CXX="$WRAP/g++17" MAKEFLAGS="-j$(nproc)" \
      timeout 360 "$PY" -m pip install -q --force-reinstall --no-build-isolation --no-deps --no-cache-dir horovod==0.28.1 \
      > "$OUT/horovod-build.log" 2>&1 || true
fi
if hvd_nccl; then HVD=1; say "Horovod with NCCL: yes"; else HVD=0; say "Horovod with NCCL: no (see $OUT/horovod-build.log)"; fi
"$PY" -c "import horovod.torch" >/dev/null 2>&1 || { say "no Horovod at all: the trainer cannot run"; echo "cuda=1 horovod=0"; exit 1; }

# ---- 2. the profiler's CUDA path -------------------------------------------------------------
T0=$(date +%s)
timeout 180 "$PY" -m hpc_jabas.cli.main profile --model examples.train_resnet:profile_bundle --device cuda \
    --b-list 16,32,64,128 --repeats 5 --optimizer sgd --b-limit 4096 --out "$OUT/profile" > "$OUT/profile.log" 2>&1
PROF_RC=$?
say "profile rc=$PROF_RC in $(( $(date +%s) - T0 )) s"; tail -n 5 "$OUT/profile.log"

# ---- 3. ResNet-18 with AMP on one GPU --------------------------------------------------------
res=()
for amp in bf16 fp16; do
  T0=$(date +%s)
  timeout 150 "$PY" examples/train_resnet.py --amp "$amp" --batch 256 --epochs 1 --images-per-class 300 \
      --image-size 64 --num-workers 6 --data-dir "$OUT/jpeg" --run-dir "$OUT/resnet-$amp" \
      --summary "$OUT/resnet-$amp.json" --quiet > "$OUT/resnet-$amp.log" 2>&1
  rc=$?
  sps=$("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"{d['samples_per_s']:.0f}\")" \
        "$OUT/resnet-$amp.json" 2>/dev/null || echo nan)
  say "resnet18 amp=$amp rc=$rc samples_per_s=$sps in $(( $(date +%s) - T0 )) s"; tail -n 3 "$OUT/resnet-$amp.log"
  res+=("resnet_${amp}_rc=$rc resnet_${amp}_samples_per_s=$sps")
done
echo "cuda=1 horovod_nccl=$HVD profile_rc=$PROF_RC ${res[*]}"
