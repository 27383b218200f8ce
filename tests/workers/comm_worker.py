"""Weighted allreduce and object collectives on every rank; writes rank<r>.json."""
import json
import sys
from pathlib import Path

import torch

from hpc_jabas.runtime.comm import seam as comm

spec = json.loads(Path(sys.argv[1]).read_text())
comm.init()
r, n = comm.rank(), comm.size()
values, weights = spec["values"], spec["weights"]
total = float(sum(weights[:n]))
t = torch.full((4,), float(values[r]), dtype=torch.float64)
wm = comm.weighted_mean(t, weights[r], total, name="wm")
obj = comm.broadcast_object({"from": r, "payload": [1, 2, {"x": "y"}]} if r == 0 else None, name="bo")
gathered = comm.allgather_object({"rank": r, "sq": r * r}, name="ag")
# payloads of different lengths on every rank, and tensors whose first dims differ
uneven = comm.allgather_object("é" * (500 * r), name="ag.uneven")
rows = comm.allgather_tensor(torch.full((r + 1, 2), float(r)), name="ag.rows")
model = torch.nn.Linear(3, 2)
with torch.no_grad():
    for p in model.parameters():
        p.fill_(float(r + 1))
comm.broadcast_parameters(model.state_dict(), root_rank=0)
res = {"rank": r, "size": n, "weighted_mean": wm.tolist(), "broadcast": obj, "gathered": gathered,
       "uneven": [len(x) for x in uneven], "rows": rows.tolist(),
       "params": sorted({float(v) for p in model.parameters() for v in p.flatten().tolist()}),
       "controller": comm.controller(), "device": str(comm.device())}
(Path(spec["out_dir"]) / f"rank{r}.json").write_text(json.dumps(res))
