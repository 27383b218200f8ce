"""Two ranks of the torch backend's DistributedDataParallel reducer, driven as the Trainer drives it: rank 1's
forward sleeps SLOW_S each iteration, so rank 0's backward ends waiting for it inside DDP's reduction. Per
iteration, each rank records when the reducer said this rank's compute had ended (``on_ready``) and when the
backward returned, measured from the backward's start; and the gradient DDP left against the mean of both ranks'
(gathered by hand). Iteration 0 is the checked one (a hook on every parameter), the rest use one hook on the
parameter whose gradient comes last. Writes rank<r>.json."""
import json
import sys
import time
from pathlib import Path

import torch

from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.runtime.optim import HeterogeneousOptimizer
from hpc_jabas.runtime.step import micro_step_sums, read_sums

spec = json.loads(Path(sys.argv[1]).read_text())
SLOW_S = float(spec["slow_s"])
comm.use("torch")
comm.init()
r = comm.rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
opt = HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), model.named_parameters())
opt.use_reducer(comm.make_reducer(opt.named, model=model))
ddp = opt.reducer.module
loss_fn = torch.nn.CrossEntropyLoss()
marks: dict[str, float] = {}


def forward(m, batch):
    out = loss_fn(m(batch[0]), batch[1])
    if r == 1:
        time.sleep(SLOW_S)            # rank 1 computes slowly; rank 0 reaches the reduction first
    marks["t0"] = time.perf_counter()
    return out


its = []
for i in range(4):
    g = torch.Generator().manual_seed(100 + i)
    x, y = torch.randn(2, 6, 8, dtype=torch.float64, generator=g), torch.randint(0, 4, (2, 6), generator=g)
    opt.begin(1, 12)
    marks.clear()
    opt.reducer.on_ready(lambda: marks.setdefault("ready", time.perf_counter()))
    sums = micro_step_sums(ddp, forward, opt, (x[r], y[r]), 6, "cpu", None)
    t_end = time.perf_counter()
    opt.reducer.on_ready(None)
    read_sums(sums, opt, 12)
    opt.synchronize()
    # the reference: each rank's own gradient of its 6 samples, averaged by hand over both ranks
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    ref.load_state_dict(model.state_dict())
    diffs = []
    for k in range(2):
        ref.zero_grad()
        loss_fn(ref(x[k]), y[k]).backward()
        diffs.append([p.grad.clone() for p in ref.parameters()])
    mean = [(a + b) / 2 for a, b in zip(*diffs)]
    err = max(float((p.grad - m).abs().max()) for p, m in zip(model.parameters(), mean))
    its.append({"ready_s": marks["ready"] - marks["t0"] if "ready" in marks else None,
                "backward_s": t_end - marks["t0"], "grad_err": err})
    opt.step()
(Path(spec["out_dir"]) / f"rank{r}.json").write_text(json.dumps({"rank": r, "its": its}))
comm.shutdown()
