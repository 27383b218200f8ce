"""Batch-size policies as objects behind one ``Policy`` protocol, registered by name in one place.

- ``base.py``: the ``Policy`` protocol, what a policy sees (``PolicyState``, ``Observation``) and returns (``Wish``,
  ``BatchDecision``), the ``BatchPolicy`` base class and ``FixedPolicy``;
- ``similarity.py``, ``goodput.py``, ``ramp.py``: the adaptive built-ins (JABAS/SimiGrad, Pollux's goodput, a
  batch-size warm-up);
- ``registry.py``: name -> class (``register_policy`` adds one; ``make_policy``, ``policy_for_job`` build one).

``core/adaptive/policy.py`` keeps the rules around the policies (ranges, periods, lr and weight-decay rules).
"""
from hpc_jabas.core.adaptive.policies.base import (
    NOISE,
    SIMILARITY,
    BatchDecision,
    BatchPolicy,
    FixedPolicy,
    Observation,
    Policy,
    PolicyState,
    Wish,
)
from hpc_jabas.core.adaptive.policies.goodput import GoodputPolicy
from hpc_jabas.core.adaptive.policies.ramp import RampPolicy
from hpc_jabas.core.adaptive.policies.registry import (
    AUTO_LR_RULE,
    make_policy,
    policy_class,
    policy_for_job,
    register_policy,
    unregister_policy,
)
from hpc_jabas.core.adaptive.policies.similarity import SimilarityPolicy

__all__ = ["AUTO_LR_RULE", "NOISE", "SIMILARITY", "BatchDecision", "BatchPolicy", "FixedPolicy", "GoodputPolicy",
           "Observation", "Policy", "PolicyState", "RampPolicy", "SimilarityPolicy", "Wish", "make_policy",
           "policy_class", "policy_for_job", "register_policy", "unregister_policy"]
