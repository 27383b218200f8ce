"""One iteration of one rank, as the Trainer hands it on: ``StepRecord``.

``Trainer.train_step`` returns it and gives it, after the step, to the controller (``after_step``), the
calibrator, the iteration metrics, the epoch-end hook and every callback (``on_step_end``). Its fields are this
rank's numbers of the iteration; ``stats`` (the gradient statistics of a measuring iteration) may come one
iteration later, when the controller defers their read (``Controller.defers_stats``).

Scripts written against the earlier plain-dict record keep working: ``rec["B"]``, its ``get`` and ``in``,
and ``to_dict()`` read it as that dict was (``lr_warmup`` and ``stats`` present only when
set). The record of the whole job that metrics.jsonl holds (``Callback.on_metrics``) stays a dict.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

#: the keys that the earlier dict held only when set (None here: absent there)
_OPTIONAL = ("lr_warmup", "stats")


@dataclass(eq=False)
class StepRecord:
    """This rank's iteration ``it`` (of epoch ``epoch``): the global batch ``B`` of ``samples`` samples (fewer
    on a shrunk epoch tail) under ``plan`` (its text), this rank's micro-batch ``b``, samples ``x`` and
    micro-batch count ``n_local``; seconds: ``compute_s`` (``real_compute_s`` plus an emulated GPU's
    ``emulation_wait_s``), ``wait_s`` (the reduction and step after the compute), ``iter_s`` (the whole
    iteration); the loss sums (``loss_sum`` over ``loss_weight`` samples), the step's ``lr_scale`` (times
    ``lr_warmup`` while a warm-up runs), whether it ``measure``d the gradient statistics (``stats``, their
    dict, once read), whether amp ``skipped`` the step, the emulated ``slowdown`` and the decisions' contained
    errors so far."""

    it: int
    epoch: int
    rank: int
    B: int
    samples: int
    plan: str
    b: int
    x: int
    n_local: int
    compute_s: float
    real_compute_s: float
    emulation_wait_s: float
    wait_s: float
    iter_s: float
    loss_sum: float
    loss_weight: float
    lr_scale: float
    measure: bool
    skipped: bool
    slowdown: float
    lr_warmup: float | None = None
    stats: dict[str, Any] | None = None
    contained_errors: int = 0

    # ---- the earlier dict's reading ------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The record as the earlier dict held it (its keys in its order; ``lr_warmup``/``stats`` when set)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not (f.name in _OPTIONAL and getattr(self, f.name) is None)}

    def keys(self) -> list[str]:
        return list(self.to_dict())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.to_dict()

    def __getitem__(self, key: str) -> Any:
        d = self.to_dict()
        if key not in d:
            raise KeyError(key)
        return d[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)
