"""The curvature headroom of the lr, measured: one Hessian-vector product along the step's direction on a fixed
probe batch (core/adaptive/headroom.py says what eps_max and h are; docs/adaptive.md, section "Curvature headroom").

``probe_headroom(model, loss_fn, inputs, targets, optimizer)`` takes the gradient g of ``loss_fn(model(inputs),
targets)`` with a graph (``torch.autograd.grad(create_graph=True)``), the direction the optimizer steps along,
scaled by its effective lr per parameter group,

- SGD: ``delta = lr / (1 - momentum) * g`` (heavy ball in steady state; nesterov alike),
- Adam / AdamW: ``delta = lr * g / (sqrt(v_hat) + eps)``, v_hat = exp_avg_sq / (1 - beta2^step) from the
  optimizer's state (before its first step: g^2, i.e. the first step's sign-like direction),

and one Hessian-vector product ``H delta`` (double backward). The quadratic model descends along delta for a step of
s x delta while s < 2 g'delta / delta'H delta, so the headroom is ``h = 2 g'delta / delta'H delta`` (h > 1: inside
the edge) and ``eps_max = h * eps_eff / 2`` against the first parameter group's effective lr. With one group and SGD
this is core/adaptive/headroom.py's ``headroom(eps_max(g, Hg), lr, momentum)`` exactly.

Cost: one forward and two backwards on the probe batch (the graph of the gradient is kept for the second; memory
about twice a training step's activations on the probe batch); no ``.grad`` is touched and the model's buffers
(batch-norm running statistics) are restored. Attention runs with the math SDPA kernel (the fused kernels have no
double backward). The two scalars g'delta and delta'H delta are the only values read on the host, in one read, after
they are averaged over ranks when a torch.distributed process group is up (``reduce``: a caller's own average,
e.g. over Horovod; each rank probes its own batch). What a probe at the controller's measuring iterations would
still need (calling it, checkpointing the smoothed h, the simulator's price of it) is in docs/adaptive.md.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hpc_jabas.errors import ConfigError


@dataclass(frozen=True)
class HeadroomProbe:
    """One probe: ``h`` (inf: no positive curvature along the step; nan: not a descent direction), ``eps_max``
    (the first group's largest lr / 2 on the quadratic model, in its effective-lr units), ``eps_eff`` (that
    group's effective lr), and the two reduced scalars ``gd`` = g'delta, ``dhd`` = delta'H delta."""

    h: float
    eps_max: float
    eps_eff: float
    gd: float
    dhd: float


def _group_rate(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> tuple[float, bool]:
    """(effective lr of the group, whether the direction is Adam's preconditioned one)."""
    lr = float(group["lr"])
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return lr, True
    if isinstance(optimizer, torch.optim.SGD):
        beta = float(group.get("momentum", 0.0) or 0.0)
        damp = float(group.get("dampening", 0.0) or 0.0)
        # heavy ball with dampening d moves (1 - d) g per step into the buffer: lr (1 - d) / (1 - beta) in steady
        # state (torch's default d = 0)
        return (lr * (1.0 - damp) / (1.0 - beta) if beta else lr), False
    raise ConfigError(f"optimizer={type(optimizer).__name__} has no headroom probe; valid: SGD (with or without "
                      "momentum), Adam, AdamW")


def _adam_direction(optimizer: torch.optim.Optimizer, group: dict[str, Any], p: torch.Tensor,
                    g: torch.Tensor) -> torch.Tensor:
    state = optimizer.state.get(p, {})
    eps = float(group.get("eps", 1e-8))
    v = state.get("exp_avg_sq")
    if v is None:
        return g / (g.abs() + eps)                 # before the first step: the first step's direction
    beta2 = float(group["betas"][1])
    step = state.get("step", 1)
    n = float(step.item() if isinstance(step, torch.Tensor) else step)   # CPU step counter (torch's default)
    v_hat = v / (1.0 - beta2 ** max(n, 1.0))
    return g / (v_hat.sqrt() + eps)


def _default_reduce(x: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(x)
        x = x / dist.get_world_size()
    return x


def probe_headroom(model: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], inputs: Any,
                   targets: Any, optimizer: torch.optim.Optimizer,
                   reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> HeadroomProbe:
    """The curvature headroom of ``optimizer``'s step at ``model``'s weights on the probe batch (module docstring).
    ``reduce``: averages a 2-element tensor over ranks (None: torch.distributed's when a group of more than one
    rank is up, else none)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    pairs: list[tuple[torch.Tensor, dict[str, Any]]] = [
        (p, g) for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if not pairs:
        raise ConfigError("headroom probe: the optimizer holds no parameter that requires grad")
    params = [p for p, _ in pairs]
    rates = {id(g): _group_rate(optimizer, g) for g in optimizer.param_groups}
    saved = [b.detach().clone() for b in model.buffers()]
    try:
        with sdpa_kernel(SDPBackend.MATH):
            loss = loss_fn(model(inputs), targets)
            grads = torch.autograd.grad(loss, params, create_graph=True)
            deltas: list[torch.Tensor] = []
            for (p, group), g in zip(pairs, grads):
                rate, adam = rates[id(group)]
                gd_ = g.detach()
                d = _adam_direction(optimizer, group, p, gd_) if adam else gd_
                deltas.append(rate * d)
            # a gradient with no graph (its parameter enters the loss linearly) has no curvature: H delta = 0 there
            live = [i for i, g in enumerate(grads) if g.requires_grad]
            got = torch.autograd.grad([grads[i] for i in live], params, grad_outputs=[deltas[i] for i in live],
                                      allow_unused=True) if live else [None] * len(params)
            hvp = list(got)
    finally:
        with torch.no_grad():
            for b, s in zip(model.buffers(), saved):
                b.copy_(s)
    gd = _sum_dots([g.detach() for g in grads], deltas)
    dhd = _sum_dots(deltas, [torch.zeros_like(d) if hv is None else hv.detach() for d, hv in zip(deltas, hvp)])
    both = torch.stack([gd, dhd]).to(torch.float64)
    both = (reduce or _default_reduce)(both)
    gd_f, dhd_f = (float(x) for x in both.tolist())          # the one host read
    h = math.nan if not gd_f > 0 else (math.inf if dhd_f <= 0 else 2.0 * gd_f / dhd_f)
    eps_eff = rates[id(pairs[0][1])][0]
    return HeadroomProbe(h=h, eps_max=h * eps_eff / 2.0, eps_eff=eps_eff, gd=gd_f, dhd=dhd_f)


def _sum_dots(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum_i <a_i, b_i> as a 0-d tensor on the parameters' device (no host read)."""
    return torch.stack([(x.to(torch.float64) * y.to(torch.float64)).sum() for x, y in zip(a, b)]).sum()
