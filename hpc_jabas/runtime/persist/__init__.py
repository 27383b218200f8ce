"""What outlives an iteration: the checkpoint file format (``checkpoint.py``), one writer per directory
(``dirlock.py``), the training state carried across a chain's jobs (``state.py``) and the decisions announced
ahead of the iteration they take effect at (``pending.py``)."""
