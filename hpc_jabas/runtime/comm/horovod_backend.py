"""The Horovod backend of runtime/comm/seam.py, and the only module that imports horovod: init, ranks, weighted
allreduce, object collectives. Code calls it through ``hpc_jabas.runtime.comm.seam`` (which picks the backend).

Weighted allreduce (docs/formulas.md, section 1): Horovod refuses pre/postscale factors that differ
between ranks, so each rank scales its own local gradient (by its sample count, or its weight),
then one ``op=Sum`` allreduce runs with a postscale factor that is the same on every rank.
"""
from __future__ import annotations

import os
import time
from typing import Any

import horovod
import horovod.torch as hvd
import torch

from hpc_jabas import settings
from hpc_jabas.log import get_logger, set_rank
from hpc_jabas.runtime.comm.reducer import GradReducer, HookReducer, StartSum, WaitSum

_initialized = False
log = get_logger(__name__)


#: a hung rank: Horovod warns after 60 s and shuts the job down after 300 s (the chain then resubmits it from the
#: last checkpoint) instead of holding the allocation for ever; the environment's own values win
STALL_DEFAULTS = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "300"}


def init() -> None:
    global _initialized
    if not _initialized:
        for k, v in STALL_DEFAULTS.items():
            os.environ.setdefault(k, v)
        hvd.init()
        _initialized = True
        set_rank(hvd.rank())          # log lines carry the rank; INFO from rank 0 only
        _start_heartbeat()


_hb_server: Any = None      # rank 0: the heartbeat's store (runtime/comm/heartbeat.py), kept while Horovod runs


def _start_heartbeat() -> None:
    """A hung rank named in seconds (runtime/comm/heartbeat.py), where Horovod's stall check only warns: rank 0 hosts
    a small TCPStore (torch.distributed's, no process group) and tells its addresses over Horovod itself; each
    rank's watchdog thread has a client of its own."""
    global _hb_server
    hb_s = settings.heartbeat_s()
    if hb_s <= 0 or hvd.size() < 2:
        return
    import datetime

    import torch.distributed as dist

    from hpc_jabas.runtime.comm import heartbeat
    from hpc_jabas.runtime.comm.torch_backend import _addresses, _reachable
    timeout = datetime.timedelta(seconds=hb_s)
    info = None
    if hvd.rank() == 0:
        try:
            _hb_server = dist.TCPStore("0.0.0.0", 0, None, True, wait_for_workers=False, timeout=timeout)
            info = (_addresses(), int(_hb_server.port))
        except Exception as e:          # every rank still takes part in the broadcast below
            log.warning("no heartbeat watchdog (%s): Horovod's stall shutdown (%s s) ends a hung job", e,
                        os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"))
    info = hvd.broadcast_object(info, root_rank=0, name="hj.heartbeat")
    if info is None:
        return
    try:
        addrs, port = info
        addr = "127.0.0.1" if hvd.rank() == 0 else _reachable(addrs, port)
        client = dist.TCPStore(addr, port, is_master=False, wait_for_workers=False, timeout=timeout)
        heartbeat.start(dist.PrefixStore("hj.hb/", client), hvd.rank(), hvd.size(), hb_s, 0)
    except Exception as e:
        log.warning("no heartbeat watchdog (%s): Horovod's stall shutdown ends a hung job", e)


def is_initialized() -> bool:
    return _initialized


def shutdown() -> None:
    """Stop Horovod in this process; a later :func:`init` starts it again. (Under MPI that needs MPI to have
    been initialised by someone else, e.g. mpi4py: Horovod finalises an MPI it initialised itself.)"""
    global _initialized
    if _initialized:
        hvd.shutdown()
        _initialized = False


def rank() -> int:
    return hvd.rank()


def size() -> int:
    return hvd.size()


def local_rank() -> int:
    return hvd.local_rank()


def device() -> torch.device:
    """One CUDA device per local rank when CUDA is present, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        idx = local_rank() % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    return torch.device("cpu")


def weighted_mean(t: torch.Tensor, weight: float, total: float, name: str | None = None) -> torch.Tensor:
    """sum_i weight_i * t_i / total over ranks; ``total`` must be equal on every rank."""
    return synchronize(hvd.allreduce_async(t * weight, op=hvd.Sum, postscale_factor=1.0 / float(total), name=name))


def allreduce_sum_async_(t: torch.Tensor, name: str, postscale: float = 1.0):
    """In-place asynchronous sum with one postscale factor shared by all ranks; returns a handle."""
    return hvd.allreduce_async_(t, name=name, op=hvd.Sum, postscale_factor=float(postscale))


#: the longest sleep between two polls of a pending collective (seconds)
WAIT_POLL_MAX_S = 1e-3


def synchronize(handle):
    """Horovod's ``synchronize``, waiting politely: Horovod's own wait polls the handle every 100 ns
    (``std::this_thread::sleep_for``), which made a rank that waits for a slower one burn most of a core, in
    system calls (a 3-rank emulated run: 63 CPU-s in 38 s). Here the handle is polled with sleeps that grow
    with the wait, each at most a tenth of the time waited so far and at most WAIT_POLL_MAX_S: a wait of w
    seconds ends at most max(w/10, 50 us) (and 1 ms) after the collective completed. Then Horovod's own
    synchronize returns at once with the result (or raises Horovod's error)."""
    if not hvd.poll(handle):
        t0 = time.perf_counter()
        while not hvd.poll(handle):
            time.sleep(min(WAIT_POLL_MAX_S, max(5e-5, (time.perf_counter() - t0) / 10)))
    return hvd.synchronize(handle)


def make_reducer(named_parameters, start: StartSum, wait: WaitSum, model: torch.nn.Module | None = None,
                 overlap: bool = True, bucket_cap_mb: float | None = None) -> GradReducer:
    """Per-parameter named allreduces (``start``/``wait``: the seam's, runtime/comm/seam.py) started from the last
    backward's hooks; Horovod fuses them (its fusion buffer, HOROVOD_FUSION_THRESHOLD, plays the part of a
    bucket size; ``bucket_cap_mb``, DDP's, the config refuses with this backend). ``model`` is not needed."""
    return HookReducer(named_parameters, size(), start, wait, overlap=overlap)


def allreduce_sum(t: torch.Tensor, name: str | None = None) -> torch.Tensor:
    return synchronize(hvd.allreduce_async(t, op=hvd.Sum, name=name))


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    # Horovod names an unnamed broadcast after the object's type, so the root's dict and the
    # others' None would never match (a hang): always give every rank the same name.
    return hvd.broadcast_object(obj, root_rank=root_rank, name=name or "hj.broadcast_object")


def allgather_object(obj: Any, name: str | None = None) -> list:
    return hvd.allgather_object(obj, name=name or "hj.allgather_object")


def allgather_tensor(t: torch.Tensor, name: str) -> torch.Tensor:
    """Every rank's ``t`` concatenated along dim 0, in rank order (first dims may differ)."""
    return hvd.allgather(t, name=name)


def broadcast_parameters(params, root_rank: int = 0) -> None:
    hvd.broadcast_parameters(params, root_rank=root_rank)


def distributed_optimizer(optimizer, named_parameters, **kw):
    """Horovod's own wrapper (used by the equal-split baselines in bench/)."""
    return hvd.DistributedOptimizer(optimizer, named_parameters=named_parameters, **kw)


def build_info() -> dict:
    """What this Horovod build supports (the same facts as `horovodrun --check-build`)."""
    return {
        "version": horovod.__version__,
        "pytorch": True,
        "mpi_built": bool(hvd.mpi_built()),
        "gloo_built": bool(hvd.gloo_built()),
        "nccl_built": bool(hvd.nccl_built()),
        "cuda_built": bool(hvd.cuda_built()),
    }


NAME = "horovod"


def controller() -> str:
    """Which controller this world runs on ('mpi' or 'gloo')."""
    return "mpi" if hvd.mpi_enabled() else "gloo"
