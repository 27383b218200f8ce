"""One process, no launcher: the torch backend's world of one rank (a HashStore, Gloo) and its gradient reducer,
torch's DistributedDataParallel, driven as the Trainer drives it (runtime/step.py's micro-batch step through the
reducer's module). A deep model (30 parameter tensors) so that one collective per parameter would show. Counts
the collectives of every iteration (the default group's sequence number: every collective on it adds one), in
normal and measuring iterations, and of an iteration without micro-batches (the zero step); compares the
parameters with one big batch of the same samples. Writes a JSON result to argv[1]."""
import json
import sys

import torch
import torch.distributed as dist

from hpc_jabas.runtime.comm import seam as comm
from hpc_jabas.runtime.optim import HeterogeneousOptimizer
from hpc_jabas.runtime.step import micro_step_sums, read_sums

comm.use("torch")
comm.init()
torch.manual_seed(0)


def build():
    layers = [torch.nn.Linear(8, 16), torch.nn.Tanh()]
    for _ in range(13):
        layers += [torch.nn.Linear(16, 16), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(16, 4)).double()


model, ref = build(), build()
ref.load_state_dict(model.state_dict())
opt = HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
opt.use_reducer(comm.make_reducer(opt.named, model=model))
ddp = opt.reducer.module
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
loss_fn = torch.nn.CrossEntropyLoss()
forwards = []
model.register_forward_hook(lambda m, a, out: forwards.append(1))


def seq() -> int:
    return dist.group.WORLD._get_sequence_number_for_group()


def forward(m, batch):
    return loss_fn(m(batch[0]), batch[1])


counts, stats, kept = [], [], []
for measure in (False, True, False, True, True, "noise"):        # "noise": a noise-only measurement
    x, y = torch.randn(12, 8, dtype=torch.float64), torch.randint(0, 4, (12,))
    s0 = seq()
    opt.begin(3, 12, measure=bool(measure), similarity=measure != "noise")
    kept.append(all(p.grad is None for p in model.parameters()))
    sums = None
    for sl in (slice(0, 3), slice(3, 8), slice(8, 12)):
        sums = micro_step_sums(ddp, forward, opt, (x[sl], y[sl]), sl.stop - sl.start, "cpu", sums)
    read_sums(sums, opt, 12)
    opt.step()
    counts.append(seq() - s0)
    stats.append(opt.last_stats is not None and (opt.last_stats.similarity is None) == (measure == "noise"))
    ref_opt.zero_grad()
    loss_fn(ref(x), y).backward()      # one big batch of the same 12 samples
    ref_opt.step()
diff = max(float((a - b).detach().abs().max()) for a, b in zip(model.parameters(), ref.parameters()))
views = all(p.grad is not None and p.grad._base is not None for p in model.parameters())
# every begin() sets the gradients to None, as torch's zero_grad does (DDP copies the first backward's tensor into
# its bucket once); after each reduction they are the buckets' views again
stable = kept == [True] * 6

# an iteration without micro-batches on this rank: one synced zero step through DDP, the user's forward not run
n_fw = len(forwards)
s0 = seq()
opt.begin(0, 12)
read_sums(None, opt, 12)
opt.synchronize()
zero = {"collectives": seq() - s0, "forwards": len(forwards) - n_fw,
        "max_grad": max(float(p.grad.abs().max()) for p in model.parameters()),
        "module_back": ddp.module is model}
out = {"controller": comm.controller(), "backend": comm.backend(), "size": comm.size(), "reducer": type(ddp).__name__,
       "params": len(list(model.parameters())), "collectives": counts, "stats": stats, "max_diff": diff,
       "bucket_views": views, "none_at_begin": stable, "zero": zero}

# the config's bucket_cap_mb reaches DDP through the Trainer, as a user sets it
from pathlib import Path  # noqa: E402

from hpc_jabas import JobConfig, Trainer  # noqa: E402

data = torch.utils.data.TensorDataset(torch.randn(48, 8, dtype=torch.float64), torch.randint(0, 4, (48,)))
m3 = build()
cfg = JobConfig(backend="torch", batch=12, bucket_cap_mb=0.5, run_dir=str(Path(sys.argv[1]).parent / "run"))
tr = Trainer(m3, torch.optim.SGD(m3.parameters(), lr=0.1), data, loss_fn, config=cfg)
tr.fit(max_iterations=1)
out["bucket_bytes_cap"] = int(tr.forward_module.bucket_bytes_cap)
comm.shutdown()
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
