"""The torch backend's collectives on however the ranks were started (no spec): asynchronous sums started in
one order on every rank and waited for in another, a safe-point-like tensor on its own group,
object broadcast and allgather, a ragged tensor allgather. Prints one JSON line per rank."""
import json

import torch

from hpc_jabas.runtime.comm import seam as comm

comm.use("torch")
comm.init()
r, n = comm.rank(), comm.size()
names = [f"hj.g.p{i}" for i in range(6)]
errs = []
for _ in range(3):
    ts = {nm: torch.full((3 + i,), float(r + 1) * (i + 1)) for i, nm in enumerate(names)}
    sp = comm.allreduce_sum_async_(torch.tensor([float(r)]), name="hj.safepoint")
    hs = {nm: comm.allreduce_sum_async_(ts[nm], name=nm, postscale=1.0 / n)
          for nm in names}
    for nm in sorted(hs):
        comm.synchronize(hs[nm])
    want = sum(range(1, n + 1)) / n
    errs += [float((ts[nm] - want * (i + 1)).abs().max()) for i, nm in enumerate(names)]
    errs.append(abs(float(comm.synchronize(sp).item()) - sum(range(n))))
out = {"rank": r, "size": n, "launcher": comm.controller(), "max_err": max(errs),
       "gathered": comm.allgather_object(r * r), "broadcast": comm.broadcast_object("x" if r == 0 else None),
       "ragged": comm.allgather_tensor(torch.arange(r + 1), "t").tolist()}
comm.shutdown()
print("@@" + json.dumps(out), flush=True)
