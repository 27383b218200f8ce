"""Single-process reference: plain SGD/Adam over the same B-sample batches as a distributed run."""
import torch
from torch import nn

from hpc_jabas.core.planning import Plan
from hpc_jabas.core.planning.sampler import HeterogeneousSampler


def make_data(n=240, d=10, classes=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=dtype)
    W = torch.randn(d, classes, generator=g, dtype=dtype)
    y = (X @ W + 0.5 * torch.randn(n, classes, generator=g, dtype=dtype)).argmax(1)
    return torch.utils.data.TensorDataset(X, y)


def make_model(d=10, classes=3, seed=1, dtype=torch.float64, batchnorm=False):
    torch.manual_seed(seed)
    layers = [nn.Linear(d, 16)]
    if batchnorm:
        layers.append(nn.LayerNorm(16))
    layers += [nn.Tanh(), nn.Linear(16, classes)]
    return nn.Sequential(*layers).to(dtype)


def make_optimizer(name, params, lr):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(name)


def reference_run(spec) -> dict:
    """Replay the sampler with the plan schedule; one process, one big batch per iteration."""
    ds = make_data(spec.get("n", 240))
    model = make_model()
    opt = make_optimizer(spec["optimizer"], model.parameters(), spec["lr"])
    sampler = HeterogeneousSampler(len(ds), seed=spec.get("seed", 0), tail=spec.get("tail", "shrink"))
    plan = Plan.parse(spec["plan"])
    schedule = {int(k): v for k, v in spec.get("schedule", {}).items()}
    lr_scales = {int(k): v for k, v in spec.get("lr_scales", {}).items()}
    lr_scale = 1.0
    X, y = ds.tensors
    loss_fn = nn.CrossEntropyLoss()
    it = 0
    while it < spec["steps"]:
        if it in schedule:
            plan = Plan.parse(schedule[it])
        if it in lr_scales:
            lr_scale = lr_scales[it]
        if sampler.epoch_done(plan.B):
            sampler.new_epoch()
        ib = sampler.next(plan)
        idx = torch.as_tensor(ib.all_indices(), dtype=torch.long)
        opt.zero_grad()
        loss = loss_fn(model(X[idx]), y[idx])
        loss.backward()
        for g in opt.param_groups:
            g["lr"] = spec["lr"] * lr_scale
        opt.step()
        it += 1
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
