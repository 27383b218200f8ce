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
res = {"rank": r, "size": n, "weighted_mean": wm.tolist(), "broadcast": obj, "gathered": gathered,
       "controller": comm.controller(), "device": str(comm.device())}
(Path(spec["out_dir"]) / f"rank{r}.json").write_text(json.dumps(res))
