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
e.g. over Horovod; each rank probes its own batch).

Online (``OnlineProbe``, the controller's ``[adaptive] headroom_probe``): at every ``headroom_every``-th decision
round rank 0 alone probes a fixed probe batch (``headroom_probe`` samples drawn once from the run's seed, read as the
trainer reads micro-batches and fed in micro-batches of the job's b, so BatchNorm normalises as in training) with
the identity for ``reduce`` (no collective: the other ranks wait for the decision's broadcast, which carries h to
them in its record); the dropout mask is the same at every probe and the run's RNG is left as it was. The lr the
step's direction is scaled by is the optimizer's group lr (the scheduler's) times the iteration's lr scale and
warm-up, so h is the headroom of the lr in force.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
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
    return probe_headroom_of(model, lambda m: loss_fn(m(inputs), targets), optimizer, reduce)


def probe_headroom_of(model: torch.nn.Module, loss_of: Callable[[torch.nn.Module], torch.Tensor],
                      optimizer: torch.optim.Optimizer, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      seed: int | None = None) -> HeadroomProbe:
    """``probe_headroom`` with the probe batch's loss as a function of the model (``loss_of(model)``: e.g. the
    sample-weighted mean over micro-batches, as the trainer's ``forward_fn`` computes each). ``seed``: the
    forward runs on a forked RNG seeded so (a dropout mask the same at every probe; the run's RNG untouched)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    pairs: list[tuple[torch.Tensor, dict[str, Any]]] = [
        (p, g) for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if not pairs:
        raise ConfigError("headroom probe: the optimizer holds no parameter that requires grad")
    params = [p for p, _ in pairs]
    rates = {id(g): _group_rate(optimizer, g) for g in optimizer.param_groups}
    saved = [b.detach().clone() for b in model.buffers()]
    cuda = list(range(torch.cuda.device_count())) if seed is not None and torch.cuda.is_available() else []
    try:
        with sdpa_kernel(SDPBackend.MATH), torch.random.fork_rng(devices=cuda, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            loss = loss_of(model)
            grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
            grads = tuple(torch.zeros_like(p) if g is None else g for p, g in zip(params, grads))
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


@runtime_checkable
class ProbeSource(Protocol):
    """What the online probe reads of the trainer (runtime/trainer.py's ``Trainer`` has each)."""

    model: torch.nn.Module
    forward_fn: Callable[[torch.nn.Module, Any], Any]
    feed: Any
    device: torch.device


def _read(feed: Any, idx: list[int]) -> Any:
    """The samples ``idx`` collated as the feed collates a micro-batch, read here, outside the loader's order."""
    loader = getattr(feed, "loader", None)
    if loader is not None:                        # a DataLoader: the dataset's items through its collate_fn
        return loader.collate_fn([feed.dataset[int(i)] for i in idx])
    return feed.fetch(np.asarray(idx, dtype=np.int64))   # a Dataset: random access


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        out = [_to_device(x, device) for x in batch]
        return type(batch)(*out) if hasattr(batch, "_fields") else type(batch)(out)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


class OnlineProbe:
    """The headroom probe at the controller's decision rounds (module docstring): ``n`` samples, every ``every``-th
    round, the probe batch drawn from ``seed``. ``due`` is asked on every rank at every policy round (the same
    answer everywhere); ``measure`` runs on rank 0. Its state (the next round that probes, the last probe, the
    micro-batch size) is in the controller's checkpoint, so a resumed run probes at the same rounds with the same
    batch and reads the same h."""

    def __init__(self, n: int, every: int, seed: int) -> None:
        self.n, self.every, self.seed = int(n), int(every), int(seed)
        self.next_at = 0                          # the first policy round at or after this iteration probes
        self.last: dict[str, Any] | None = None   # the last probe's record
        self.count = 0
        self.b: int | None = None                 # the probe's micro-batch size (the job's b at the first attach)
        self.idx: list[int] = []
        self._batches: list[Any] | None = None

    def attach(self, trainer: Any, samples: int, b: int, optimizer: torch.optim.Optimizer) -> None:
        """Every rank: the sources checked (one ConfigError line each), the probe batch's indices drawn."""
        if not isinstance(trainer, ProbeSource):
            raise ConfigError("headroom_probe needs the Trainer's model, forward_fn and data; this trainer has "
                              "none: set headroom_probe = 0")
        for g in optimizer.param_groups:
            _group_rate(optimizer, g)             # an optimizer the probe cannot read: one line, here
        if any(isinstance(m, torch.nn.SyncBatchNorm) for m in trainer.model.modules()):
            raise ConfigError("headroom_probe runs on rank 0 alone and the model has SyncBatchNorm layers, whose "
                              "forward is collective; set headroom_probe = 0")
        n = min(self.n, int(samples))
        rng = np.random.default_rng([self.seed, 0x4865])      # the probe batch: fixed for the run
        self.idx = sorted(int(i) for i in rng.choice(int(samples), size=n, replace=False))
        if self.b is None:
            self.b = max(1, int(b))

    def due(self, done: int, p: int) -> bool:
        """Every rank, at a policy round after ``done`` iterations: whether this round probes."""
        if done < self.next_at:
            return False
        self.next_at = done + self.every * int(p)
        return True

    def _loss_of(self, trainer: Any) -> Callable[[torch.nn.Module], torch.Tensor]:
        if self._batches is None:
            b = self.b or len(self.idx)
            self._batches = [(_to_device(_read(trainer.feed, self.idx[i:i + b]), trainer.device),
                              len(self.idx[i:i + b])) for i in range(0, len(self.idx), b)]
        batches, fwd = self._batches, trainer.forward_fn

        def loss_of(model: torch.nn.Module) -> torch.Tensor:
            tot: Any = 0.0
            wsum: Any = 0.0
            for batch, count in batches:           # the sample- (or token-) weighted mean over micro-batches
                out = fwd(model, batch)
                loss, w = out if isinstance(out, tuple) else (out, float(count))
                tot = tot + loss * w
                wsum = wsum + w
            return tot / wsum
        return loss_of

    def measure(self, trainer: Any, optimizer: torch.optim.Optimizer, B: int, it: int,
                lr_factor: float) -> dict[str, Any]:
        """Rank 0: one probe at the weights now, the lr in force = the group lr x ``lr_factor`` (the lr scale and
        warm-up); its record (h, the batch B it was measured at, the iteration, eps_max, the effective lr)."""
        model = getattr(trainer.model, "_orig_mod", trainer.model)      # torch.compile's module: the eager one
        pr = probe_headroom_of(model, self._loss_of(trainer), optimizer, reduce=lambda x: x, seed=self.seed)
        f = float(lr_factor) if lr_factor > 0 else 1.0
        self.count += 1
        self.last = {"h": pr.h / f, "B": int(B), "it": int(it), "eps_max": pr.eps_max, "lr_eff": pr.eps_eff * f,
                     "samples": len(self.idx), "probes": self.count}
        return self.last

    def record(self) -> dict[str, Any] | None:
        """The last probe as a decision record carries it (a non-finite h as its text: inf = no edge)."""
        if self.last is None:
            return None
        return {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in self.last.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"next_at": self.next_at, "count": self.count, "b": self.b, "last": self.record()}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.next_at, self.count = int(st.get("next_at", 0)), int(st.get("count", 0))
        self.b = None if st.get("b") is None else int(st["b"])
        last = st.get("last")
        self.last = None if last is None else {k: (float(v) if isinstance(v, str) else v) for k, v in last.items()}
        self._batches = None
