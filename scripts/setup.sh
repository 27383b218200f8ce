#!/usr/bin/env bash
# Idempotent set-up for hpc-jabas on Debian 12: apt packages, .venv, Horovod wheel (cached).
# Shared by `make test` and `make demo`. Safe to run repeatedly: it does only what is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${HPC_JABAS_VENV:-$ROOT/.venv}"
CACHE="${HPC_JABAS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpc-jabas}"
WHEELS="$CACHE/wheels"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
log() { echo "[setup] $*"; }
t0=$(date +%s)

# ---- 1. virtual environment and the Python packages that need no Debian package (in the background,
#         beside the apt step: torch alone is a few hundred MB to unpack) ----------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
STAMP="$VENV/.hpc-jabas-deps"
REQ_HASH=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
PIP_PID=""
PIP_LOG="$VENV/.pip-install.log"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$REQ_HASH" ]]; then
  log "installing Python dependencies (background; log $PIP_LOG)"
  # one pip run (one resolution) for all of them; pytest 8: pytest-xdist 3.8's xdist_group (tests/conftest.py)
  # renames node ids, which pytest 9 ignores
  # --no-compile, then compileall on every core: pip byte-compiles its files one by one (about 50 s of the
  # install here); the .pyc files must exist before the tests, whose processes may not write them
  # (PYTHONDONTWRITEBYTECODE)
  ( "$VPY" -m pip install -q --no-compile --upgrade wheel setuptools "torch==2.13.0" numpy cloudpickle psutil \
        pyyaml packaging "submitit==1.5.4" "pytest==8.4.2" pytest-xdist hypothesis scikit-learn matplotlib tqdm \
        pillow pytest-timeout ruff mypy \
      && { "$VPY" -m compileall -q -j 0 "$VENV/lib" >/dev/null 2>&1 || true; } ) >"$PIP_LOG" 2>&1 &
  PIP_PID=$!
fi

# ---- 2. Debian packages -------------------------------------------------------------
APT_PKGS=(openmpi-bin libopenmpi-dev libpmix-dev cmake munge slurmctld slurmd slurm-client
          slurmdbd mariadb-server lmod iproute2 procps)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing Debian packages; run as root: apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts services on install where it can; the project starts its own, so stop those.
  for s in slurmctld slurmd slurmdbd mariadb munge; do
    (command -v service >/dev/null && service "$s" stop >/dev/null 2>&1) || true
  done
fi

if [[ -n "$PIP_PID" ]]; then
  wait "$PIP_PID" || { cat "$PIP_LOG" >&2; echo "setup: pip install failed (log above)" >&2; exit 1; }
  "$VPY" -m pip install -q mpi4py        # built against Open MPI: after the apt step
  log "Python dependencies installed ($(( $(date +%s) - t0 )) s)"
fi

# ---- 3. Horovod 0.28.1 from a cached wheel ------------------------------------------------
if ! "$VPY" -c "import horovod.torch" >/dev/null 2>&1; then
  mkdir -p "$WHEELS"
  GPU_TAG=cpu
  if command -v nvcc >/dev/null 2>&1 && "$VPY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
     && ldconfig -p | grep -q libnccl; then GPU_TAG=nccl; fi
  TORCH_V=$("$VPY" -c "import torch; print(torch.__version__.replace('+','_'))")
  WDIR="$WHEELS/torch-$TORCH_V-$GPU_TAG"
  mkdir -p "$WDIR"
  if ! ls "$WDIR"/horovod-0.28.1-*.whl >/dev/null 2>&1; then
    log "building Horovod 0.28.1 wheel into $WDIR (once; about 3-6 minutes on 2 cores)"
    WRAP="$CACHE/cxx17"; mkdir -p "$WRAP"
    # C++17 (torch 2.13's headers need it), and no -g: Horovod's RelWithDebInfo build would carry debug
    # information nobody here reads; without it the build took 171 s instead of about 200 s on 2 cores and
    # the wheel is 1.2 MB instead of 20 MB (same -O3 code)
    printf '#!/bin/sh\nfor a; do shift; [ "$a" = -g ] || set -- "$@" "$a"; done\nexec g++ "$@" -std=c++17\n' \
      > "$WRAP/g++17"; chmod +x "$WRAP/g++17"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    export HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
    [[ $GPU_TAG == nccl ]] && export HOROVOD_GPU_OPERATIONS=NCCL
    export MAKEFLAGS="-j$(nproc)" CMAKE_POLICY_VERSION_MINIMUM=3.5 CXX="$WRAP/g++17"
    "$VPY" -m pip wheel -q --no-build-isolation --no-deps --no-cache-dir horovod==0.28.1 -w "$WDIR.tmp"
    mv "$WDIR.tmp"/horovod-*.whl "$WDIR"/ && rmdir "$WDIR.tmp" || true
  fi
  log "installing Horovod from $WDIR ($(( $(date +%s) - t0 )) s)"
  "$VPY" -m pip install -q --no-deps "$WDIR"/horovod-0.28.1-*.whl
fi

# ---- 4. the package itself ---------------------------------------------------------------
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$REQ_HASH" ]] || ! "$VPY" -c "import hpc_jabas" >/dev/null 2>&1; then
  "$VPY" -m pip install -q --no-deps --no-build-isolation -e .
  echo "$REQ_HASH" > "$STAMP"
fi
log "ready in $(( $(date +%s) - t0 )) s"
