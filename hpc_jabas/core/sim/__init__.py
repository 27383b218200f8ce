"""The simulator: whole training jobs in simulated time (``simulate.py``) on the project's own decision core, from
a described cluster, job, statistics and queue (``simconfig.py``). The top of core/: nothing in core imports it."""
