"""LB-BSP balancing: keep B, re-split it across ranks by their predicted speeds. Pure: plain Python + numpy.

Modules, along their seams (docs/formulas.md, section 6):

* ``speed_models.py``: one rank's speed model, the last-value baseline and NARX fitted online by RLS;
* ``predictor.py``: ``RankPredictors``, one model per rank, with its own and the baseline's one-step error;
* ``rebalance.py``: ``Rebalancer``, the decision (candidate plan, hysteresis, damping on oscillation) and
  ``interpolate_plan``, the damped move between two plans.

What a rank measures on its host for the models' exogenous inputs (CPU, memory, load, GPU utilisation and
clock) is read in the runtime, by ``hpc_jabas/runtime/telemetry.py``; this package never reads a clock.
"""
from __future__ import annotations

from hpc_jabas.core.balancing.predictor import RankPredictors
from hpc_jabas.core.balancing.rebalance import Rebalancer, interpolate_plan
from hpc_jabas.core.balancing.speed_models import LastValuePredictor, NarxPredictor, SpeedModel

__all__ = ["LastValuePredictor", "NarxPredictor", "RankPredictors", "Rebalancer", "SpeedModel", "interpolate_plan"]
