#!/usr/bin/env bash
# Idempotent set-up for hpc-jabas on Debian 12: apt packages, the third-party environment (built once per
# dependency set and shared by every clone on this machine), and the clone's own .venv on top of it.
# Shared by `make test` and `make demo`. Safe to run repeatedly: it does only what is missing.
#
# Layout (docs/toolchain.md):
#   $CACHE/wheels/...           the Horovod wheel, built once per torch version and GPU support
#   $CACHE/env-<hash>/          a venv with torch, Horovod, mpi4py, submitit, pytest, ... (<hash>: the package
#                               list below, pyproject.toml's dependencies, the Horovod edit and the Python
#                               version)
#   <clone>/.venv               a small venv of the clone: a .pth file puts env-<hash>'s site-packages on its
#                               path, its bin/ has env-<hash>'s commands (ruff, mypy, horovodrun, ...) for its
#                               own python, and hpc-jabas is installed there in editable mode
#
# Horovod is built from source (step 3). Where that build fails (e.g. pip's public index gave the CUDA build of
# torch and Horovod's CMake then looks for a CUDA toolkit: horovod/horovod #2815), the set-up says so in one line
# and goes on without it: every run then uses the torch backend. In CI (CI=true) or with
# HPC_JABAS_REQUIRE_HOROVOD=1 a failed build stays fatal. HPC_JABAS_SIMULATE_HOROVOD_FAILURE=1 makes the build fail
# on purpose, in an environment and venv of its own (env-<hash>-no-horovod, venv-no-horovod-<clone>), so the path
# can be tried here without touching this machine's environment: `HPC_JABAS_SIMULATE_HOROVOD_FAILURE=1 make demo`.
set -euo pipefail
shopt -s inherit_errexit    # also inside $(...)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="${HPC_JABAS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hpc-jabas}"
SIM_NO_HVD=0; [[ "${HPC_JABAS_SIMULATE_HOROVOD_FAILURE:-0}" == 1 ]] && SIM_NO_HVD=1
REQUIRE_HVD=0; [[ "${CI:-}" == true || "${HPC_JABAS_REQUIRE_HOROVOD:-0}" == 1 ]] && REQUIRE_HVD=1
if ((SIM_NO_HVD)); then
  VENV="${HPC_JABAS_VENV:-$CACHE/venv-no-horovod-$(echo "$ROOT" | sha256sum | cut -c1-8)}"
else
  VENV="${HPC_JABAS_VENV:-$ROOT/.venv}"
fi
WHEELS="$CACHE/wheels"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
log() { echo "[setup] $*"; }
t0=$(date +%s)
mkdir -p "$CACHE"

# The third-party packages. pytest 8: pytest-xdist 3.8's xdist_group (tests/conftest.py) renames node ids,
# which pytest 9 ignores. mpi4py and Horovod come after the Debian packages (they build against Open MPI).
PKGS=(wheel setuptools "torch==2.13.0" numpy cloudpickle psutil pyyaml packaging "submitit==1.5.4" "pytest==8.4.2"
      pytest-xdist hypothesis scikit-learn matplotlib tqdm pillow pytest-timeout ruff mypy
      tensorboard)      # tensorboard: tests/test_ddp_script_logging.py runs docs/training.md's recipe
ENV_FORMAT=2      # bump to rebuild every shared environment
ENV_HASH=$( { echo "$ENV_FORMAT"; printf '%s\n' "${PKGS[@]}"; sed -n '/^dependencies *=/,/^]/p' pyproject.toml;
              cat scripts/horovod_cycle_patch.py;
              "$PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
BASE="$CACHE/env-$ENV_HASH"
((SIM_NO_HVD)) && BASE+="-no-horovod"
BPY="$BASE/bin/python"

# One set-up at a time on this machine (two clones may share the environment being built).
exec 9>"$CACHE/.setup.lock"
flock 9

# ---- 1. the shared environment's Python packages (in the background, beside the apt step: torch alone
#         is a few hundred MB to unpack) --------------------------------------------------------------
PIP_PID=""
PIP_LOG="$BASE.pip.log"
if [[ ! -f "$BASE/.complete" ]]; then
  log "creating the shared environment $BASE"
  rm -rf "$BASE"
  "$PY" -m venv "$BASE"
  log "installing Python dependencies (background; log $PIP_LOG)"
  # --no-compile, then compileall on every core: pip byte-compiles its files one by one (about 50 s of the
  # install here); the .pyc files must exist before the tests, whose processes may not write them
  # (PYTHONDONTWRITEBYTECODE)
  ( "$BPY" -m pip install -q --no-compile --upgrade "${PKGS[@]}" \
      && { "$BPY" -m compileall -q -j 0 "$BASE/lib" >/dev/null 2>&1 || true; } ) >"$PIP_LOG" 2>&1 &
  PIP_PID=$!
fi

# ---- 2. Debian packages -------------------------------------------------------------
# python3-venv: tests/test_nonroot.py's user makes its own venv with the system python3 (root's pyenv is not theirs)
APT_PKGS=(openmpi-bin libopenmpi-dev libpmix-dev cmake munge slurmctld slurmd slurm-client
          slurmdbd mariadb-server lmod iproute2 procps python3-venv)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    [[ -z "$PIP_PID" ]] || kill "$PIP_PID" 2>/dev/null || true
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
  "$BPY" -m pip install -q mpi4py        # built against Open MPI: after the apt step
  log "Python dependencies installed ($(( $(date +%s) - t0 )) s)"
fi

# ---- 3. Horovod 0.28.1 from a cached wheel ------------------------------------------------
# horovod_wheel GPU_TAG EDIT: the folder holding the wheel for this torch and GPU support, built there once.
# EDIT=1 applies scripts/horovod_cycle_patch.py (CPU builds: without it, ranks that share cores spin in MPI
# for most of every cycle); the folder's name says so.
horovod_wheel() {
  local tag=$1 edit=$2 torch_v wdir src
  torch_v=$("$BPY" -c "import torch; print(torch.__version__.replace('+','_'))")
  wdir="$WHEELS/torch-$torch_v-$tag"
  ((edit)) && wdir+="-inphase-$(sha256sum scripts/horovod_cycle_patch.py | cut -c1-8)"
  mkdir -p "$wdir"
  if ! ls "$wdir"/horovod-0.28.1-*.whl >/dev/null 2>&1; then
    log "building Horovod 0.28.1 wheel into $wdir (once; about 3-6 minutes on 2 cores)" >&2
    local wrap="$CACHE/cxx17"; mkdir -p "$wrap"
    # C++17 (torch 2.13's headers need it), and no -g: Horovod's RelWithDebInfo build would carry debug
    # information nobody here reads; without it the build took 171 s instead of about 200 s on 2 cores and
    # the wheel is 1.2 MB instead of 20 MB (same -O3 code)
    printf '#!/bin/sh\nfor a; do shift; [ "$a" = -g ] || set -- "$@" "$a"; done\nexec g++ "$@" -std=c++17\n' \
      > "$wrap/g++17"; chmod +x "$wrap/g++17"
    src=$(mktemp -d)
    "$BPY" -m pip download -q --no-deps --no-binary :all: horovod==0.28.1 -d "$src" >&2
    tar xzf "$src"/horovod-0.28.1.tar.gz -C "$src"
    if ((edit)); then "$BPY" scripts/horovod_cycle_patch.py "$src/horovod-0.28.1" >&2; fi
    rm -rf "$wdir.tmp"
    ( export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
      export HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=GLOO
      [[ $tag == nccl ]] && export HOROVOD_GPU_OPERATIONS=NCCL
      export MAKEFLAGS="-j$(nproc)" CMAKE_POLICY_VERSION_MINIMUM=3.5 CXX="$wrap/g++17"
      "$BPY" -m pip wheel -q --no-build-isolation --no-deps --no-cache-dir "$src/horovod-0.28.1" -w "$wdir.tmp" >&2 )
    mv "$wdir.tmp"/horovod-*.whl "$wdir"/ && rmdir "$wdir.tmp" || true
    rm -rf "$src"
  fi
  echo "$wdir"
}
if [[ "${1:-}" == --released-horovod-wheel ]]; then
  # for bench/horovod_spin.py: the CPU wheel as released (no edit), beside the edited one; prints its folder
  [[ -f "$BASE/.complete" ]] || { echo "setup: run scripts/setup.sh first" >&2; exit 1; }
  horovod_wheel cpu 0
  exit 0
fi
# a new environment builds Horovod; so does one that went on without it, when CI requires it (a retry, fatal if it fails)
RETRY_HVD=0; ((REQUIRE_HVD)) && [[ -f "$BASE/.no-horovod" ]] && RETRY_HVD=1
if { [[ ! -f "$BASE/.complete" ]] || ((RETRY_HVD)); } && ! "$BPY" -c "import horovod.torch" >/dev/null 2>&1; then
  mkdir -p "$WHEELS"
  GPU_TAG=cpu
  if command -v nvcc >/dev/null 2>&1 && "$BPY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
     && ldconfig -p | grep -q libnccl; then GPU_TAG=nccl; fi
  HVD_LOG="$BASE.horovod.log"
  set +e
  ( set -e
    if ((SIM_NO_HVD)); then   # as on a machine whose pip gave the CUDA torch (horovod #2815)
      echo "CMake Error: Could NOT find CUDAToolkit (simulated: HPC_JABAS_SIMULATE_HOROVOD_FAILURE=1)"; exit 1
    fi
    if [[ $GPU_TAG == cpu ]]; then WDIR=$(horovod_wheel cpu 1); else WDIR=$(horovod_wheel nccl 0); fi
    log "installing Horovod from $WDIR ($(( $(date +%s) - t0 )) s)"
    "$BPY" -m pip install -q --no-deps "$WDIR"/horovod-0.28.1-*.whl
    "$BPY" -c "import horovod.torch" ) 2>&1 | tee "$HVD_LOG"
  rc=${PIPESTATUS[0]}
  set -e
  if ((rc)); then
    if ((REQUIRE_HVD)); then
      echo "setup: Horovod's build failed (log $HVD_LOG); CI needs it (CI=true or HPC_JABAS_REQUIRE_HOROVOD=1)" >&2
      exit 1
    fi
    log "Horovod's build failed (log $HVD_LOG): going on without Horovod; every run uses the torch backend"
    touch "$BASE/.no-horovod"
  else
    rm -f "$BASE/.no-horovod"
  fi
fi
# the packages every environment has; Horovod too unless its build failed here (.no-horovod)
NEED="torch, mpi4py, submitit, pytest"; [[ -f "$BASE/.no-horovod" ]] || NEED+=", horovod.torch"
if [[ ! -f "$BASE/.complete" ]]; then
  "$BPY" -c "import $NEED" || { echo "setup: the shared environment $BASE is incomplete" >&2; exit 1; }
  touch "$BASE/.complete"
fi
touch "$BASE/.used"
# shared environments of other dependency sets that no set-up used for 30 days
find "$CACHE" -maxdepth 2 -path "$CACHE/env-*/.used" -mtime +30 -printf '%h\n' 2>/dev/null \
  | while read -r old; do [[ "$old" == "$BASE" ]] || { log "removing unused $old"; rm -rf "$old"; }; done

# ---- 4. the clone's .venv on the shared environment, and the package itself ------------------------------
MODS="'torch', 'hpc_jabas'"; [[ -f "$BASE/.no-horovod" ]] || MODS+=", 'horovod'"
venv_ok() {
  [[ -x "$VENV/bin/python" && "$(cat "$VENV/.hpc-jabas-env" 2>/dev/null)" == "$BASE" ]] && "$VENV/bin/python" -c \
    "import importlib.util as u, sys; sys.exit(0 if all(map(u.find_spec, ($MODS))) else 1)" \
    >/dev/null 2>&1
}
if ! venv_ok; then
  log "creating $VENV on $BASE"
  rm -rf "$VENV"
  "$PY" -m venv --without-pip "$VENV"
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  BSITE=$("$BPY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "$BSITE" > "$SITE/_hpc_jabas_env.pth"
  # the shared environment's commands, for this venv's python: scripts get their first line rewritten,
  # binaries (ruff) are linked
  for f in "$BASE"/bin/*; do
    n=$(basename "$f")
    case "$n" in python*|activate*|Activate*|pip*) continue ;; esac
    [[ -e "$VENV/bin/$n" ]] && continue
    if [[ "$(head -c 2 "$f")" == "#!" ]] && head -n 1 "$f" | grep -q "^#!$BASE/bin/python"; then
      { echo "#!$VENV/bin/python"; tail -n +2 "$f"; } > "$VENV/bin/$n"
      chmod +x "$VENV/bin/$n"
    else
      ln -s "$f" "$VENV/bin/$n"
    fi
  done
  "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
  echo "$BASE" > "$VENV/.hpc-jabas-env"
  venv_ok || { echo "setup: $VENV cannot import ${MODS//\'/}" >&2; exit 1; }
fi
log "ready in $(( $(date +%s) - t0 )) s"
