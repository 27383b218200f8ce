# Source me (any POSIX shell): points Slurm's client commands at the local cluster of up.sh.
#   source slurm/local/env.sh && sinfo
export HPC_JABAS_SLURM_DIR="${HPC_JABAS_SLURM_DIR:-/var/tmp/hpc-jabas-slurm}"
export SLURM_CONF="$HPC_JABAS_SLURM_DIR/etc/slurm.conf"
