# Shared settings of the local Slurm cluster (sourced by up.sh, down.sh and status.sh; bash only).
# Everything lives under one state directory; nothing here touches a real network.

JABAS_SLURM_DIR="${HPC_JABAS_SLURM_DIR:-/var/tmp/hpc-jabas-slurm}"
# Private /24 that up.sh creates (bridge .1, nodes .11, .12, ...). Change it if it clashes.
JABAS_NET="${HPC_JABAS_SLURM_NET:-10.211.0}"
JABAS_BRIDGE="${HPC_JABAS_SLURM_BRIDGE:-jabasbr0}"
JABAS_BRIDGE_ADDR="$JABAS_NET.1"
# Ports: slurmctld, slurmd (one per namespace, so all share it), slurmdbd, MariaDB (127.0.0.1 only).
JABAS_PORT_BASE="${HPC_JABAS_SLURM_PORT_BASE:-6817}"
JABAS_CTLD_PORT=$((JABAS_PORT_BASE))
JABAS_SLURMD_PORT=$((JABAS_PORT_BASE + 1))
JABAS_DBD_PORT=$((JABAS_PORT_BASE + 2))
JABAS_DB_PORT=$((JABAS_PORT_BASE + 3))
JABAS_CLUSTER_NAME=jabas

# Nodes: name:gpu_type:gpus:last_octet. Partitions are named after the GPU type of their nodes.
JABAS_NODES=(gpua1:a100:2:11 gpuv1:v100:2:12 gpuv2:v100:2:13 gpur1:rtx2060:4:14)
# Billing weight of one GPU-hour in each partition (TRESBillingWeights GRES/gpu=...).
declare -A JABAS_GPU_WEIGHT=([a100]=4.0 [v100]=2.0 [rtx2060]=1.0)
JABAS_PARTITIONS=(a100 v100 rtx2060)
JABAS_DEFAULT_PARTITION=v100
JABAS_NODE_CPUS=8          # declared CPUs per node (the machine may have only 2 real cores)
JABAS_NODE_MEM_MB=4096     # declared memory per node
JABAS_DEF_MEM_MB=512       # default memory of a job per node, so that jobs share nodes

ETC="$JABAS_SLURM_DIR/etc"
# What every node shares with this host although most clusters keep it node-local: only /tmp is private per node
# (plus the /tmp paths of "# shared-tmp:" in slurm.conf, bound into it). up.sh declares these in $ETC/shared-paths,
# beside slurm.conf, where hpc-jabas submit's node-visibility check (hpc_jabas/slurm/nodepaths.py) reads them.
JABAS_SHARED_DIRS=(/var/tmp /dev/shm)
write_shared_decl() {  # write_shared_decl DIR: the declaration, rewritten only when it changed
  local f="$1/shared-paths" body
  body=$(printf '# written by slurm/local/up.sh: directories every node of this cluster shares with the host\n'
         printf '%s\n' "${JABAS_SHARED_DIRS[@]}")
  [[ -f $f && "$(cat "$f")" == "$body" ]] || printf '%s\n' "$body" > "$f"
}
RUN="$JABAS_SLURM_DIR/run"
LOG="$JABAS_SLURM_DIR/log"
MUNGE_DIR="$JABAS_SLURM_DIR/munge"
DB_DIR="$JABAS_SLURM_DIR/mysql"
# munged must listen on the default socket: Slurm 22.05's accounting connections (sacctmgr, sacct,
# slurmctld -> slurmdbd) ignore AuthInfo=socket=... and always use the default one.
MUNGE_SOCKET=/run/munge/munge.socket.2
MUNGE_PID="$MUNGE_DIR/munged.pid"
DB_PID="$DB_DIR/mysqld.pid"
DB_SOCKET="$DB_DIR/mysqld.sock"
DBD_PID="$RUN/slurmdbd.pid"
CTLD_PID="$RUN/slurmctld.pid"
export SLURM_CONF="$ETC/slurm.conf"

jnode_name() { echo "${1%%:*}"; }
jnode_field() { local IFS=:; local a=($1); echo "${a[$2]}"; }
jnode_addr() { echo "$JABAS_NET.$(jnode_field "$1" 3)"; }
jnetns() { echo "jabas-$1"; }           # network namespace of a node
jveth() { echo "vj-$1"; }               # host end of its veth pair (<= 15 chars)
slurmd_pid_file() { echo "$RUN/slurmd-$1.pid"; }

# pid_alive FILE: the pid in FILE names a live process of the daemon the file belongs to
# (its /proc/PID/comm is checked against the file's name, so a pid reused after a reboot or a
# crash is not taken for the daemon, and down.sh never signals a stranger).
pid_alive() {
  local p comm want
  [[ -s "$1" ]] || return 1
  p=$(<"$1") || return 1
  [[ "$p" =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null || return 1
  comm=$(cat "/proc/$p/comm" 2>/dev/null) || return 1
  # a killed daemon may linger as a zombie until init reaps it; kill -0 still succeeds on those
  [[ $(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null) != [ZX] ]] || return 1
  case "$(basename "$1")" in
    munged.pid) want=munged;; mysqld.pid) want="mariadbd mysqld";; slurmdbd.pid) want=slurmdbd;;
    slurmctld.pid) want=slurmctld;; slurmd-*.pid) want=slurmd;; *) return 0;;
  esac
  [[ " $want " == *" $comm "* ]]
}

jlog() { echo "[slurm-local] $*" >&2; }
jdie() { echo "[slurm-local] ERROR: $*" >&2; exit 1; }
