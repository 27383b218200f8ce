"""The one decision protocol: rank 0 decides, the decision is broadcast, every rank applies it.

Batch-size control, online rebalancing and the epoch-end auto-scaler all go through
``DecisionChannel.run``:

1. rank 0 (only) runs ``decide()``; the result is encoded (``to_dict``), decoded again and
   checked (``validate``) there, so a malformed decision is caught on rank 0 before it is sent;
2. ``comm.broadcast_object`` (named ``hj.decide.<name>``) carries one envelope to every rank;
3. every rank decodes the same decision and returns it; the caller applies it at the iteration
   it names (invariant 4).

Step 1 is *contained* (invariant 8): any ``Exception`` there is logged with its traceback,
written to the metrics as a ``contained_error`` record (with the traceback text), counted in
``contained_errors`` (on every rank: the envelope says so) and replaced by the caller's no-op
decision; the collective still completes on every rank and training goes on. Exceptions that are
not ``Exception`` (KeyboardInterrupt, SystemExit) are not contained.
"""
from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from hpc_jabas.log import get_logger

log = get_logger(__name__)


class Encodable(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


class MetricsSink(Protocol):
    def write(self, rec: dict[str, Any]) -> None: ...


D = TypeVar("D", bound=Encodable)
Broadcast = Callable[[Any, str], Any]


def _comm_broadcast(obj: Any, name: str) -> Any:
    from hpc_jabas.runtime.comm import seam as comm
    return comm.broadcast_object(obj, root_rank=0, name=name)


class DecisionChannel:
    """Rank 0 decides, every rank gets the same decision (or the no-op when rank 0's step raised).

    ``broadcast(obj, name)`` defaults to the backend's named object broadcast from rank 0
    (``comm.broadcast_object``: Horovod's or torch.distributed's); tests without ranks pass their own (e.g. the
    identity on a single rank).
    """

    def __init__(self, rank: int, metrics: MetricsSink | None = None, broadcast: Broadcast | None = None) -> None:
        self.rank = rank
        self.metrics = metrics
        self._broadcast = broadcast or _comm_broadcast
        self.contained_errors = 0

    def run(self, name: str, iteration: int, decide: Callable[[], D | None], decode: Callable[[dict[str, Any]], D],
            noop: Callable[[], D | None] | None = None,
            validate: Callable[[D], None] | None = None) -> D | None:
        """Collective: every rank calls it with the same ``name`` at the same point.

        ``decide``, ``noop`` and ``validate`` run on rank 0 only. Returns the decoded decision
        (identical on every rank), or None when rank 0 decided nothing.
        """
        envelope: dict[str, Any] | None = None
        if self.rank == 0:
            envelope = self._decide(name, iteration, decide, decode, noop, validate)
        envelope = self._broadcast(envelope, f"hj.decide.{name}")
        if not isinstance(envelope, dict) or "decision" not in envelope:
            raise RuntimeError(f"decision round {name!r} at iteration {iteration}: malformed envelope {envelope!r}")
        if envelope.get("error") is not None:
            self.contained_errors += 1
        payload = envelope["decision"]
        return decode(payload) if payload is not None else None

    # ---- rank 0 ----------------------------------------------------------------------------
    def _decide(self, name: str, iteration: int, decide: Callable[[], D | None],
                decode: Callable[[dict[str, Any]], D], noop: Callable[[], D | None] | None,
                validate: Callable[[D], None] | None) -> dict[str, Any]:
        try:
            return {"decision": self._encode(decide(), decode, validate), "error": None}
        except Exception as e:   # nothing on rank 0 may take the job down
            error = f"{type(e).__name__}: {e}"
            tb = traceback.format_exc()
            log.exception("decision step %r at iteration %d raised; broadcasting a no-op and going on",
                          name, iteration)
        payload = None
        if noop is not None:
            try:
                payload = self._encode(noop(), decode, validate)
            except Exception:
                log.exception("the no-op decision for %r failed as well; broadcasting none", name)
        self._record(name, iteration, error, tb)
        return {"decision": payload, "error": error}

    @staticmethod
    def _encode(d: D | None, decode: Callable[[dict[str, Any]], D],
                validate: Callable[[D], None] | None) -> dict[str, Any] | None:
        if d is None:
            return None
        payload = d.to_dict()
        back = decode(payload)                  # what the other ranks will see
        if validate is not None:
            validate(back)
        return payload

    def _record(self, name: str, iteration: int, error: str, tb: str) -> None:
        if self.metrics is None:
            return
        try:
            self.metrics.write({"type": "contained_error", "stage": name, "it": iteration, "error": error,
                                "traceback": tb, "count": self.contained_errors + 1})
        except Exception:
            log.exception("could not write the contained_error record")

    # ---- checkpoint ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"contained_errors": self.contained_errors}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.contained_errors = int(d.get("contained_errors", 0))
