"""The one seam every collective goes through: it picks a backend and forwards to it.

Two backends give the same functions with the same meaning (docs/backends.md):

* ``"horovod"`` (runtime/comm/horovod_backend.py, the only module that imports horovod): Horovod's named,
  negotiated collectives, tensor fusion, its MPI or Gloo controller.
* ``"torch"`` (runtime/comm/torch_backend.py): ``torch.distributed``, Gloo on CPU and NCCL on CUDA, with its own
  rendezvous under mpirun, srun or torchrun; the gradients reduced by torch's DistributedDataParallel.

The seam holds one :class:`~hpc_jabas.runtime.comm.backend.Backend` (``TorchBackend`` or ``HorovodBackend``, the
protocol mypy checks both against) and forwards each function here to the method of that name. The gradients go
through a :class:`~hpc_jabas.runtime.comm.reducer.GradReducer` (:func:`make_reducer`); every other collective is a
function here.

The backend is chosen once per process, before the first collective: :func:`use` (the Trainer calls it with the
config's ``backend`` key; ``hpc_jabas.runtime.job.launch`` with the job's) or the ``HPC_JABAS_BACKEND`` environment
variable; ``"auto"`` (the default) is Horovod when ``horovod.torch`` imports, otherwise torch. :func:`shutdown`
ends the backend, and a later :func:`use` may pick another one.

Weighted allreduce (docs/formulas.md, section 1): each rank scales its own local gradient by its sample
count, then one ``Sum`` allreduce runs with a postscale factor that is the same on every rank.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from hpc_jabas import settings
from hpc_jabas.core.config.defaults import BACKENDS
from hpc_jabas.errors import ConfigError, JabasError
from hpc_jabas.runtime.comm import launchers
from hpc_jabas.runtime.comm.backend import Backend, Params
from hpc_jabas.runtime.comm.ddp import ScriptDDPReducer
from hpc_jabas.runtime.comm.reducer import GradReducer

#: the environment variable that picks the backend when no config key does (the config key wins)
ENV = settings.BACKEND

_requested: str | None = None        # what use() asked for ("auto" resolved on first need)
_impl: Backend | None = None         # the backend in use


def check_backend(name: str) -> str:
    """``name`` if it is a backend choice, else ConfigError naming it and the valid ones."""
    if name not in BACKENDS:
        raise ConfigError(f"backend={name!r} is unknown; valid: {', '.join(BACKENDS)}")
    return name


def horovod_importable() -> tuple[bool, str]:
    """(whether ``horovod.torch`` imports here, why not when it does not)."""
    try:
        import hpc_jabas.runtime.comm.horovod_backend  # noqa: F401
    except ImportError as e:
        return False, str(e)
    except Exception as e:                   # a broken build (a symbol missing in its library): not usable
        return False, f"{type(e).__name__}: {e}"
    return True, ""


def _torch_group_exists() -> bool:
    """Whether this process already has a torch.distributed default process group (a DDP script's own)."""
    dist = sys.modules.get("torch.distributed")          # not imported: no group
    return dist is not None and dist.is_available() and dist.is_initialized()


def resolve(name: str) -> str:
    """The backend ``name`` stands for: "auto" is "horovod" when it imports (and neither did torchrun start
    this process nor has it a torch.distributed process group already), else "torch"."""
    check_backend(name)
    if name != "auto":
        return name
    if launchers.Torchrun.detect(os.environ):   # torchrun started the ranks: Horovod cannot form a world there
        return "torch"
    if _torch_group_exists():                   # the script made its process group: the torch backend uses it
        return "torch"
    return "horovod" if horovod_importable()[0] else "torch"


def use(name: str | None) -> str:
    """Pick the backend for this process (None or "auto": HPC_JABAS_BACKEND's, else "auto"); returns the name.
    ConfigError when another backend is already running here (shut it down first)."""
    global _requested
    name = check_backend(name or "auto")
    if name == "auto":                              # the config's auto defers to the environment's choice
        name = settings.backend() or "auto"
    if _impl is not None and _impl.is_initialized():
        if name != "auto" and _impl.name != name:
            raise ConfigError(f"backend={name!r} asked for, but this process already runs the {_impl.name} "
                              "backend; one process runs one backend (comm.shutdown() first)")
        return name
    if _impl is not None and name != "auto" and _impl.name != name:
        _set(None)
    _requested = name
    return name


def _set(b: Backend | None) -> None:
    global _impl
    _impl = b


def _new(name: str) -> Backend:
    """A fresh backend of that name (its module imported on first need; a Horovod that does not import is one
    line naming torch)."""
    if name == "horovod":
        try:
            from hpc_jabas.runtime.comm.horovod_backend import HorovodBackend
        except Exception as e:               # not installed, or a build missing a symbol of its library
            raise ConfigError(f"backend='horovod' but horovod.torch does not import here ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); use backend='torch' (--backend "
                              "torch), or install Horovod built against this torch") from None
        return HorovodBackend()
    from hpc_jabas.runtime.comm.torch_backend import TorchBackend
    return TorchBackend()


def impl() -> Backend:
    """The backend of this process (made on first need, of the backend :func:`use` or the environment picks)."""
    if _impl is None:
        _set(_new(resolve(_requested or settings.backend() or "auto")))
    assert _impl is not None
    return _impl


def backend() -> str:
    """The name of the backend in use (resolving "auto")."""
    return impl().name


def is_initialized() -> bool:
    return _impl is not None and _impl.is_initialized()


def peer_lost(exc: BaseException) -> JabasError | None:
    """The one-line error a failed collective stands for when another rank is gone (the torch backend names it;
    runtime/comm/exits.py asks); None for anything else, or when no backend runs."""
    return _impl.peer_lost(exc) if _impl is not None else None


# ---- the functions every backend gives --------------------------------------------------------------------
def init() -> None:
    """Start the backend; every HPC_JABAS_* variable is checked first (a bad one: its line, before any rank
    waits for another)."""
    settings.check()
    impl().init()


def script_backend() -> str | None:
    """The backend the script itself started, if any: "horovod" when it called ``hvd.init()``, "torch" when it
    has a default torch.distributed process group (its own ``init_process_group``), else None."""
    hvd = sys.modules.get("horovod.torch")              # not imported: the script did not start Horovod
    if hvd is not None and getattr(hvd, "is_initialized", lambda: False)():
        return "horovod"
    return "torch" if _torch_group_exists() else None


def adopt() -> bool:
    """Whether a backend runs in this process, starting ours on the script's own initialisation when the
    script made one (``hvd.init()``, ``dist.init_process_group(...)``): the layer needs no call of its own.
    False when nothing is initialised (``hpc_jabas.init()`` starts a backend for a script that starts none)."""
    if is_initialized():
        return True
    name = script_backend()
    if name is None:
        return False
    use(name)
    init()
    return True


def shutdown() -> None:
    """End the backend in this process (a later :func:`init` starts it again; :func:`use` may pick another)."""
    global _requested
    if _impl is not None:
        _impl.shutdown()
        _set(None)
    _requested = None


def rank() -> int:
    return impl().rank()


def size() -> int:
    """The world size (ValueError when the backend is not initialised: one process, e.g. the profiler)."""
    return impl().size()


def local_rank() -> int:
    return impl().local_rank()


def device() -> torch.device:
    """One CUDA device per local rank when CUDA is present, else the CPU."""
    return impl().device()


def weighted_mean(t: torch.Tensor, weight: float, total: float, name: str | None = None) -> torch.Tensor:
    """sum_i weight_i * t_i / total over ranks; ``total`` must be equal on every rank."""
    return impl().weighted_mean(t, weight, total, name=name)


def make_reducer(named_parameters: Sequence[tuple[str, Any]], model: Any = None, overlap: bool = True,
                 bucket_cap_mb: float | None = None, **ddp_options: bool) -> GradReducer:
    """The backend's gradient reducer (runtime/comm/reducer.py) of these parameters: Horovod's per-parameter hooks;
    on torch, DistributedDataParallel around ``model`` (the forward then runs through ``reducer.module``), the
    script's own DDP wrap when ``model`` is one (``ScriptDDPReducer``), or without a model one fused allreduce of
    every gradient."""
    # the seam's own sum functions, looked up at each call (a test may wrap comm.synchronize)
    def start(t: torch.Tensor, name: str, post: float) -> Any:
        return allreduce_sum_async_(t, name, post)

    def wait(h: Any) -> torch.Tensor:
        return synchronize(h)

    from torch.nn.parallel import DistributedDataParallel
    if isinstance(model, DistributedDataParallel) and backend() == "torch":     # the script's own wrap
        return ScriptDDPReducer(model, start, wait)
    return impl().make_reducer(list(named_parameters), start, wait, model=model, overlap=overlap,
                               bucket_cap_mb=bucket_cap_mb,
                               **ddp_options)      # DDP's find_unused_parameters (torch; passed only when set)


def allreduce_sum_async_(t: torch.Tensor, name: str, postscale: float = 1.0) -> Any:
    """In-place asynchronous sum with one postscale factor shared by all ranks; returns a handle for
    :func:`synchronize`. Every rank starts the same names in the same order (Horovod matches them by name,
    torch.distributed by the order of the calls)."""
    return impl().allreduce_sum_async_(t, name=name, postscale=postscale)


def synchronize(handle: Any) -> torch.Tensor:
    """Wait for an asynchronous collective; returns its tensor."""
    return impl().synchronize(handle)


def allreduce_sum(t: torch.Tensor, name: str | None = None) -> torch.Tensor:
    return impl().allreduce_sum(t, name=name)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    return impl().broadcast_object(obj, root_rank=root_rank, name=name)


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    return impl().allgather_object(obj, name=name)


def allgather_tensor(t: torch.Tensor, name: str) -> torch.Tensor:
    """Every rank's ``t`` concatenated along dim 0, in rank order (first dims may differ)."""
    return impl().allgather_tensor(t, name=name)


def broadcast_parameters(params: Params, root_rank: int = 0) -> None:
    impl().broadcast_parameters(params, root_rank=root_rank)


def distributed_optimizer(optimizer: torch.optim.Optimizer, named_parameters: Any, **kw: Any) -> Any:
    """The backend's own equal-split wrapper (Horovod's DistributedOptimizer; used by the baselines in bench/)."""
    return impl().distributed_optimizer(optimizer, named_parameters, **kw)


def build_info() -> dict[str, Any]:
    """What the backend's build supports (Horovod: `horovodrun --check-build`'s facts)."""
    return impl().build_info()


def controller() -> str:
    """How this world's ranks found each other (Horovod: 'mpi' or 'gloo'; torch: the launcher)."""
    return impl().controller()
