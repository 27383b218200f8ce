"""Epoch-end auto-scaling: the forecast of the next epoch (``forecast.py``), what a run costs besides its
iterations (``overheads.py``), the pricing of a mix and the decision to move (``scaler.py``), and the search over
mixes at cluster scale (``mixsearch.py``, its tree ``mixtree.py`` and bound ``mixbound.py``)."""
