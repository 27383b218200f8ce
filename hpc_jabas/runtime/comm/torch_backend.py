"""The torch.distributed backend of runtime/comm/seam.py: Gloo on CPU, NCCL on CUDA (Gloo beside it for CPU tensors).

No Horovod anywhere on this path, and no environment from the user: :func:`launcher` tells how the ranks were
started, from runtime/comm/launchers.py (docs/backends.md):

* ``torchrun``: its own variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
* ``mpirun`` (Open MPI: OMPI_COMM_WORLD_*; MPICH/Intel MPI: PMI_RANK/PMI_SIZE): rank 0 opens a TCPStore on a
  free port and sends its addresses over mpi4py; every rank takes the first one it can reach;
* ``srun`` (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID; a heterogeneous step's components are one world,
  its ranks numbered across them): the same mpi4py exchange when srun started the ranks with an MPI plugin
  (``--mpi=pmix``, as hpc-jabas's job scripts do); otherwise rank 0's node (the first of the step's node list)
  and a port derived from the job and step ids;
* nothing: a world of one rank.

A process group this process already has (a DDP script's own ``init_process_group``) is used as it is, and
said once in the log; it is left to its owner at shutdown.

The gradients are reduced by torch's own DistributedDataParallel (:class:`DDPReducer`, the backend's
:class:`~hpc_jabas.runtime.comm.reducer.GradReducer`). Every other sum is one collective (:func:`allreduce_sum_async_`)
matched by the order of the calls, the same on every rank: on the default group, except the stop-signal
agreement (``hj.safepoint``), which has a group of its own because it stays in flight across an iteration.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import inspect
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hpc_jabas import settings
from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger, set_rank
from hpc_jabas.runtime.comm import heartbeat, launchers
from hpc_jabas.runtime.comm import torch_lost as _lost
from hpc_jabas.runtime.comm.reducer import FlatReducer, GradReducer, StartSum, WaitSum, ddp_zero_step
from hpc_jabas.runtime.comm.torch_lost import PeerLostError  # noqa: F401  (re-exported)

log = get_logger(__name__)

NAME = "torch"
#: the names whose sums have a process group of their own (every other name: the default group)
STREAMS = ("hj.safepoint",)
#: how long a rank tries each of rank 0's addresses
CONNECT_TIMEOUT_S = 2.0


# ---- how the ranks were started (pure) ---------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """What the launcher's environment says: ``how`` (torchrun | mpirun | srun | single), rank, size,
    local rank; ``addr``/``port``: where rank 0 listens, when the environment says so."""

    how: str
    rank: int
    size: int
    local_rank: int = 0
    addr: str | None = None
    port: int | None = None
    notes: dict[str, str] = field(default_factory=dict)


def launcher(env: Mapping[str, str] | None = None) -> Launch:
    """How this process was started (runtime/comm/launchers.py's :func:`~hpc_jabas.runtime.comm.launchers.detect`, in
    its
    order: torchrun, Open MPI, horovodrun, srun, MPICH's PMI, else one rank)."""
    ln = launchers.detect(env)
    if isinstance(ln, launchers.Horovodrun):
        raise ConfigError("these ranks were started by horovodrun --gloo, where the torch backend cannot meet: "
                          "use backend = \"horovod\", or start them with mpirun, srun or torchrun")
    if isinstance(ln, launchers.Single):
        return Launch("single", 0, 1, 0)
    notes: dict[str, str] = {}
    if isinstance(ln, launchers.Srun):
        notes = {"het": "1" if ln.heterogeneous else "", "mpi": "1" if ln.mpi_plugin else ""}
    return Launch(ln.name, ln.rank, ln.world_size, ln.local_rank, ln.master_addr, ln.master_port, notes)


def stream_of(name: str) -> str:
    """The group a sum's name goes to: its first two dot-separated parts when they are one of STREAMS, else
    "default" (the default process group, DDP's)."""
    head = ".".join(name.split(".")[:2])
    return head if head in STREAMS else "default"


# ---- state -------------------------------------------------------------------------------------------------
_initialized = False
_launch: Launch | None = None
_store: Any = None
_groups: dict[str, Any] = {}
_owned = False          # this backend made the default process group (else: the script's, left to it)
_inits = 0              # init()s of this process: every rank counts alike; keys of an earlier one are not read
_device = torch.device("cpu")


def is_initialized() -> bool:
    return _initialized


def _addresses() -> list[str]:
    """This host's IPv4 addresses, the non-loopback ones first, then its name and the loopback."""
    out: list[str] = []
    try:
        import psutil
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family == socket.AF_INET and not a.address.startswith("127.") and a.address not in out:
                    out.append(a.address)
    except Exception:                     # psutil missing or refusing: the host name still works
        pass
    return out + [socket.gethostname(), "127.0.0.1"]


def _reachable(addrs: list[str], port: int) -> str:
    for a in addrs:
        try:
            with socket.create_connection((a, port), timeout=CONNECT_TIMEOUT_S):
                return a
        except OSError:
            continue
    raise ConfigError(f"rank 0's rendezvous port {port} is not reachable at any of its addresses "
                      f"({', '.join(addrs)}); check that the nodes can reach each other over TCP")


def _gloo_interface(addr: str | None, own: bool) -> None:
    """Tell Gloo (GLOO_SOCKET_IFNAME, unless the user set it) which interface to use: the one that holds ``addr``
    (``own``: rank 0's address that another rank reached) or that routes to it. Nothing for a loopback or None."""
    if addr is None or "GLOO_SOCKET_IFNAME" in os.environ:
        return
    try:
        ip = socket.gethostbyname(addr)
        if ip.startswith("127."):
            return
        if own:
            local = ip
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((ip, 9))               # no packet is sent: the kernel picks the route and source
                local = s.getsockname()[0]
        if local.startswith("127."):
            return
        import psutil
        for name, addrs in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and a.address == local for a in addrs):
                os.environ["GLOO_SOCKET_IFNAME"] = name
                return
    except (OSError, ImportError):
        return


def _mpi_world(size: int):
    """mpi4py's COMM_WORLD when it is there and holds ``size`` ranks (mpirun, or srun with an MPI plugin)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    w = MPI.COMM_WORLD
    return w if w.Get_size() == size else None


def _store_for(ln: Launch):
    """The TCPStore every rank meets at (rank 0 hosts it)."""
    timeout = datetime.timedelta(seconds=settings.torch_timeout_s())
    via_mpi = ln.how == "mpirun" or (ln.how == "srun" and bool(ln.notes.get("mpi")))
    mpi = _mpi_world(ln.size) if via_mpi and ln.size > 1 else None
    if mpi is not None:
        if ln.rank == 0:
            store = dist.TCPStore("0.0.0.0", 0, ln.size, True, timeout=timeout, wait_for_workers=False)
            mpi.bcast((_addresses(), int(store.port)), root=0)
            reached = [a for a in mpi.gather(None, root=0) if a is not None]
            # Gloo advertises the address this rank's host name resolves to, which may be a loopback: name the
            # interface the other ranks reached rank 0 on
            remote = next((a for a in reached if not a.startswith("127.")), None)
            _gloo_interface(remote, own=True)
            return store
        addrs, port = mpi.bcast(None, root=0)
        addr = _reachable(addrs, port)
        mpi.gather(addr, root=0)
        _gloo_interface(addr, own=False)
        return dist.TCPStore(addr, port, ln.size, False, timeout=timeout)
    if ln.how == "mpirun":
        raise ConfigError("the torch backend under mpirun needs mpi4py (pip install mpi4py) to agree on rank 0's "
                          "address")
    if ln.how == "srun" and (ln.notes.get("het") or ln.addr is None):
        raise ConfigError("the torch backend in a heterogeneous srun step needs an srun MPI plugin "
                          "(srun --mpi=pmix) and mpi4py to agree on rank 0's address")
    assert ln.addr is not None and ln.port is not None
    addr = _node_address(ln.addr)
    _gloo_interface(addr, own=ln.rank == 0)
    return dist.TCPStore(addr if ln.rank else "0.0.0.0", ln.port, ln.size, ln.rank == 0, timeout=timeout)


def _node_address(node: str) -> str:
    """A Slurm node's address: its name when that resolves, else its NodeAddr (scontrol show node)."""
    try:
        socket.gethostbyname(node)
        return node
    except OSError:
        pass
    from hpc_jabas.slurm.proc import run  # only under srun, when the node name does not resolve
    from hpc_jabas.slurm.text import parse_scontrol
    rows = parse_scontrol(run(["scontrol", "-o", "show", "node", node], timeout=30))
    addr = rows[0].get("NodeAddr") if rows else None
    if not addr:
        raise ConfigError(f"node {node!r} (rank 0's) has no address: its name does not resolve and scontrol "
                          "gives no NodeAddr; start the ranks with srun --mpi=pmix")
    return addr


def _torchrun_store(ln: Launch, timeout: datetime.timedelta) -> Any:
    """Under torchrun whose agent hosts the store (``TORCHELASTIC_USE_AGENT_STORE``, torchrun's default): a
    client of that store under a prefix of this run and attempt. torch's own ``env://`` takes the agent's store
    without one, so a restarted attempt (``--max-restarts``) may read the previous attempt's Gloo addresses, and
    its connect then fails ("Connection refused") or waits for the timeout. None: rank 0 hosts a fresh store at
    every attempt (``env://`` is right then)."""
    tr = launchers.detect()
    if not isinstance(tr, launchers.Torchrun) or not tr.agent_store or ln.addr is None or ln.port is None:
        return None
    client = dist.TCPStore(ln.addr, ln.port, ln.size, False, timeout=timeout)
    return dist.PrefixStore(f"hj/{tr.run_id}/attempt_{tr.restart_count}/{_inits}/", client)


def init() -> None:
    global _initialized, _launch, _store, _device, _owned, _inits
    if _initialized:
        return
    _inits += 1
    ln = _launch = launcher()
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if cuda:
        idx = ln.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        _device = torch.device("cuda", idx)
    else:
        _device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=settings.torch_timeout_s())
    if dist.is_initialized():                  # the script's own init_process_group: used, not fought
        _owned = False
        set_rank(dist.get_rank())
        backend = str(dist.get_backend())
        _launch = Launch(ln.how, dist.get_rank(), dist.get_world_size(), ln.local_rank, ln.addr, ln.port, ln.notes)
        log.info("torch backend: using this process's process group (%s, rank %d of %d): it stays the script's",
                 backend, dist.get_rank(), dist.get_world_size())
    else:
        _owned = True
        backend = "cpu:gloo,cuda:nccl" if cuda and dist.is_nccl_available() else "gloo"
        if ln.how == "torchrun" and (_store := _torchrun_store(ln, timeout)) is not None:
            dist.init_process_group(backend, store=_store, rank=ln.rank, world_size=ln.size, timeout=timeout)
        elif ln.how == "torchrun":
            dist.init_process_group(backend, init_method="env://", rank=ln.rank, world_size=ln.size,
                                    timeout=timeout)
        elif ln.size == 1:
            _store = dist.HashStore()
            dist.init_process_group(backend, store=_store, rank=0, world_size=1, timeout=timeout)
        else:
            _store = _store_for(ln)
            dist.init_process_group(backend, store=_store, rank=ln.rank, world_size=ln.size, timeout=timeout)
        set_rank(ln.rank)             # log lines carry the rank; INFO from rank 0 only
        log.info("torch backend: %s, %d rank(s) started by %s", backend, ln.size, ln.how)
    if _owned and ln.size > 1:              # who this rank is, for a survivor that names a rank that is gone
        with contextlib.suppress(Exception):
            (_store or dist.distributed_c10d._get_default_store()).set(f"hj.pid.{ln.rank}",
                                                                       f"{socket.gethostname()}:{os.getpid()}")
    for s in STREAMS:                       # every rank, in this order
        _groups[s] = dist.new_group(backend=None, timeout=timeout)
    _initialized = True
    atexit.register(_at_exit)
    _start_heartbeat(ln)


def _start_heartbeat(ln: Launch) -> None:
    """A hung rank named in seconds (runtime/comm/heartbeat.py): a store client of the watchdog's own, to the store
    the process group met at (ours, torchrun's agent's, or the one a script's own init made), with keys of this
    run and attempt. Nothing when the store is not a TCPStore (a world of one, a FileStore)."""
    hb_s = settings.heartbeat_s()
    n = dist.get_world_size()
    if hb_s <= 0 or n < 2:
        return
    try:
        tcp = _store if _store is not None else dist.distributed_c10d._get_default_store()
        while hasattr(tcp, "underlying_store"):
            tcp = tcp.underlying_store
        if not isinstance(tcp, dist.TCPStore):
            return
        client = dist.TCPStore(tcp.host, tcp.port, is_master=False, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=hb_s))
        tr = launchers.detect()
        agent = isinstance(tr, launchers.Torchrun) and tr.agent_store
        prefix = (f"hj.hb/{tr.run_id}/{tr.restart_count}/{_inits}/" if isinstance(tr, launchers.Torchrun)
                  else "hj.hb/")
        heartbeat.start(dist.PrefixStore(prefix, client), dist.get_rank(), n, hb_s, None if agent else 0)
    except Exception as e:                  # the watchdog is a help: the collective timeout stays behind it
        log.warning("torch backend: no heartbeat watchdog (%s): a hung rank is found by the collective timeout "
                    "(HPC_JABAS_TORCH_TIMEOUT_S=%g s)", e, settings.torch_timeout_s())


def shutdown() -> None:
    """Stop torch.distributed in this process (a process group the script made stays; only ours go); a later
    :func:`init` starts it again."""
    global _initialized, _store
    heartbeat.stop(done=True)
    if _initialized and dist.is_initialized():     # a script that destroyed its own group took our subgroups with it
        for g in _groups.values():
            if _owned:
                break
            dist.destroy_process_group(g)
        if _owned:
            dist.destroy_process_group()
    if _initialized:
        _groups.clear()
        _store = None
        _initialized = False


def _at_exit() -> None:
    """At interpreter exit: the process group goes before Python does. Left to the interpreter's finalisation,
    a Gloo worker thread may drop the last reference to a tensor after the GIL is gone, and the process aborts
    (signal 6) after a run that finished (seen on 2 of 8 runs of tests/test_nonroot.py's mpirun job)."""
    if not _initialized or _inflight:
        return                      # a sum still in flight (an error exit): waiting for it could hang on a peer
    try:
        shutdown()
    except Exception as e:          # a peer already gone: nothing left to save, the exit goes on
        log.debug("torch backend: shutdown at exit: %s", e)


def _need() -> None:
    if not _initialized:
        raise ValueError("the torch backend is not initialised (comm.init() first)")


def rank() -> int:
    _need()
    return dist.get_rank()


def size() -> int:
    _need()
    return dist.get_world_size()


def local_rank() -> int:
    _need()
    assert _launch is not None
    return _launch.local_rank


def device() -> torch.device:
    """One CUDA device per local rank when CUDA is present, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        idx = (local_rank() if _initialized else 0) % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    return torch.device("cpu")


# ---- a rank that is gone (runtime/comm/torch_lost.py) --------------------------------------------------------
def peer_lost(exc: BaseException) -> PeerLostError | None:
    """The one-line error for a collective that failed because a rank is gone, naming that rank; None for
    anything else (runtime/comm/torch_lost.py)."""
    return _lost.peer_lost(exc, _initialized, _store)


# ---- asynchronous sums (non-gradient: the gradients go through DDPReducer) ----------------------------------
_inflight = 0          # sums started and not waited for (an exit with one in flight does not shut down)


class Handle:
    """What :func:`allreduce_sum_async_` returns; :func:`synchronize` waits for it."""
    __slots__ = ("work", "t", "buf", "postscale", "done")

    def __init__(self, work: Any, t: torch.Tensor, buf: torch.Tensor, postscale: float):
        self.work, self.t, self.buf, self.postscale, self.done = work, t, buf, float(postscale), False


def allreduce_sum_async_(t: torch.Tensor, name: str, postscale: float = 1.0) -> Handle:
    """In-place asynchronous sum with one postscale factor shared by all ranks; returns a handle. One collective
    on the name's group (:func:`stream_of`): every rank starts a group's sums in the same order."""
    global _inflight
    _need()
    buf = t if t.is_contiguous() else t.contiguous()
    work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=_groups.get(stream_of(name)), async_op=True)
    _inflight += 1
    return Handle(work, t, buf, postscale)


def synchronize(handle: Handle) -> torch.Tensor:
    """Wait for the handle's allreduce; returns its tensor (the postscale applied). Gloo waits on a condition
    variable and NCCL makes the current CUDA stream wait: no spinning, no host sync."""
    global _inflight
    if not handle.done:
        handle.work.wait()
        if handle.buf is not handle.t:
            handle.t.copy_(handle.buf)
        if handle.postscale != 1.0:
            handle.t.mul_(handle.postscale)
        handle.done = True
        _inflight -= 1
    return handle.t


# ---- the gradients: torch's DistributedDataParallel ---------------------------------------------------------
class DDPReducer:
    """The torch backend's :class:`~hpc_jabas.runtime.comm.reducer.GradReducer`: the user's model wrapped in
    ``DistributedDataParallel`` (``gradient_as_bucket_view``: the gradients are views of DDP's buckets, no copies;
    buffers not synced in the forward; ``bucket_cap_mb`` the user's or DDP's 25). The forward runs through
    :attr:`module`; ``no_sync`` is DDP's; DDP's reduction ends inside the last micro-batch's backward, so
    ``finish`` only checks that it ran. DDP averages with its own C++ reduction (no comm hook: each gradient
    scaled by 1/world as it is copied into its bucket, one pass, then a Sum allreduce per bucket): with the
    backward's weighting (``loss x count / c``, c = S / world) the result is the mean gradient of the S samples.
    The moment this rank's compute ends (``on_ready``: the clock stops, an emulated GPU waits, before the last
    bucket's reduction) comes from one tensor hook on the parameter whose gradient the synced backward computes
    last, learned in the first iteration (where a hook on every parameter checks that each gets a gradient)."""

    eager_extras = False
    # set to None between iterations, as torch's zero_grad does: the first backward's AccumulateGrad keeps its
    # tensor and DDP copies it into the bucket (one pass), where zeroing the bucket views in place costs a memset
    # and an add (cProfile: about 1 ms per iteration for a 5M-parameter MLP on the CPU)
    keeps_grads = False

    def __init__(self, model: torch.nn.Module, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False):
        _need()
        from torch.nn.parallel import DistributedDataParallel
        kw: dict[str, Any] = {"gradient_as_bucket_view": True}
        # DDP's knob of the config key of that name: parameters the synced backward does not reach are reduced too
        self.find_unused = kw["find_unused_parameters"] = bool(find_unused_parameters)
        opts = inspect.signature(DistributedDataParallel.__init__).parameters
        # buffers (BatchNorm's statistics) stay each rank's; the Checkpointer averages them at epoch ends
        kw["forward_sync_buffers" if "forward_sync_buffers" in opts else "broadcast_buffers"] = False
        if bucket_cap_mb is not None:
            kw["bucket_cap_mb"] = float(bucket_cap_mb)
        dev = next((p.device for p in model.parameters()), torch.device("cpu"))
        if dev.type == "cuda":
            kw["device_ids"] = [dev.index]
        self.inner = model
        self.ddp = DistributedDataParallel(model, **kw)
        self.module: torch.nn.Module | None = self.ddp
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._synced_forwards = 0
        self._n_local = 0
        self._hook = self.ddp.register_forward_pre_hook(self._count)
        # the first iteration with micro-batches checks that the synced backward reaches every parameter (DDP,
        # with find_unused_parameters=False, would fail at the next forward with a long error of its own)
        self._names = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
        self._unchecked = True
        self._seen: set[int] = set()
        self._probes: list[Any] = []
        self._order: list[int] = []              # the first checked backward's gradient order (parameter ids)
        self._last: Any = None                   # the hook on the parameter whose gradient comes last
        self._ready: Callable[[], None] | None = None

    def on_ready(self, fn: Callable[[], None] | None) -> None:
        self._ready = fn

    def _count(self, module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled() and self.ddp.require_backward_grad_sync:
            self._synced_forwards += 1

    def begin(self, n_local: int) -> None:
        self._n_local = int(n_local)
        self._synced_forwards = 0
        if self._unchecked and self._n_local > 0 and not self._probes:
            self._probes = [p.register_hook(self._probe(id(p))) for p in self._params]

    def _probe(self, key: int) -> Callable[[torch.Tensor], None]:
        def hook(g: torch.Tensor) -> None:
            if self.ddp.require_backward_grad_sync:       # the last micro-batch's (synced) backward
                if key not in self._seen:
                    self._seen.add(key)
                    self._order.append(key)
                if len(self._seen) == len(self._params):
                    self._signal_ready()
        return hook

    def _signal_ready(self) -> None:
        if self._ready is not None:
            self._ready()

    def _on_last(self, g: torch.Tensor) -> None:
        if self.ddp.require_backward_grad_sync:
            self._signal_ready()

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.ddp.no_sync()

    def zero_step(self) -> None:
        """One synced backward of zero gradients, through DDP, without the user's forward (no data, no
        BatchNorm statistics touched): DDP's module is, for this one call, a stand-in whose output is
        ``0 x sum(parameters)``."""
        ddp_zero_step(self.ddp, self.inner, self._params)

    def finish(self) -> None:
        if self._probes:
            for h in self._probes:
                h.remove()
            self._probes, self._unchecked = [], False
            unused = [n for k, n in self._names.items() if k not in self._seen]
            if not unused and self._order and self._last is None:
                last = next(p for p in self._params if id(p) == self._order[-1])
                self._last = last.register_hook(self._on_last)
            self._seen, self._order = set(), []
            if unused and not self.find_unused:
                more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
                raise ConfigError(f"parameter(s) {', '.join(unused[:3])}{more} got no gradient in the last "
                                  "micro-batch's backward: DistributedDataParallel (the torch backend) reduces only "
                                  "parameters the loss uses; set find_unused_parameters = true (--find-unused-"
                                  "parameters), requires_grad=False on the unused ones, or backend='horovod'")
        if self._n_local > 0 and self._synced_forwards == 0:
            raise ConfigError("forward_fn did not call the model it is given: on the torch backend that is the "
                              "DistributedDataParallel wrapper, whose forward starts the gradients' reduction; call "
                              "model(...) on forward_fn's first argument (model.module is your model)")

    def sum_async(self, t: torch.Tensor, name: str) -> _Sum:
        return _Sum(allreduce_sum_async_(t, name))

    def close(self) -> None:
        self._hook.remove()
        if self._last is not None:
            self._last.remove()
            self._last = None


class _Sum:
    __slots__ = ("h",)

    def __init__(self, h: Handle):
        self.h = h

    def wait(self) -> torch.Tensor:
        return synchronize(self.h)


def make_reducer(named_parameters, start: StartSum, wait: WaitSum, model: torch.nn.Module | None = None,
                 overlap: bool = True, bucket_cap_mb: float | None = None, **ddp_options: bool) -> GradReducer:
    """DistributedDataParallel around ``model``; without one (the optimizer wrapper used alone), one fused
    allreduce of every gradient after the backward (runtime/comm/reducer.py ``FlatReducer``, with the seam's
    ``start``/``wait``)."""
    if model is not None:
        return DDPReducer(model, bucket_cap_mb=bucket_cap_mb, **ddp_options)
    return FlatReducer(named_parameters, size(), start, wait)


def weighted_mean(t: torch.Tensor, weight: float, total: float, name: str | None = None) -> torch.Tensor:
    """sum_i weight_i * t_i / total over ranks; ``total`` must be equal on every rank."""
    return synchronize(allreduce_sum_async_(t * weight, name=name or "hj.wm", postscale=1.0 / float(total)))


def allreduce_sum(t: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """The sum over ranks (a new tensor; blocking)."""
    _need()
    out = t.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


# ---- object and parameter collectives (blocking, on the default group) -------------------------------------
def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    _need()
    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]


def allgather_object(obj: Any, name: str | None = None) -> list:
    _need()
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def allgather_tensor(t: torch.Tensor, name: str) -> torch.Tensor:
    """Every rank's ``t`` concatenated along dim 0, in rank order (first dims may differ)."""
    _need()
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


def broadcast_parameters(params, root_rank: int = 0) -> None:
    """Rank ``root_rank``'s tensors to every rank, in place (a state_dict or (name, tensor) pairs)."""
    _need()
    items = sorted(params.items()) if isinstance(params, Mapping) else list(params)
    for _, t in items:
        if isinstance(t, torch.Tensor):
            if t.is_contiguous():
                dist.broadcast(t.data, src=root_rank)
            else:
                tmp = t.data.contiguous()
                dist.broadcast(tmp, src=root_rank)
                t.data.copy_(tmp)


def distributed_optimizer(optimizer, named_parameters, **kw):
    raise ConfigError("the torch backend has no DistributedOptimizer of its own: wrap the model in "
                      "torch.nn.parallel.DistributedDataParallel, or use the Horovod backend")


def build_info() -> dict:
    """What this torch build offers for torch.distributed."""
    return {"version": torch.__version__, "distributed": dist.is_available(),
            "gloo_built": dist.is_available() and dist.is_gloo_available(),
            "nccl_built": dist.is_available() and dist.is_nccl_available(),
            "mpi_built": dist.is_available() and dist.is_mpi_available(),
            "cuda": torch.cuda.is_available()}


def controller() -> str:
    """How this world's ranks were started: torchrun, mpirun, srun or single."""
    return _launch.how if _launch is not None else "none"
