"""Per-iteration adaptivity: the gradient statistics (``stats.py``), the batch-size policies (``policies/``) and
the rules around them (``policy.py``: ranges, periods, lr and weight-decay rules; ``scaling.py``), the curvature
headroom (``headroom.py``), the divergence guard (``guard.py``) and what rank 0 decides (``decision.py``)."""
