"""What a communication backend is: the :class:`Backend` protocol both backends implement as classes.

runtime/comm/seam.py holds one Backend and forwards every collective to it; the two implementations are
``TorchBackend`` (runtime/comm/torch_backend.py: torch.distributed, DistributedDataParallel for the gradients)
and ``HorovodBackend`` (runtime/comm/horovod_backend.py, the only module that imports horovod). Each module ends
with ``_CHECK: type[Backend] = <its class>``, so mypy checks both against this one protocol, and the protocol is
``runtime_checkable`` (tests/test_backend_protocol.py asserts ``isinstance`` of both).

Collective names are Horovod's: it negotiates a collective by its name across ranks (so an asynchronous sum may
start in a different order on different ranks), and an unnamed object collective gets a name from the object's
type, which differs between the root and the others. torch.distributed has no names: it matches collectives by
the order of the calls on a group, the same on every rank. Every caller names its collectives all the same
(the seam's functions keep their ``name`` arguments, so a caller need not know the backend): the Horovod backend
passes them on, naming what Horovod would otherwise name badly, and the torch backend ignores them, but for
picking the process group of a sum (the stop-signal agreement ``hj.safepoint``, which stays in flight across an
iteration, has a group of its own: ``torch_backend.stream_of``).

Handles of asynchronous sums are the backend's own (Horovod's integer, torch's ``Handle``): only the backend
that made one waits for it, so the protocol types them as ``Any``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from hpc_jabas.errors import JabasError
from hpc_jabas.runtime.comm.reducer import GradReducer, StartSum, WaitSum

#: what ``broadcast_parameters`` takes: a state_dict, or (name, tensor) pairs
Params = Mapping[str, Any] | Iterable[tuple[str, Any]]


@runtime_checkable
class Backend(Protocol):
    """One communication backend of this process: its life (``init`` .. ``shutdown``), the ranks, the
    collectives the seam forwards, the gradient reducer, and what the backend says about itself."""

    #: "torch" or "horovod" (the config key's value)
    name: str

    # ---- life ---------------------------------------------------------------------------------------------
    def init(self) -> None:
        """Start (a no-op when started): every rank of the world meets here."""
        ...

    def is_initialized(self) -> bool: ...

    def shutdown(self) -> None:
        """End it in this process (a later :meth:`init` starts it again)."""
        ...

    # ---- the ranks ----------------------------------------------------------------------------------------
    def rank(self) -> int: ...

    def size(self) -> int:
        """The world size (ValueError when not initialised)."""
        ...

    def local_rank(self) -> int: ...

    def device(self) -> torch.device:
        """One CUDA device per local rank when CUDA is present, else the CPU."""
        ...

    # ---- sums ---------------------------------------------------------------------------------------------
    def allreduce_sum_async_(self, t: torch.Tensor, name: str, postscale: float = 1.0) -> Any:
        """In-place asynchronous sum of ``t`` over ranks, times ``postscale`` (the same on every rank); a handle
        for :meth:`synchronize`."""
        ...

    def synchronize(self, handle: Any) -> torch.Tensor:
        """Wait for an asynchronous sum; its tensor."""
        ...

    def allreduce_sum(self, t: torch.Tensor, name: str | None = None) -> torch.Tensor:
        """The sum over ranks, a new tensor (blocking)."""
        ...

    def weighted_mean(self, t: torch.Tensor, weight: float, total: float, name: str | None = None) -> torch.Tensor:
        """sum_i weight_i * t_i / total over ranks; ``total`` the same on every rank."""
        ...

    # ---- objects and parameters ---------------------------------------------------------------------------
    def broadcast_object(self, obj: Any, root_rank: int = 0, name: str | None = None) -> Any: ...

    def allgather_object(self, obj: Any, name: str | None = None) -> list[Any]: ...

    def allgather_tensor(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """Every rank's ``t`` concatenated along dim 0, in rank order (first dims may differ)."""
        ...

    def broadcast_parameters(self, params: Params, root_rank: int = 0) -> None:
        """Rank ``root_rank``'s tensors to every rank, in place."""
        ...

    # ---- the gradients ------------------------------------------------------------------------------------
    def make_reducer(self, named_parameters: Sequence[tuple[str, torch.Tensor]], start: StartSum, wait: WaitSum,
                     model: torch.nn.Module | None = None, overlap: bool = True, bucket_cap_mb: float | None = None,
                     **ddp_options: bool) -> GradReducer:
        """The backend's gradient reducer (runtime/comm/reducer.py); ``start``/``wait``: the seam's sums."""
        ...

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer, named_parameters: Any, **kw: Any) -> Any:
        """The backend's own equal-split optimizer wrapper (the baselines in bench/); ConfigError if none."""
        ...

    # ---- what it says about itself ------------------------------------------------------------------------
    def build_info(self) -> dict[str, Any]: ...

    def controller(self) -> str:
        """How this world's ranks found each other (Horovod: mpi or gloo; torch: the launcher)."""
        ...

    def peer_lost(self, exc: BaseException) -> JabasError | None:
        """The one-line error ``exc`` (a failed collective) stands for when another rank is gone; else None."""
        ...
