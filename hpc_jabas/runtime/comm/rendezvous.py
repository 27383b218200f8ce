"""How the torch backend's ranks meet (runtime/comm/torch_backend.py): where this process stands in its launcher's
world (:func:`launcher`, from runtime/comm/launchers.py) and the store every rank meets at (:func:`store_for`,
:func:`torchrun_store`); docs/backends.md, section Launching:

* ``torchrun``: its own variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), its agent's store
  under a prefix of the run and attempt;
* ``mpirun`` (Open MPI: OMPI_COMM_WORLD_*; MPICH/Intel MPI: PMI_RANK/PMI_SIZE): rank 0 opens a TCPStore on a
  free port and sends its addresses over mpi4py; every rank takes the first one it can reach;
* ``srun`` (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID; a heterogeneous step's components are one world,
  its ranks numbered across them): the same mpi4py exchange when srun started the ranks with an MPI plugin
  (``--mpi=pmix``, as hpc-jabas's job scripts do); otherwise rank 0's node (the first of the step's node list)
  and a port derived from the job and step ids;
* nothing: a world of one rank.

:func:`addresses` and :func:`reachable` also serve the Horovod backend's heartbeat store.
"""
from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hpc_jabas import settings
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm import launchers

#: how long a rank tries each of rank 0's addresses
CONNECT_TIMEOUT_S = 2.0


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
    """How this process was started (runtime/comm/launchers.py's :func:`~hpc_jabas.runtime.comm.launchers.detect`,
    in its order: torchrun, Open MPI, horovodrun, srun, MPICH's PMI, else one rank)."""
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


def addresses() -> list[str]:
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


def reachable(addrs: list[str], port: int) -> str:
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


def mpi_world(size: int) -> Any:
    """mpi4py's COMM_WORLD when it is there and holds ``size`` ranks (mpirun, or srun with an MPI plugin)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    w = MPI.COMM_WORLD
    return w if w.Get_size() == size else None


def poll_until(done: Callable[[], bool], max_sleep_s: float = 1e-3) -> None:
    """Wait for ``done()`` with sleeps, not by spinning: each sleep at most a tenth of the time waited so far
    (at least 50 us, at most ``max_sleep_s``), so a wait of w seconds ends at most max(w/10, 50 us) late. An MPI
    or Horovod rank blocked in a collective spins a core instead (3.9 CPU-s for a 4 s wait here)."""
    if done():
        return
    t0 = time.perf_counter()
    while not done():
        time.sleep(min(max_sleep_s, max(5e-5, (time.perf_counter() - t0) / 10)))


def polite_barrier(mpi: Any) -> None:
    """Every rank of ``mpi`` here, waited for by :func:`poll_until` (a rank that starts first would otherwise
    spin while the others still import torch)."""
    poll_until(mpi.Ibarrier().Test)


def store_for(ln: Launch) -> Any:
    """The TCPStore every rank meets at (rank 0 hosts it)."""
    timeout = datetime.timedelta(seconds=settings.torch_timeout_s())
    via_mpi = ln.how == "mpirun" or (ln.how == "srun" and bool(ln.notes.get("mpi")))
    mpi = mpi_world(ln.size) if via_mpi and ln.size > 1 else None
    if mpi is not None:
        if ln.rank == 0:
            store = dist.TCPStore("0.0.0.0", 0, ln.size, True, timeout=timeout, wait_for_workers=False)
            polite_barrier(mpi)
            mpi.bcast((addresses(), int(store.port)), root=0)
            reached = [a for a in mpi.gather(None, root=0) if a is not None]
            # Gloo advertises the address this rank's host name resolves to, which may be a loopback: name the
            # interface the other ranks reached rank 0 on
            remote = next((a for a in reached if not a.startswith("127.")), None)
            _gloo_interface(remote, own=True)
            return store
        polite_barrier(mpi)
        addrs, port = mpi.bcast(None, root=0)
        addr = reachable(addrs, port)
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


def torchrun_store(ln: Launch, timeout: datetime.timedelta, inits: int) -> Any:
    """Under torchrun whose agent hosts the store (``TORCHELASTIC_USE_AGENT_STORE``, torchrun's default): a
    client of that store under a prefix of this run and attempt. torch's own ``env://`` takes the agent's store
    without one, so a restarted attempt (``--max-restarts``) may read the previous attempt's Gloo addresses, and
    its connect then fails ("Connection refused") or waits for the timeout. None: rank 0 hosts a fresh store at
    every attempt (``env://`` is right then)."""
    tr = launchers.detect()
    if not isinstance(tr, launchers.Torchrun) or not tr.agent_store or ln.addr is None or ln.port is None:
        return None
    client = dist.TCPStore(ln.addr, ln.port, ln.size, False, timeout=timeout)
    return dist.PrefixStore(f"hj/{tr.run_id}/attempt_{tr.restart_count}/{inits}/", client)
