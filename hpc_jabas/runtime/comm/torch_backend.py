"""The torch.distributed backend (:class:`TorchBackend`, a runtime/comm/backend.py ``Backend``): Gloo on CPU,
NCCL on CUDA (Gloo beside it for CPU tensors).

No Horovod anywhere on this path, and no environment from the user: how the ranks were started and where they
meet is runtime/comm/rendezvous.py's (torchrun, mpirun, srun, or a world of one; docs/backends.md). A process
group this process already has (a DDP script's own ``init_process_group``) is used as it is, and said once in
the log; it is left to its owner at shutdown.

The gradients are reduced by torch's own DistributedDataParallel (runtime/comm/ddp.py's ``DDPReducer``; the
script's own wrap: ``ScriptDDPReducer``; without a model: reducer.py's ``FlatReducer``). Every other sum is one
collective (:meth:`TorchBackend.allreduce_sum_async_`) matched by the order of the calls, the same on every
rank: torch.distributed has no names, so a collective's name is not used, but to pick its process group
(:func:`stream_of`): the default group, except the stop-signal agreement (``hj.safepoint``), which has a group
of its own because it stays in flight across an iteration.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import itertools
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hpc_jabas import settings
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger, set_rank
from hpc_jabas.runtime.comm import heartbeat, launchers
from hpc_jabas.runtime.comm import torch_lost as _lost
from hpc_jabas.runtime.comm.backend import Backend, Params
from hpc_jabas.runtime.comm.ddp import DDPReducer
from hpc_jabas.runtime.comm.reducer import FlatReducer, GradReducer, StartSum, WaitSum
from hpc_jabas.runtime.comm.rendezvous import Launch, launcher, store_for, torchrun_store
from hpc_jabas.runtime.comm.torch_lost import PeerLostError

log = get_logger(__name__)

NAME = "torch"
#: the names whose sums have a process group of their own (every other name: the default group)
STREAMS = ("hj.safepoint",)
#: init()s of this process, whichever instance ran them: every rank counts alike, and a store key of an earlier
#: one is not read (the prefixes of torchrun's store and the heartbeat's carry it)
_INITS = itertools.count(1)


def stream_of(name: str | None) -> str:
    """The group a sum's name goes to: its first two dot-separated parts when they are one of STREAMS, else
    "default" (the default process group, DDP's)."""
    head = ".".join((name or "").split(".")[:2])
    return head if head in STREAMS else "default"


class Handle:
    """What :meth:`TorchBackend.allreduce_sum_async_` returns; :meth:`TorchBackend.synchronize` waits for it."""
    __slots__ = ("work", "t", "buf", "postscale", "done")

    def __init__(self, work: Any, t: torch.Tensor, buf: torch.Tensor, postscale: float):
        self.work, self.t, self.buf, self.postscale, self.done = work, t, buf, float(postscale), False


class TorchBackend:
    """torch.distributed for runtime/comm/seam.py: one instance per started backend; its state (the launch, the
    store, the subgroups, whether the default group is ours) lives here."""

    name = NAME

    def __init__(self) -> None:
        self._initialized = False
        self._launch: Launch | None = None
        self._store: Any = None
        self._groups: dict[str, Any] = {}
        self._owned = False          # this backend made the default process group (else: the script's, left to it)
        self._inits = 0              # this instance's init (_INITS)
        self._inflight = 0           # sums started and not waited for (an exit with one in flight does not shut down)

    # ---- life ---------------------------------------------------------------------------------------------
    def is_initialized(self) -> bool:
        return self._initialized

    def init(self) -> None:
        if self._initialized:
            return
        self._inits = next(_INITS)
        ln = self._launch = launcher()
        cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        if cuda:
            torch.cuda.set_device(ln.local_rank % torch.cuda.device_count())
        timeout = datetime.timedelta(seconds=settings.torch_timeout_s())
        if dist.is_initialized():                  # the script's own init_process_group: used, not fought
            self._owned = False
            set_rank(dist.get_rank())
            backend = str(dist.get_backend())
            self._launch = Launch(ln.how, dist.get_rank(), dist.get_world_size(), ln.local_rank, ln.addr, ln.port,
                                  ln.notes)
            log.info("torch backend: using this process's process group (%s, rank %d of %d): it stays the script's",
                     backend, dist.get_rank(), dist.get_world_size())
        else:
            self._owned = True
            backend = "cpu:gloo,cuda:nccl" if cuda and dist.is_nccl_available() else "gloo"
            self._init_group(ln, backend, timeout)
            set_rank(ln.rank)             # log lines carry the rank; INFO from rank 0 only
            log.info("torch backend: %s, %d rank(s) started by %s", backend, ln.size, ln.how)
        if self._owned and ln.size > 1:       # who this rank is, for a survivor that names a rank that is gone
            with contextlib.suppress(Exception):
                (self._store or dist.distributed_c10d._get_default_store()).set(
                    f"hj.pid.{ln.rank}", f"{socket.gethostname()}:{os.getpid()}")
        for s in STREAMS:                       # every rank, in this order
            self._groups[s] = dist.new_group(backend=None, timeout=timeout)
        self._initialized = True
        atexit.register(self._at_exit)
        self._start_heartbeat()

    def _init_group(self, ln: Launch, backend: str, timeout: datetime.timedelta) -> None:
        """The default process group, met at the launcher's store (runtime/comm/rendezvous.py)."""
        if ln.how == "torchrun" and (store := torchrun_store(ln, timeout, self._inits)) is not None:
            self._store = store
            dist.init_process_group(backend, store=store, rank=ln.rank, world_size=ln.size, timeout=timeout)
        elif ln.how == "torchrun":
            dist.init_process_group(backend, init_method="env://", rank=ln.rank, world_size=ln.size,
                                    timeout=timeout)
        elif ln.size == 1:
            self._store = dist.HashStore()
            dist.init_process_group(backend, store=self._store, rank=0, world_size=1, timeout=timeout)
        else:
            self._store = store_for(ln)
            dist.init_process_group(backend, store=self._store, rank=ln.rank, world_size=ln.size, timeout=timeout)

    def _start_heartbeat(self) -> None:
        """A hung rank named in seconds (runtime/comm/heartbeat.py): a store client of the watchdog's own, to the
        store the process group met at (ours, torchrun's agent's, or the one a script's own init made), with keys
        of this run and attempt. Nothing when the store is not a TCPStore (a world of one, a FileStore)."""
        hb_s = settings.heartbeat_s()
        n = dist.get_world_size()
        if hb_s <= 0 or n < 2:
            return
        try:
            tcp = self._store if self._store is not None else dist.distributed_c10d._get_default_store()
            while hasattr(tcp, "underlying_store"):
                tcp = tcp.underlying_store
            if not isinstance(tcp, dist.TCPStore):
                return
            client = dist.TCPStore(tcp.host, tcp.port, is_master=False, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=hb_s))
            tr = launchers.detect()
            agent = isinstance(tr, launchers.Torchrun) and tr.agent_store
            prefix = (f"hj.hb/{tr.run_id}/{tr.restart_count}/{self._inits}/" if isinstance(tr, launchers.Torchrun)
                      else "hj.hb/")
            heartbeat.start(dist.PrefixStore(prefix, client), dist.get_rank(), n, hb_s, None if agent else 0)
        except Exception as e:                  # the watchdog is a help: the collective timeout stays behind it
            log.warning("torch backend: no heartbeat watchdog (%s): a hung rank is found by the collective "
                        "timeout (HPC_JABAS_TORCH_TIMEOUT_S=%g s)", e, settings.torch_timeout_s())

    def shutdown(self) -> None:
        """Stop torch.distributed in this process (a process group the script made stays; only ours go); a later
        :meth:`init` starts it again."""
        heartbeat.stop(done=True)
        if self._initialized and dist.is_initialized():   # a script that destroyed its group took our subgroups
            for g in self._groups.values():
                if self._owned:
                    break
                dist.destroy_process_group(g)
            if self._owned:
                dist.destroy_process_group()
        if self._initialized:
            self._groups.clear()
            self._store = None
            self._initialized = False
            atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        """At interpreter exit: the process group goes before Python does. Left to the interpreter's
        finalisation, a Gloo worker thread may drop the last reference to a tensor after the GIL is gone, and the
        process aborts (signal 6) after a run that finished (seen on 2 of 8 runs of tests/test_nonroot.py's
        mpirun job)."""
        if not self._initialized or self._inflight:
            return                  # a sum still in flight (an error exit): waiting for it could hang on a peer
        try:
            self.shutdown()
        except Exception as e:      # a peer already gone: nothing left to save, the exit goes on
            log.debug("torch backend: shutdown at exit: %s", e)

    def _need(self) -> None:
        if not self._initialized:
            raise ValueError("the torch backend is not initialised (comm.init() first)")

    # ---- the ranks ----------------------------------------------------------------------------------------
    def rank(self) -> int:
        self._need()
        return dist.get_rank()

    def size(self) -> int:
        self._need()
        return dist.get_world_size()

    def local_rank(self) -> int:
        self._need()
        assert self._launch is not None
        return self._launch.local_rank

    def device(self) -> torch.device:
        """One CUDA device per local rank when CUDA is present, else the CPU."""
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            idx = (self.local_rank() if self._initialized else 0) % torch.cuda.device_count()
            torch.cuda.set_device(idx)
            return torch.device("cuda", idx)
        return torch.device("cpu")

    def peer_lost(self, exc: BaseException) -> PeerLostError | None:
        """The one-line error for a collective that failed because a rank is gone, naming that rank; None for
        anything else (runtime/comm/torch_lost.py)."""
        return _lost.peer_lost(exc, self._initialized, self._store)

    # ---- sums (the gradients go through runtime/comm/ddp.py's reducers) ---------------------------------------
    def allreduce_sum_async_(self, t: torch.Tensor, name: str, postscale: float = 1.0) -> Handle:
        """In-place asynchronous sum with one postscale factor shared by all ranks; returns a handle. One
        collective on the name's group (:func:`stream_of`): every rank starts a group's sums in the same order."""
        self._need()
        buf = t if t.is_contiguous() else t.contiguous()
        work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self._groups.get(stream_of(name)), async_op=True)
        self._inflight += 1
        return Handle(work, t, buf, postscale)

    def synchronize(self, handle: Handle) -> torch.Tensor:
        """Wait for the handle's allreduce; returns its tensor (the postscale applied). Gloo waits on a condition
        variable and NCCL makes the current CUDA stream wait: no spinning, no host sync."""
        if not handle.done:
            handle.work.wait()
            if handle.buf is not handle.t:
                handle.t.copy_(handle.buf)
            if handle.postscale != 1.0:
                handle.t.mul_(handle.postscale)
            handle.done = True
            self._inflight -= 1
        return handle.t

    def weighted_mean(self, t: torch.Tensor, weight: float, total: float, name: str | None = None) -> torch.Tensor:
        """sum_i weight_i * t_i / total over ranks; ``total`` must be equal on every rank (the default group)."""
        self._need()
        out = (t * weight).contiguous()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.mul_(1.0 / float(total))

    def allreduce_sum(self, t: torch.Tensor, name: str | None = None) -> torch.Tensor:
        """The sum over ranks (a new tensor; blocking)."""
        self._need()
        out = t.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    # ---- the gradients ------------------------------------------------------------------------------------
    def make_reducer(self, named_parameters: Sequence[tuple[str, torch.Tensor]], start: StartSum, wait: WaitSum,
                     model: torch.nn.Module | None = None, overlap: bool = True, bucket_cap_mb: float | None = None,
                     **ddp_options: bool) -> GradReducer:
        """DistributedDataParallel around ``model`` (runtime/comm/ddp.py ``DDPReducer``); without one (the
        optimizer wrapper used alone), one fused allreduce of every gradient after the backward
        (runtime/comm/reducer.py ``FlatReducer``). ``start``/``wait``: the seam's sums."""
        self._need()
        if model is not None:
            return DDPReducer(model, start, wait, bucket_cap_mb=bucket_cap_mb, **ddp_options)
        return FlatReducer(named_parameters, self.size(), start, wait)

    def distributed_optimizer(self, optimizer: torch.optim.Optimizer, named_parameters: Any, **kw: Any) -> Any:
        raise ConfigError("the torch backend has no DistributedOptimizer of its own: wrap the model in "
                          "torch.nn.parallel.DistributedDataParallel, or use the Horovod backend")

    # ---- object and parameter collectives (blocking, on the default group) ---------------------------------
    def broadcast_object(self, obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
        self._need()
        box = [obj]
        dist.broadcast_object_list(box, src=root_rank)
        return box[0]

    def allgather_object(self, obj: Any, name: str | None = None) -> list[Any]:
        self._need()
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    def allgather_tensor(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """Every rank's ``t`` concatenated along dim 0, in rank order (first dims may differ)."""
        self._need()
        t = t.contiguous()
        if t.dim() == 0:
            t = t.reshape(1)
        n = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
        ns = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
        dist.all_gather(ns, n)
        sizes = [int(x.item()) for x in ns]
        top = max(sizes)
        pad = torch.zeros((top, *t.shape[1:]), dtype=t.dtype, device=t.device)
        pad[:t.shape[0]] = t
        parts = [torch.empty_like(pad) for _ in sizes]
        dist.all_gather(parts, pad)
        return torch.cat([p[:k] for p, k in zip(parts, sizes)])

    def broadcast_parameters(self, params: Params, root_rank: int = 0) -> None:
        """Rank ``root_rank``'s tensors to every rank, in place (a state_dict or (name, tensor) pairs)."""
        self._need()
        items = sorted(params.items()) if isinstance(params, Mapping) else list(params)
        for _, t in items:
            if isinstance(t, torch.Tensor):
                if t.is_contiguous():
                    dist.broadcast(t.data, src=root_rank)
                else:
                    tmp = t.data.contiguous()
                    dist.broadcast(tmp, src=root_rank)
                    t.data.copy_(tmp)

    # ---- what it says about itself ------------------------------------------------------------------------
    def build_info(self) -> dict[str, Any]:
        """What this torch build offers for torch.distributed."""
        return {"version": torch.__version__, "distributed": dist.is_available(),
                "gloo_built": dist.is_available() and dist.is_gloo_available(),
                "nccl_built": dist.is_available() and dist.is_nccl_available(),
                "mpi_built": dist.is_available() and dist.is_mpi_available(),
                "cuda": torch.cuda.is_available()}

    def controller(self) -> str:
        """How this world's ranks were started: torchrun, mpirun, srun or single."""
        return self._launch.how if self._launch is not None else "none"


#: mypy checks the class against the protocol here
_CHECK: type[Backend] = TorchBackend
