"""The job around the loop: the entry point inside Slurm or mpirun (``launch.py``), the task contract a job's
``module:callable`` returns (``task.py``), and epoch-end auto-scaling on Slurm (``lifecycle.py``: the adapter
between core/autoscale and the cluster). The top of runtime/: nothing else in runtime imports it."""
