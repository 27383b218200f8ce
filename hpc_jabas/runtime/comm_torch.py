"""The torch.distributed backend of runtime/comm.py: Gloo on CPU, NCCL on CUDA (Gloo beside it for CPU tensors).

No Horovod anywhere on this path, and no environment from the user: :func:`launcher` reads how the ranks were
started (docs/backends.md):

* ``torchrun``: its own variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT);
* ``mpirun`` (Open MPI: OMPI_COMM_WORLD_*; MPICH/Intel MPI: PMI_RANK/PMI_SIZE): rank 0 opens a TCPStore on a
  free port and sends its addresses over mpi4py; every rank takes the first one it can reach;
* ``srun`` (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID; a heterogeneous step's components are one world,
  its ranks numbered across them): the same mpi4py exchange when srun started the ranks with an MPI plugin
  (``--mpi=pmix``, as hpc-jabas's job scripts do); otherwise rank 0's node (the first of the step's node list)
  and a port derived from the job and step ids;
* nothing: a world of one rank.

Same semantics as the Horovod backend. Horovod matches collectives by name, torch.distributed by call order,
so the asynchronous allreduces (:func:`allreduce_sum_async_`) are put in that order here, the same on every rank:

* a name belongs to a *stream*: ``grad`` for the gradients (``hj.g``), a measurement's extra sums (``hj.m``) and
  the token weight (``hj.w``), in that order in its layout; ``hj.safepoint`` for the stop-signal agreement;
  ``other`` for the rest. Each stream has its own process group, made at :func:`init`, so the streams never
  wait on each other's order (the ``grad`` stream is one: on a GPU one NCCL communicator);
* a stream's tensors go into buckets as DistributedDataParallel's do (a bucket closes once it holds its cap:
  1 MB for the first, then 25 MB), except that a CPU tensor of CPU_IN_PLACE_BYTES or more is reduced alone, in
  place (copying it into a bucket and back costs more on a CPU than one more Gloo allreduce); a bucket's flat
  buffer is kept from round to round, as DDP keeps its buckets. The layout is learned in the stream's first
  round, in the order rank 0 saw the tensors (for gradients: the backward's order), sent to the others over the
  stream's group; from then on a bucket's allreduce starts as soon as all its tensors are there and every
  earlier bucket has started, so the gradients' reduction overlaps the rest of the backward, as DDP's does;
* what is not started when a rank waits for one of the stream's tensors (:func:`synchronize`) starts then: the
  complete buckets in the layout's order, then the tensors not in the layout in one new part of it.

The contract (the trainer, the optimizer wrapper and the gradient statistics keep it, as they must for
Horovod): every rank starts the same names of a stream, and starts all of a round's before it waits for any.
One ``Sum`` allreduce per bucket with the postscale applied to each tensor afterwards (the same factor on every
rank; in the copy out of a bucket's buffer, one pass): the weighted reduction of docs/formulas.md, section 1.
"""
from __future__ import annotations

import atexit
import datetime
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hpc_jabas.errors import ConfigError
from hpc_jabas.log import get_logger, set_rank
from hpc_jabas.slurm.env import SlurmEnv

log = get_logger(__name__)

NAME = "torch"
#: the streams that get a process group of their own (every other name goes to "other": started when waited for)
STREAMS = ("grad", "hj.safepoint")
#: the parts of the "grad" stream, in their layout order: the gradients, a measurement's extra sums, the token
#: weight. One stream, so one NCCL communicator: kernels of several communicators issued in different orders on
#: different ranks (a rank without micro-batches starts them in another order) can deadlock a GPU
GRAD_PARTS = ("hj.g", "hj.m", "hj.w")
#: DistributedDataParallel's bucket sizes: a small first bucket (it starts early in the backward), then larger
FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 25 << 20
#: streams whose tensors are reduced in place, one allreduce each: a measurement's half-batch sums are a buffer
#: as large as the parameters already, and a bucket's copy would double it (docs/invariants.md: 1x extra)
IN_PLACE_PREFIXES = ("hj.m.",)
#: a CPU tensor this large is reduced alone, in place: on the CPU, copying it into a bucket and back (two passes
#: over its memory) costs more than one more Gloo allreduce (bench/overhead.py: 4 MB and 16 MB weights, ~8 ms
#: of copies per iteration). On a GPU, copies are cheap next to a collective's launch: DDP's buckets throughout
CPU_IN_PLACE_BYTES = 1 << 20
#: how long a rank waits for the others at the rendezvous and in a collective before it fails (a hung rank)
TIMEOUT_S = float(os.environ.get("HPC_JABAS_TORCH_TIMEOUT_S", "300"))
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


def _int(env: Mapping[str, str], name: str) -> int:
    v = env.get(name, "")
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"{name}={v!r} in the environment is not an integer") from None


def launcher(env: Mapping[str, str] | None = None) -> Launch:
    """How this process was started: torchrun, then mpirun (Open MPI, then PMI), then srun, else one rank."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env or all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return Launch("torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"),
                      _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
                      env.get("MASTER_ADDR"), _int(env, "MASTER_PORT") if "MASTER_PORT" in env else None)
    if "OMPI_COMM_WORLD_RANK" in env:
        return Launch("mpirun", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                      _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if "OMPI_COMM_WORLD_LOCAL_RANK" in env else 0)
    if "HOROVOD_RANK" in env and env.get("HOROVOD_SIZE", "1") != "1":
        raise ConfigError("these ranks were started by horovodrun --gloo, where the torch backend cannot meet: "
                          "use backend = \"horovod\", or start them with mpirun, srun or torchrun")
    senv = SlurmEnv(env)
    if senv.in_step:
        size = senv.step_ntasks or 0
        nodes = senv.step_nodelist or ""
        het = senv.het_size is not None
        addr = None
        if nodes and not het:          # block distribution: rank 0 runs on the step's first node
            from hpc_jabas.slurm.text import expand_hostlist
            first = expand_hostlist(nodes)
            addr = first[0] if first else None
        job = int(senv.job_id or 0)           # a het job's leader id: the same in every component
        sid = senv.step_id or ""
        step = int(sid) if sid.isdigit() else 0
        return Launch("srun", senv.procid or 0, size, senv.localid or 0, addr,
                      20000 + (job * 31 + step) % 20000,
                      # an srun MPI plugin (PMIx, PMI-2) set up MPI: mpi4py may start (without one, MPI_Init aborts)
                      {"het": "1" if het else "", "mpi": "1" if any(k in env for k in ("PMIX_RANK", "PMI_FD")) else ""})
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        return Launch("mpirun", _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"),
                      _int(env, "MPI_LOCALRANKID") if "MPI_LOCALRANKID" in env else 0)
    return Launch("single", 0, 1, 0)


def _head(name: str) -> str:
    return ".".join(name.split(".")[:2])


def stream_of(name: str) -> str:
    """The stream a collective's name belongs to: "grad" for the GRAD_PARTS, else its first two dot-separated
    parts when they are one of STREAMS, else "other"."""
    s = _head(name)
    return "grad" if s in GRAD_PARTS else s if s in STREAMS else "other"


def _part(name: str) -> int:
    """The position of a name's part in the "grad" stream's layout (GRAD_PARTS' order)."""
    s = _head(name)
    return GRAD_PARTS.index(s) if s in GRAD_PARTS else len(GRAD_PARTS)


# ---- state -------------------------------------------------------------------------------------------------
_initialized = False
_launch: Launch | None = None
_store: Any = None
_groups: dict[str, Any] = {}
_streams: dict[str, _Stream] = {}
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
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
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
    from hpc_jabas.slurm.proc import run
    from hpc_jabas.slurm.text import parse_scontrol
    rows = parse_scontrol(run(["scontrol", "-o", "show", "node", node], timeout=30))
    addr = rows[0].get("NodeAddr") if rows else None
    if not addr:
        raise ConfigError(f"node {node!r} (rank 0's) has no address: its name does not resolve and scontrol "
                          "gives no NodeAddr; start the ranks with srun --mpi=pmix")
    return addr


def init() -> None:
    global _initialized, _launch, _store, _device
    if _initialized:
        return
    ln = _launch = launcher()
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if cuda:
        idx = ln.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        _device = torch.device("cuda", idx)
    else:
        _device = torch.device("cpu")
    backend = "cpu:gloo,cuda:nccl" if cuda and dist.is_nccl_available() else "gloo"
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if ln.how == "torchrun":
        dist.init_process_group(backend, init_method="env://", rank=ln.rank, world_size=ln.size, timeout=timeout)
    elif ln.size == 1:
        _store = dist.HashStore()
        dist.init_process_group(backend, store=_store, rank=0, world_size=1, timeout=timeout)
    else:
        _store = _store_for(ln)
        dist.init_process_group(backend, store=_store, rank=ln.rank, world_size=ln.size, timeout=timeout)
    for s in (*STREAMS, "other"):          # every rank, in this order: one group per stream
        _groups[s] = dist.new_group(backend=None)
        _streams[s] = _Stream(s)
    _initialized = True
    atexit.register(_at_exit)
    set_rank(ln.rank)
    log.info("torch backend: %s, %d rank(s) started by %s", backend, ln.size, ln.how)


def shutdown() -> None:
    """Stop torch.distributed in this process; a later :func:`init` starts it again."""
    global _initialized, _store
    if _initialized:
        for st in _streams.values():
            st.drain()
        dist.destroy_process_group()
        _groups.clear()
        _streams.clear()
        _store = None
        _initialized = False


def _at_exit() -> None:
    """At interpreter exit: the process group goes before Python does. Left to the interpreter's finalisation,
    a Gloo worker thread may drop the last reference to a tensor after the GIL is gone, and the process aborts
    (signal 6) after a run that finished (seen on 2 of 8 runs of tests/test_nonroot.py's mpirun job)."""
    if not _initialized or any(st.live or st.pending for st in _streams.values()):
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


# ---- asynchronous sums in buckets --------------------------------------------------------------------------
class _Item:
    __slots__ = ("name", "t", "postscale", "bucket")

    def __init__(self, name: str, t: torch.Tensor, postscale: float):
        self.name, self.t, self.postscale = name, t, float(postscale)
        self.bucket: _Bucket | None = None


class _Bucket:
    """One allreduce of some tensors flattened into one buffer (a tensor alone is reduced in place). ``buf``: the
    layout's buffer for this bucket, kept from round to round (DDP keeps its buckets so: no allocation, no page
    faults, per round), used when its size and dtype fit and no earlier round still holds it."""

    def __init__(self, items: list[_Item], group: Any, buf: torch.Tensor | None = None):
        self.items = items
        for it in items:
            it.bucket = self
        ts = [it.t for it in items]
        self.flat: torch.Tensor | None
        if len(ts) == 1 and ts[0].is_contiguous():
            self.flat = ts[0]
        else:
            dtype = ts[0].dtype
            for t in ts[1:]:
                dtype = torch.promote_types(dtype, t.dtype)
            flats = [t.reshape(-1) for t in ts]
            if buf is not None and buf.dtype == dtype and buf.device == ts[0].device \
                    and buf.numel() == sum(t.numel() for t in ts) and all(t.dtype == dtype for t in ts):
                self.flat = torch.cat(flats, out=buf)
            else:
                self.flat = torch.cat([t.to(dtype) for t in flats])
        self.work = dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, group=group, async_op=True)
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        self.work.wait()
        assert self.flat is not None
        if len(self.items) == 1 and self.flat is self.items[0].t:
            it = self.items[0]
            if it.postscale != 1.0:
                it.t.mul_(it.postscale)
        else:
            off = 0
            for it in self.items:
                n = it.t.numel()
                part = self.flat[off:off + n].view(it.t.shape)
                if it.postscale != 1.0:          # the copy back and the postscale in one pass (same product)
                    torch.mul(part, it.postscale, out=it.t)
                else:
                    it.t.copy_(part)
                off += n
        self.flat = None                  # the bucket lets go of its buffer (the layout keeps a reused one)
        self.items = []                   # and of the tensors (the layout's record of the bucket outlives the round)
        self.done = True


class _Stream:
    """One stream's layout (names in buckets, in order) and this round's tensors (module docstring)."""

    def __init__(self, name: str):
        self.name = name
        self.bucket_of: dict[str, int] = {}     # name -> bucket index in the layout
        self.members: list[list[str]] = []      # bucket index -> its names, in order
        self.pending: dict[str, _Item] = {}     # this round's tensors not started yet
        self.next = 0                           # the first bucket of the layout not started this round
        self.started: set[int] = set()
        self.live: list[_Bucket] = []           # started, not waited for
        self.bufs: dict[str, tuple[torch.Tensor, _Bucket]] = {}   # a layout bucket's first name -> its buffer, user

    def add(self, it: _Item) -> None:
        if it.name in self.pending:
            raise RuntimeError(f"{it.name!r} started twice before it was waited for")
        self.pending[it.name] = it
        if self.name != "other" and it.name in self.bucket_of:
            self._start_ready()

    def _complete(self, b: int) -> bool:
        return all(n in self.pending for n in self.members[b])

    def _start(self, b: int) -> None:
        self._launch([self.pending.pop(n) for n in self.members[b]], keep=True)
        self.started.add(b)

    def _launch(self, items: list[_Item], keep: bool) -> None:
        """Start one bucket; ``keep``: a bucket of the layout, whose flat buffer is kept for the next rounds."""
        key = items[0].name
        held = self.bufs.get(key) if keep else None
        buf = held[0] if held is not None and held[1].done else None     # an earlier round still on it: a new one
        bk = _Bucket(items, _groups[self.name], buf)
        if keep and bk.flat is not None and bk.flat is not items[0].t:
            self.bufs[key] = (bk.flat, bk)
        self.live.append(bk)

    def _start_ready(self) -> None:
        """Start the layout's buckets in order while the next one is complete (the eager, overlapping start)."""
        while self.next < len(self.members) and self._complete(self.next):
            self._start(self.next)
            self.next += 1
        if self.next == len(self.members) and not self.pending:
            self._end_round()                 # every bucket started: the next tensors begin the next round

    def flush(self) -> None:
        """Start everything not started: the complete buckets in the layout's order, then the new names."""
        self._start_ready()
        for b in range(self.next, len(self.members)):
            if b not in self.started and self._complete(b):
                self._start(b)
        if self.pending:
            self._extend()
        self._end_round()

    def _extend(self) -> None:
        """The pending names not in a complete bucket become new buckets, in rank 0's order (sent over the
        stream's group, so every rank gets the same layout)."""
        names = list(self.pending)             # this rank's arrival order
        if self.name == "other":
            order = sorted(names)
        else:
            box: list[Any] = [names]
            dist.broadcast_object_list(box, src=0, group=_groups[self.name])
            order = list(box[0])
            if sorted(order) != sorted(names):
                raise RuntimeError(f"the ranks started different tensors in stream {self.name}: rank 0 "
                                   f"{sorted(order)[:5]}..., this rank {sorted(names)[:5]}...")
        new = [n for n in order if n not in self.bucket_of]
        first = len(self.members)
        buckets: list[list[str]] = []
        for part in range(len(GRAD_PARTS) + 1):       # part by part, so that no bucket mixes two parts
            size, cur = 0, list[str]()
            for n in (n for n in new if _part(n) == part):
                t = self.pending[n].t
                nbytes = t.numel() * t.element_size()
                alone = n.startswith(IN_PLACE_PREFIXES) or (t.device.type == "cpu" and nbytes >= CPU_IN_PLACE_BYTES)
                if cur and (alone or t.dtype != self.pending[cur[0]].t.dtype
                            or t.device != self.pending[cur[0]].t.device):
                    buckets.append(cur)
                    size, cur = 0, []
                cur.append(n)
                size += nbytes
                # DDP's rule: a bucket closes once it holds its cap or more (the first bucket's cap is small)
                cap = FIRST_BUCKET_BYTES if first + len(buckets) == 0 else BUCKET_BYTES
                if alone or size >= cap:
                    buckets.append(cur)
                    size, cur = 0, []
            if cur:
                buckets.append(cur)
        if self.name != "other":
            # the layout part by part (each part's older buckets first): a bucket starts early only when every
            # bucket before it has, and the gradients, in every round, come first
            self.members = sorted(self.members + buckets, key=lambda ns: _part(ns[0]))
            self.bucket_of = {n: b for b, ns in enumerate(self.members) for n in ns}
        # what is still pending: names of the layout whose bucket is incomplete this round, and the new ones
        rest = [n for n in order if n in self.pending and n not in new]
        for ns in buckets:
            self._launch([self.pending.pop(n) for n in ns], keep=self.name != "other")
        if rest:
            self._launch([self.pending.pop(n) for n in rest], keep=False)

    def _end_round(self) -> None:
        self.next = 0
        self.started = set()

    def drain(self) -> None:
        if self.pending:
            self.flush()
        for b in self.live:
            b.wait()
        self.live = []


class Handle:
    """What :func:`allreduce_sum_async_` returns; :func:`synchronize` waits for it."""
    __slots__ = ("item", "stream")

    def __init__(self, item: _Item, stream: _Stream):
        self.item, self.stream = item, stream


def allreduce_sum_async_(t: torch.Tensor, name: str, postscale: float = 1.0) -> Handle:
    """In-place asynchronous sum with one postscale factor shared by all ranks; returns a handle."""
    _need()
    st = _streams[stream_of(name)]
    it = _Item(name, t, postscale)
    st.add(it)
    return Handle(it, st)


def synchronize(handle: Handle) -> torch.Tensor:
    """Wait for the handle's allreduce (starting the stream's tensors not started yet); returns its tensor.
    Gloo waits on a condition variable and NCCL makes the current CUDA stream wait: no spinning, no host sync."""
    it, st = handle.item, handle.stream
    if it.bucket is None:
        st.flush()
    assert it.bucket is not None
    it.bucket.wait()
    st.live = [b for b in st.live if not b.done]
    if not st.pending:
        st._end_round()        # a wait comes after the round's every start (the contract): the round is over
    return it.t


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
