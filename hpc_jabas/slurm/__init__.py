"""Slurm: everything hpc-jabas says to or reads from Slurm. Imports core/ only, never runtime/ or cli/.

- ``env``: ``SlurmEnv``, the job's environment as Slurm sets it (job id, step, nodes, het components, requeue
  count, signals): the one module that reads Slurm's variables.
- ``proc``: the one subprocess wrapper for Slurm commands (timeout, one-line SlurmError).
- ``text``: pure parsers of scontrol/sinfo/sacct/sbatch output (records, GRES, host lists, het-job ids).
- ``cluster``: the cluster view (partitions, GPU types, free GPUs, billing) and a rank's own GPU type.
- ``components``: a mix as job components (one per partition), parse_mix, per-component options.
- ``sbatch``: pure job-script text (sbatch scripts, het blocks, the het-step srun), the submission env.
- ``executor``: submission (methods submitit and sbatch); the only place that touches submitit internals.
- ``watch``: sacct states with one het-job state fold, and wait_chain.
- ``chain``: the chain's append-only event log (chain.jsonl).
"""
