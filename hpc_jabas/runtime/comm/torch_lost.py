"""A rank that is gone, on the torch backend: the one-line error a failed collective becomes, naming the lost rank
(the lowest surviving rank says it; a rank that was stopped itself blames nobody). ``TorchBackend.peer_lost``
(runtime/comm/torch_backend.py) calls this module's with its own state (initialised or not, its store); the seam's
``peer_lost`` asks the backend in use, and runtime/comm/exits.py's hook asks the seam."""
from __future__ import annotations

import datetime
import re
import socket
import time
from typing import Any

import torch.distributed as dist

from hpc_jabas import settings
from hpc_jabas.errors import JabasError
from hpc_jabas.runtime.comm import heartbeat, launchers

__all__ = ["SURVIVOR_WAIT_S", "PeerLostError", "peer_lost"]


class PeerLostError(JabasError, RuntimeError):
    """Another rank is gone (killed, its node lost, stopped past the timeout): this rank stops too, in one line.
    ``now``: said at once (the launcher may end this rank any moment), by the lowest surviving rank only."""

    now = True
    exit_code = heartbeat.EXIT_CODE


#: what Gloo, NCCL and the store say when a peer's connection breaks or a collective waits past the timeout
_LOST = re.compile(r"Connection (closed|reset) by peer|Broken pipe|[Tt]imed out|timeout|NCCL (error|communicator)"
                   r"|remote worker|DistNetworkError|DistBackendError")
#: how long a survivor waits for the others to say they are alive (the store's handshake)
SURVIVOR_WAIT_S = 1.0
#: how long the lost-rank check tries the store host
CONNECT_TIMEOUT_S = 2.0


def _alive(n: int, me: int, own_store: Any) -> set[int] | None:
    """The ranks that answer on the store within SURVIVOR_WAIT_S (each survivor sets its key); None when the
    store itself is gone (its host: rank 0, or torchrun's agent)."""
    try:
        store = own_store if own_store is not None else dist.distributed_c10d._get_default_store()
        tcp = store
        while hasattr(tcp, "underlying_store"):
            tcp = tcp.underlying_store
        if isinstance(tcp, dist.TCPStore):    # its host gone: no store call (torch would log its C++ stack first)
            with socket.create_connection((tcp.host, tcp.port), timeout=CONNECT_TIMEOUT_S):
                pass
        store.set_timeout(datetime.timedelta(seconds=SURVIVOR_WAIT_S + 2))
        store.set(f"hj.alive.{me}", "1")
        end = time.monotonic() + SURVIVOR_WAIT_S
        while True:
            alive = {r for r in range(n) if r == me or store.check([f"hj.alive.{r}"])}
            if len(alive) == n or time.monotonic() > end:
                break
            time.sleep(0.05)
        # a rank on this host that did not answer (stuck in a collective, or ended by the launcher meanwhile)
        # but whose process was not killed counts as alive: only a process that is gone is named
        return alive | {r for r in set(range(n)) - alive if _process_lives(store, r)}
    except Exception:                 # the store's host is gone too, or never was (a world of one)
        return None


def _process_lives(store: Any, r: int) -> bool:
    """Whether rank ``r``'s process (``hj.pid.<r>``: host and pid, set at :func:`init`) is on this host and still
    there (not a zombie); False when it is elsewhere or unknown."""
    try:
        host, pid = store.get(f"hj.pid.{r}").decode().rsplit(":", 1)
        if host != socket.gethostname():
            return False
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except Exception:
        return False


def peer_lost(exc: BaseException, initialized: bool, own_store: Any) -> PeerLostError | None:
    """The one-line error for a collective that failed because a rank is gone, naming that rank; None for
    anything else (not a torch.distributed failure, or no world of several ranks here). ``initialized``: the
    torch backend's own init ran; ``own_store``: its store (None: the default group's)."""
    if not isinstance(exc, RuntimeError) or isinstance(exc, JabasError) or not initialized:
        return None
    if not (dist.is_initialized() and _LOST.search(str(exc))):
        return None
    n, me = dist.get_world_size(), dist.get_rank()
    if n < 2:
        return None
    if heartbeat.stalled():         # this process was stopped itself: the others did not leave it, it left them
        return PeerLostError(f"rank {me} of {n} was stopped (SIGSTOP, a frozen node) while the others went on",
                             quiet=True)
    alive = {me} if n == 2 else _alive(n, me, own_store)          # two ranks: the other one is gone
    if alive is None:
        lost, alive = [0], set(range(1, n))             # the store (rank 0's, or the agent's) is gone with it
    else:
        lost = sorted(set(range(n)) - alive)
    if not lost:
        return None
    who = ", ".join(str(r) for r in lost)
    return PeerLostError(f"rank{'s' if len(lost) > 1 else ''} {who} of {n} gone (killed, node lost, or no answer "
                         f"within HPC_JABAS_TORCH_TIMEOUT_S={settings.torch_timeout_s():g} s); rank {me} stops "
                         f"too: {launchers.what_next()}",
                         quiet=me != min(alive))
