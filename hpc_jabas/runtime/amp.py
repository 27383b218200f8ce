"""Automatic mixed precision for the HeterogeneousOptimizer (config key ``amp``).

- ``"bf16"``: each micro-batch's forward runs under ``torch.autocast(device_type, torch.bfloat16)``;
  gradients and the allreduce stay in the parameters' dtype. No loss scaling.
- ``"fp16"``: autocast fp16 plus a ``torch.amp.GradScaler``: the backward runs on the scaled loss,
  the weighted allreduce sums scaled gradients, then they are unscaled and checked for inf/nan.
  The check runs on the reduced gradients (identical on every rank) and its flag is allreduced as
  well, so every rank takes the same skip decision even if a reduction were not bit-identical
  across ranks. A skipped step does not touch the parameters or the optimizer state; the scale
  backs off as GradScaler does. The scaler's state rides in the optimizer's ``state_dict``
  (key ``hj_grad_scaler``), so checkpoints carry it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hpc_jabas.core.config.defaults import AMP_MODES
from hpc_jabas.runtime.comm import seam as comm

SCALER_KEY = "hj_grad_scaler"


class Amp:
    """The autocast context and, for fp16, the loss scaler of one optimizer."""

    def __init__(self, mode: str, optimizer: torch.optim.Optimizer, device: torch.device):
        if mode not in AMP_MODES:
            raise ValueError(f"amp={mode!r} is invalid; use one of {', '.join(AMP_MODES)}")
        self.mode = mode
        self.device = device
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
        self.optimizer = optimizer
        self.scaler: torch.amp.GradScaler | None = None
        if mode == "fp16":
            self.scaler = torch.amp.GradScaler(device.type)
            optimizer.register_state_dict_post_hook(self._save_hook)
            optimizer.register_load_state_dict_pre_hook(self._load_hook)

    # ---- forward/backward --------------------------------------------------------------------
    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def inv_scale(self) -> torch.Tensor | None:
        """1 / the current scale as a device tensor (None without a scaler); no host sync."""
        if self.scaler is None or self.scaler._scale is None:
            return None
        return self.scaler._scale.double().reciprocal() if self.device.type != "mps" else \
            self.scaler._scale.reciprocal()

    # ---- after the allreduce -----------------------------------------------------------------
    def unscale_and_check(self) -> torch.Tensor | None:
        """Unscale the reduced gradients in place; return the found-inf flag agreed by every rank
        (a device tensor, 1 = skip), or None without a scaler."""
        if self.scaler is None or self.scaler._scale is None:
            return None
        self.scaler.unscale_(self.optimizer)
        found = self.scaler._per_optimizer_states[id(self.optimizer)]["found_inf_per_device"]
        local = sum(v.to(self.device, torch.float32) for v in found.values())
        flag = torch.as_tensor(local, dtype=torch.float32, device=self.device).reshape(1).clone()
        agreed = (comm.allreduce_sum(flag, name="hj.amp.found_inf") > 0).to(torch.float32)
        for v in found.values():
            v.copy_(agreed.reshape(v.shape).to(v.device, v.dtype))
        return agreed.reshape(())

    def update(self) -> None:
        """After the step (taken or skipped): grow or back off the scale."""
        if self.scaler is not None and self.scaler._scale is not None:
            self.scaler.update()

    # ---- state -------------------------------------------------------------------------------
    def _save_hook(self, optimizer: torch.optim.Optimizer, sd: dict[str, Any]) -> dict[str, Any]:
        assert self.scaler is not None
        sd[SCALER_KEY] = self.scaler.state_dict()
        return sd

    def _load_hook(self, optimizer: torch.optim.Optimizer, sd: dict[str, Any]) -> dict[str, Any]:
        assert self.scaler is not None
        sd = dict(sd)
        st = sd.pop(SCALER_KEY, None)
        if st:
            self.scaler.load_state_dict(st)
        return sd
