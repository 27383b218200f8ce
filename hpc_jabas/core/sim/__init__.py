"""The simulator: whole training jobs in simulated time (``simulate.py``; its strategies in ``strategies.py``, what
measuring and probing cost in ``measuring.py``, the epoch-end decision in ``epoch_decision.py``) on the project's own
decision core, from a described cluster, job, statistics and queue (``simconfig.py``). The top of core/: nothing in
core imports it."""
