"""Loading: the profiled model (through core/config/loader.py, the one ``module:callable`` loader), its checks,
devices."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from hpc_jabas.core.config.loader import load_callable, one_line
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.profiling.defaults import OPTIMIZERS


@dataclass
class ModelBundle:
    """What a model callable returns, checked."""
    model: torch.nn.Module
    loss_fn: Callable[..., torch.Tensor]
    sample: tuple[torch.Tensor, ...]
    spec: str = ""

    @property
    def n_samples(self) -> int:
        return int(self.sample[0].shape[0])


def load_model(spec: str) -> ModelBundle:
    """Load ``module:callable``, call it, and check that it returned (nn.Module, loss_fn, (x, y, ...)).
    Any problem is one ConfigError line."""
    fn = load_callable(spec, "model", "examples.models:digits_mlp")
    try:
        out = fn()
    except Exception as e:
        raise ConfigError(f"model {spec!r}: calling {spec.split(':')[1]}() failed ({one_line(e)})") from None
    return check_bundle(out, spec)


def check_bundle(out: Any, spec: str = "model") -> ModelBundle:
    want = "it must return (model, loss_fn, sample_batch)"
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise ConfigError(f"{spec}: returned a {type(out).__name__}; {want}")
    model, loss_fn, sample = out
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"{spec}: model is a {type(model).__name__}, not a torch.nn.Module; {want}")
    if not callable(loss_fn):
        raise ConfigError(f"{spec}: loss_fn is a {type(loss_fn).__name__}, not callable; {want}")
    if isinstance(sample, torch.Tensor) or not isinstance(sample, (tuple, list)) or len(sample) < 2 \
            or not all(isinstance(t, torch.Tensor) for t in sample):
        raise ConfigError(f"{spec}: sample_batch must be a tuple (x, y) of tensors; {want}")
    n = {int(t.shape[0]) if t.dim() else 0 for t in sample}
    if len(n) != 1 or min(n) < 1:
        raise ConfigError(f"{spec}: the sample_batch tensors must share a first dimension >= 1 "
                          f"(got sizes {sorted(n)})")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"{spec}: the model has no parameter that requires a gradient")
    return ModelBundle(model, loss_fn, tuple(sample), spec)


def grad_bytes(model: torch.nn.Module) -> int:
    """Bytes of the gradients the allreduce moves (parameters that require a gradient)."""
    return int(sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad))


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    raise ConfigError(f"optimizer {name!r} is unknown; valid: {', '.join(OPTIMIZERS)}")


def sample_index(n: int, b: int) -> torch.Tensor:
    """Indices of a micro-batch of b samples, cycling through a sample batch of n."""
    return torch.arange(b, dtype=torch.long) % n


def resolve_device(name: str | None) -> torch.device:
    """cpu, cuda, cuda:N or auto/None (cuda when available); a bad name is one ConfigError line."""
    if name in (None, "auto"):
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device {name!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available here; use cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {name!r}: only cpu and cuda are supported")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev
