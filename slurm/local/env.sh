# Source me (any POSIX shell): points Slurm's client commands at the local cluster of up.sh.
#   source slurm/local/env.sh && sinfo
export HPC_JABAS_SLURM_DIR="${HPC_JABAS_SLURM_DIR:-/var/tmp/hpc-jabas-slurm}"
export SLURM_CONF="$HPC_JABAS_SLURM_DIR/etc/slurm.conf"
# Every node of the local cluster sees $HPC_JABAS_SLURM_DIR/shared (and the whole of /var/tmp; only /tmp is
# private per node): hpc-jabas submit refuses node-local paths unless HPC_JABAS_SHARED_TMP names them
# or the cluster declares them (up.sh writes /var/tmp and /dev/shm into $ETC/shared-paths, beside slurm.conf).
case ":${HPC_JABAS_SHARED_TMP:-}:" in
  *":$HPC_JABAS_SLURM_DIR/shared:"*) ;;
  *) export HPC_JABAS_SHARED_TMP="${HPC_JABAS_SHARED_TMP:+$HPC_JABAS_SHARED_TMP:}$HPC_JABAS_SLURM_DIR/shared";;
esac
