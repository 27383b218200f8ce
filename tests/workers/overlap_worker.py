"""One process, no launcher: the torch backend's world of one rank (a HashStore, Gloo), and its bucketed gradient
reduction seen from inside the backward. Buckets made small (about 256 bytes) so that the model's five gradients
fill several (the middle layer's weight, made "large", alone and in place); a hook on the first layer's weight
(the backward's last gradient) counts the buckets already started when it runs. Four iterations of two
micro-batches; writes a JSON result to argv[1]."""
import json
import sys

import torch

from hpc_jabas.runtime import comm, comm_torch
from hpc_jabas.runtime.optim import HeterogeneousOptimizer

comm.use("torch")
comm.init()
comm_torch.FIRST_BUCKET_BYTES = comm_torch.BUCKET_BYTES = 256
comm_torch.CPU_IN_PLACE_BYTES = 1024          # the middle layer's weight (16 x 16 floats): alone, in place
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                            torch.nn.Linear(16, 4))
ref = torch.nn.Sequential(*[torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                            torch.nn.Linear(16, 4)])
ref.load_state_dict(model.state_dict())
opt = HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
started: list[int] = []
buffers: list[dict[str, int]] = []     # per iteration: the layout's kept bucket buffers (first name -> address)


def count_started(p):
    if opt._hooks_on:          # the last micro-batch's backward
        st = comm_torch._streams["grad"]
        started.append(sum(len(b.items) for b in st.live if "hj.g.0.weight" not in [i.name for i in b.items]))


model[0].weight.register_post_accumulate_grad_hook(count_started)
loss_fn = torch.nn.CrossEntropyLoss()
for measure in (True, False, False, True):      # measurement iterations: the "grad" stream's hj.m part too
    x, y = torch.randn(12, 8), torch.randint(0, 4, (12,))
    opt.begin(2, 12, measure=measure)
    for sl in (slice(0, 5), slice(5, 12)):
        opt.backward(loss_fn(model(x[sl]), y[sl]), sl.stop - sl.start)
    opt.step()
    buffers.append({k: v[0].data_ptr() for k, v in comm_torch._streams["grad"].bufs.items()})
    ref_opt.zero_grad()
    loss_fn(ref(x), y).backward()      # one big batch of the same 12 samples
    ref_opt.step()
diff = max(float((a - b).detach().abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
st = comm_torch._streams["grad"]
out = {"controller": comm.controller(), "backend": comm.backend(), "size": comm.size(), "started": started,
       "buckets": st.members, "max_diff": diff, "stats": opt.last_stats is not None, "buffers": buffers}
comm.shutdown()
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
