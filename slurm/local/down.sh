#!/usr/bin/env bash
# Stop the local Slurm cluster started by up.sh: cancel jobs, stop every daemon by its pid file
# (never by name), kill what is left inside the node namespaces, remove namespaces, veths and
# bridge. Keeps the state directory (job history, accounting DB) unless called with --purge.
# Safe to run when nothing is up.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
source "$HERE/common.sh"
# One up.sh/down.sh at a time (two pytest sessions may start together). flock -o: the lock is
# held by flock itself, not inherited by the daemons started here.
if [[ -z "${JABAS_SLURM_LOCKED:-}" && $(id -u) -eq 0 ]] && [[ -d "$JABAS_SLURM_DIR" ]]; then
  mkdir -p "$JABAS_SLURM_DIR"
  JABAS_SLURM_LOCKED=1 exec flock -o -w 300 "$JABAS_SLURM_DIR/.lock" bash "${BASH_SOURCE[0]}" "$@"
fi
export JABAS_SLURM_LOCKED=1
T0=$(date +%s%N)
PURGE=0
[[ "${1:-}" == "--purge" ]] && PURGE=1
[[ $(id -u) -eq 0 ]] || jdie "down.sh must run as root"

# stop_pid FILE NAME: SIGTERM the pid in FILE, wait up to 15 s, then SIGKILL.
stop_pid() {
  local f=$1 what=$2 p i
  pid_alive "$f" || { rm -f "$f"; return 0; }
  p=$(<"$f")
  kill -TERM "$p" 2>/dev/null
  for i in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$p" 2>/dev/null; then jlog "$what ($p) ignored SIGTERM; killing"; kill -KILL "$p" 2>/dev/null; sleep 0.2; fi
  rm -f "$f"
}

# 1. jobs: cancel them while the controller still runs (quick; their processes die with the nodes)
if [[ -f "$SLURM_CONF" ]] && pid_alive "$CTLD_PID"; then
  timeout 5 scancel --quiet --user=root >/dev/null 2>&1 || true
  for u in $(timeout 5 squeue -h -o %u 2>/dev/null | sort -u); do timeout 5 scancel --quiet --user="$u" >/dev/null 2>&1 || true; done
fi

# 2. slurmd per node and slurmctld together (each takes ~2 s to exit on SIGTERM), then every
#    process still in a node's namespace (slurmstepd, job tasks)
for n in "${JABAS_NODES[@]}"; do
  nn=$(jnode_name "$n")
  stop_pid "$(slurmd_pid_file "$nn")" "slurmd $nn" &
done
stop_pid "$CTLD_PID" slurmctld &
wait
for n in "${JABAS_NODES[@]}"; do
  ns=$(jnetns "$(jnode_name "$n")")
  [[ -e /run/netns/$ns ]] || continue
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [[ -n "$pids" ]] || continue
  kill -TERM $pids 2>/dev/null
  for i in $(seq 30); do [[ -z "$(ip netns pids "$ns" 2>/dev/null)" ]] && break; sleep 0.1; done
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null
done

# 3. accounting, then database and munge (munge last but one: nothing needs it by then)
stop_pid "$DBD_PID" slurmdbd
stop_pid "$DB_PID" mariadb &
stop_pid "$MUNGE_PID" munged &
wait

# 4. network
for n in "${JABAS_NODES[@]}"; do
  nn=$(jnode_name "$n")
  ip link del "$(jveth "$nn")" >/dev/null 2>&1
  [[ -e /run/netns/$(jnetns "$nn") ]] && ip netns del "$(jnetns "$nn")"
done
ip link show "$JABAS_BRIDGE" >/dev/null 2>&1 && ip link del "$JABAS_BRIDGE"

# 5. the /etc/slurm/slurm.conf convenience link, if it is ours
if [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$ETC/slurm.conf" ]]; then
  rm -f /etc/slurm/slurm.conf
fi
if ((PURGE)); then
  case "$JABAS_SLURM_DIR" in /|/var|/var/tmp|/tmp|"") jdie "refusing to remove $JABAS_SLURM_DIR";; esac
  rm -rf "$JABAS_SLURM_DIR"
fi
ms=$(( ($(date +%s%N) - T0) / 1000000 ))
jlog "cluster down in $((ms / 1000)).$((ms % 1000 / 100)) s"
