"""The Horovod backend (:class:`HorovodBackend`, a runtime/comm/backend.py ``Backend``), and the only module that
imports horovod. Code calls it through ``hpc_jabas.runtime.comm.seam`` (which picks the backend).

Horovod negotiates every collective by its name: the callers' names are passed on, and an object collective
without one gets a fixed name here (Horovod would name it after the object's type, which differs between the
root and the others: a hang).

Weighted allreduce (docs/formulas.md, section 1): Horovod refuses pre/postscale factors that differ
between ranks, so each rank scales its own local gradient (by its sample count, or its weight),
then one ``op=Sum`` allreduce runs with a postscale factor that is the same on every rank.
"""
from __future__ import annotations

import datetime
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

import cloudpickle
import horovod
import horovod.torch as hvd
import torch

from hpc_jabas import settings
from hpc_jabas.log import get_logger, set_rank
from hpc_jabas.runtime.comm.backend import Backend, Params
from hpc_jabas.runtime.comm.reducer import GradReducer, HookReducer, StartSum, WaitSum
from hpc_jabas.runtime.comm.rendezvous import poll_until

log = get_logger(__name__)

NAME = "horovod"

#: a hung rank: Horovod warns after 60 s and shuts the job down after 300 s (the chain then resubmits it from the
#: last checkpoint) instead of holding the allocation for ever; the environment's own values win
STALL_DEFAULTS = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "60", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "300"}

#: the longest sleep between two polls of a pending collective (seconds)
WAIT_POLL_MAX_S = 1e-3


def build_info() -> dict[str, Any]:
    """What this Horovod build supports (the same facts as `horovodrun --check-build`); no init needed."""
    return {
        "version": horovod.__version__,
        "pytorch": True,
        "mpi_built": bool(hvd.mpi_built()),
        "gloo_built": bool(hvd.gloo_built()),
        "nccl_built": bool(hvd.nccl_built()),
        "cuda_built": bool(hvd.cuda_built()),
    }


def _dumps(obj: Any) -> bytes:
    b = io.BytesIO()
    cloudpickle.dump(obj, b)
    return b.getvalue()


def _loads(data: bytes) -> Any:
    """An object a rank of this job sent (Horovod's own object collectives unpickle the same way)."""
    return cloudpickle.loads(data)


class HorovodBackend:
    """Horovod for runtime/comm/seam.py: one instance per started backend (Horovod itself is one per process)."""

    name = NAME

    def __init__(self) -> None:
        self._initialized = False
        self._hb_server: Any = None     # rank 0: the heartbeat's store (runtime/comm/heartbeat.py), kept while it runs

    # ---- life ---------------------------------------------------------------------------------------------
    def init(self) -> None:
        if not self._initialized:
            for k, v in STALL_DEFAULTS.items():
                os.environ.setdefault(k, v)
            hvd.init()
            self._initialized = True
            set_rank(hvd.rank())          # log lines carry the rank; INFO from rank 0 only
            self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        """A hung rank named in seconds (runtime/comm/heartbeat.py), where Horovod's stall check only warns: rank 0
        hosts a small TCPStore (torch.distributed's, no process group) and tells its addresses over Horovod
        itself; each rank's watchdog thread has a client of its own."""
        hb_s = settings.heartbeat_s()
        if hb_s <= 0 or hvd.size() < 2:
            return
        import torch.distributed as dist

        from hpc_jabas.runtime.comm import heartbeat
        from hpc_jabas.runtime.comm.rendezvous import addresses, reachable
        timeout = datetime.timedelta(seconds=hb_s)
        info = None
        if hvd.rank() == 0:
            try:
                self._hb_server = dist.TCPStore("0.0.0.0", 0, None, True, wait_for_workers=False, timeout=timeout)
                info = (addresses(), int(self._hb_server.port))
            except Exception as e:          # every rank still takes part in the broadcast below
                log.warning("no heartbeat watchdog (%s): Horovod's stall shutdown (%s s) ends a hung job", e,
                            os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"))
        info = hvd.broadcast_object(info, root_rank=0, name="hj.heartbeat")
        if info is None:
            return
        try:
            addrs, port = info
            addr = "127.0.0.1" if hvd.rank() == 0 else reachable(addrs, port)
            client = dist.TCPStore(addr, port, is_master=False, wait_for_workers=False, timeout=timeout)
            heartbeat.start(dist.PrefixStore("hj.hb/", client), hvd.rank(), hvd.size(), hb_s, 0)
        except Exception as e:
            log.warning("no heartbeat watchdog (%s): Horovod's stall shutdown ends a hung job", e)

    def is_initialized(self) -> bool:
        return self._initialized

    def shutdown(self) -> None:
        """Stop Horovod in this process; a later :meth:`init` starts it again. (Under MPI that needs MPI to have
        been initialised by someone else, e.g. mpi4py: Horovod finalises an MPI it initialised itself.)"""
        if self._initialized:
            hvd.shutdown()
            self._initialized = False

    # ---- the ranks ----------------------------------------------------------------------------------------
    def rank(self) -> int:
        return int(hvd.rank())

    def size(self) -> int:
        return int(hvd.size())

    def local_rank(self) -> int:
        return int(hvd.local_rank())

    def device(self) -> torch.device:
        """One CUDA device per local rank when CUDA is present, else the CPU."""
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            idx = self.local_rank() % torch.cuda.device_count()
            torch.cuda.set_device(idx)
            return torch.device("cuda", idx)
        return torch.device("cpu")

    def peer_lost(self, exc: BaseException) -> None:
        """None: under mpirun, mpirun itself ends the job when a rank is gone, and says which."""
        return None

    # ---- sums ---------------------------------------------------------------------------------------------
    def allreduce_sum_async_(self, t: torch.Tensor, name: str, postscale: float = 1.0) -> Any:
        """In-place asynchronous sum with one postscale factor shared by all ranks; returns a handle."""
        return hvd.allreduce_async_(t, name=name, op=hvd.Sum, postscale_factor=float(postscale))

    def synchronize(self, handle: Any) -> torch.Tensor:
        """Horovod's ``synchronize``, waiting politely: Horovod's own wait polls the handle every 100 ns
        (``std::this_thread::sleep_for``), which made a rank that waits for a slower one burn most of a core, in
        system calls (a 3-rank emulated run: 63 CPU-s in 38 s). Here the handle is polled with sleeps that grow
        with the wait, each at most a tenth of the time waited so far and at most WAIT_POLL_MAX_S: a wait of w
        seconds ends at most max(w/10, 50 us) (and 1 ms) after the collective completed. Then Horovod's own
        synchronize returns at once with the result (or raises Horovod's error)."""
        poll_until(lambda: bool(hvd.poll(handle)), WAIT_POLL_MAX_S)
        out: torch.Tensor = hvd.synchronize(handle)
        return out

    def weighted_mean(self, t: torch.Tensor, weight: float, total: float, name: str | None = None) -> torch.Tensor:
        """sum_i weight_i * t_i / total over ranks; ``total`` must be equal on every rank."""
        return self.synchronize(hvd.allreduce_async(t * weight, op=hvd.Sum, postscale_factor=1.0 / float(total),
                                                    name=name))

    def allreduce_sum(self, t: torch.Tensor, name: str | None = None) -> torch.Tensor:
        return self.synchronize(hvd.allreduce_async(t, op=hvd.Sum, name=name))

    # ---- objects and parameters ---------------------------------------------------------------------------
    # Horovod's blocking object and parameter collectives wait in its own spinning loop, so a rank that waits for
    # rank 0 (writing a checkpoint, evaluating, starting later) burned a core: each is built here from Horovod's
    # asynchronous ops and waited for by :meth:`synchronize`. Names, order and payloads are Horovod's own.
    def broadcast_object(self, obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
        # Horovod names an unnamed broadcast after the object's type, so the root's dict and the
        # others' None would never match (a hang): always give every rank the same name.
        name = name or "hj.broadcast_object"
        root = hvd.rank() == root_rank
        data = _dumps(obj) if root else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        self.synchronize(hvd.broadcast_async_(size, root_rank, name=f"{name}.sz"))
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if root else torch.empty(int(size[0]),
                                                                                            dtype=torch.uint8)
        self.synchronize(hvd.broadcast_async_(buf, root_rank, name=f"{name}.t"))
        return obj if root else _loads(buf.numpy().tobytes())

    def allgather_object(self, obj: Any, name: str | None = None) -> list[Any]:
        name = name or "hj.allgather_object"
        data = _dumps(obj)
        sizes = self.allgather_tensor(torch.tensor([len(data)], dtype=torch.int64), name=f"{name}.sz").tolist()
        got = self.allgather_tensor(torch.frombuffer(bytearray(data), dtype=torch.uint8), name=f"{name}.t")
        out, at = [], 0
        for n in sizes:
            out.append(_loads(got[at:at + n].numpy().tobytes()))
            at += n
        return out

    def allgather_tensor(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """Every rank's ``t`` concatenated along dim 0, in rank order (first dims may differ)."""
        return self.synchronize(hvd.allgather_async(t, name=name))

    def broadcast_parameters(self, params: Params, root_rank: int = 0) -> None:
        """Horovod's ``broadcast_parameters`` (a state dict or (name, tensor) pairs, in place), waited for here."""
        items = sorted(params.items()) if isinstance(params, Mapping) else [
            p if isinstance(p, tuple) else (None, p) for p in params]
        handles = [hvd.broadcast_async_(p, root_rank, name=name) for name, p in items]
        for h in handles:
            self.synchronize(h)

    # ---- the gradients ------------------------------------------------------------------------------------
    def make_reducer(self, named_parameters: Sequence[tuple[str, torch.Tensor]], start: StartSum, wait: WaitSum,
                     model: torch.nn.Module | None = None, overlap: bool = True, bucket_cap_mb: float | None = None,
                     **ddp_options: bool) -> GradReducer:
        """Per-parameter named allreduces (``start``/``wait``: the seam's, runtime/comm/seam.py) started from the
        last backward's hooks; Horovod fuses them (its fusion buffer, HOROVOD_FUSION_THRESHOLD, plays the part of
        a bucket size; ``bucket_cap_mb`` and DDP's options, the config refuses with this backend). ``model`` is not
        needed."""
        return HookReducer(named_parameters, self.size(), start, wait, overlap=overlap)

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer, named_parameters: Any, **kw: Any) -> Any:
        """Horovod's own wrapper (used by the equal-split baselines in bench/)."""
        return hvd.DistributedOptimizer(optimizer, named_parameters=named_parameters, **kw)

    # ---- what it says about itself ------------------------------------------------------------------------
    def build_info(self) -> dict[str, Any]:
        return build_info()

    def controller(self) -> str:
        """Which controller this world runs on ('mpi' or 'gloo')."""
        return "mpi" if hvd.mpi_enabled() else "gloo"


#: mypy checks the class against the protocol here
_CHECK: type[Backend] = HorovodBackend
