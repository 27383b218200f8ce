"""The batch-size policies by name: the one place a name (or alias) becomes a policy class.

The built-in policies (fixed, similarity, noise-scale, ramp; their names and aliases are the configuration's
choices in core/config/defaults.py) are here; a program adds its own with :func:`register_policy` (a subclass of
``BatchPolicy`` with its own ``name``), after which ``policy = "<name>"`` is a valid configuration (the choices,
``POLICIES``, follow the registry) and the controller runs it like any other: it asks the policy what it reads
and how it decides, never its name.

    from hpc_jabas.core.adaptive.policies import BatchPolicy, Wish, register_policy

    @register_policy
    class Doubling(BatchPolicy):
        name = "doubling"
        def wish(self, state, space):
            return Wish("grow", 2.0 * state.B, "double B")
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from hpc_jabas.core.adaptive.policies.base import BatchPolicy, FixedPolicy, Policy
from hpc_jabas.core.adaptive.policies.goodput import GoodputPolicy
from hpc_jabas.core.adaptive.policies.ramp import RampPolicy
from hpc_jabas.core.adaptive.policies.similarity import SimilarityPolicy
from hpc_jabas.core.config.defaults import POLICIES, POLICY_ALIASES, canonical_policy
from hpc_jabas.errors import ConfigError

if TYPE_CHECKING:
    from hpc_jabas.core.config.sections import JobConfig

_P = TypeVar("_P", bound=type[BatchPolicy])

#: canonical name -> class: the built-in policies, then any a program registers
_CLASSES: dict[str, type[BatchPolicy]] = {c.name: c for c in (FixedPolicy, SimilarityPolicy, GoodputPolicy, RampPolicy)}
BUILTIN = frozenset(_CLASSES)
if set(BUILTIN) != set(POLICIES):          # defaults.POLICIES names the built-ins for the configuration
    raise RuntimeError(f"built-in policies {sorted(BUILTIN)} differ from the configuration's {list(POLICIES)}")


def register_policy(cls: _P, aliases: Iterable[str] = ()) -> _P:
    """Register ``cls`` (a ``BatchPolicy`` subclass) under its ``name`` and ``aliases``; returns ``cls`` (so it is
    a class decorator too). Registering the same class again is a no-op; a name taken by another policy is refused
    in one line."""
    if not (isinstance(cls, type) and issubclass(cls, BatchPolicy)):
        raise ConfigError(f"register_policy({cls!r}): a policy is a subclass of "
                          "hpc_jabas.core.adaptive.policies.BatchPolicy")
    name = cls.name
    if not isinstance(name, str) or not name.strip() or name != name.strip().lower() or name == BatchPolicy.name:
        raise ConfigError(f"policy class {cls.__qualname__} has name={name!r}; give it its own lower-case name, "
                          "e.g. name = \"my-policy\"")
    keys = [name, *(str(a).strip().lower() for a in aliases)]
    for k in keys:
        owner = POLICY_ALIASES.get(k)
        if owner is not None and (owner != name or _CLASSES.get(owner, cls) is not cls):
            raise ConfigError(f"policy name {k!r} is taken by policy {owner!r}; register {cls.__qualname__} under "
                              "another name")
    _CLASSES[name] = cls
    for k in keys:
        POLICY_ALIASES[k] = name
    return cls


def unregister_policy(name: str) -> None:
    """Remove a registered policy and its aliases (the built-in ones stay)."""
    key = canonical_policy(name)
    if key in BUILTIN:
        raise ConfigError(f"policy {key!r} is built in; only a registered policy can be removed")
    del _CLASSES[key]
    for k in [k for k, v in POLICY_ALIASES.items() if v == key]:
        del POLICY_ALIASES[k]


def policy_class(name: str) -> type[BatchPolicy]:
    """The class of a policy name or alias (an unknown name: ConfigError naming the valid ones)."""
    return _CLASSES[canonical_policy(name)]


def make_policy(name: str, **cfg: Any) -> BatchPolicy:
    """Build a policy by name or alias: 'fixed', 'similarity', 'noise-scale' (the goodput policy), 'ramp', or a
    registered one.

    An adaptive policy needs B_max. Unknown names or keys and impossible values raise ConfigError with one line.
    """
    cls = policy_class(name)
    bad = sorted(set(cfg) - cls.options)
    if bad:
        raise ConfigError(f"unknown option(s) {', '.join(bad)} for policy {cls.name!r}; "
                          f"valid options: {', '.join(sorted(cls.options))}")
    if cls.adaptive and cfg.get("B_max") is None:
        raise ConfigError(f"policy {cls.name!r} needs B_max (the largest global batch size allowed)")
    return cls(**cfg)


def policy_for_job(cfg: JobConfig, p: int) -> Policy:
    """The policy a job runs (``cfg.policy``), with decision period ``p``."""
    return policy_class(cfg.policy).from_job(cfg, p)


class _AutoLRRule(Mapping[str, str]):
    """policy name -> the lr rule "auto" stands for with it (each class's ``auto_lr_rule``), live."""

    def __getitem__(self, name: str) -> str:
        return policy_class(name).auto_lr_rule

    def __iter__(self) -> Iterator[str]:
        return iter(list(_CLASSES))

    def __len__(self) -> int:
        return len(_CLASSES)


#: what lr_rule = "auto" (the default) means for each policy: JABAS pairs its similarity rule with sqrt scaling;
#: Pollux pairs goodput with AdaScale, which linear scaling stands for (GoodputPolicy.auto_lr_rule)
AUTO_LR_RULE: Mapping[str, str] = _AutoLRRule()
