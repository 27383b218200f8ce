"""Slurm: sbatch/sacct/scontrol text, het-job components, the submitit executor, chains."""
