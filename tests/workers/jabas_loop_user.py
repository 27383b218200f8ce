"""A user's loop kept with ``hpc_jabas.Jabas``, as a user writes it (``import hpc_jabas``, torch, and the
script's own init). tests/test_public_layer_loop.py copies it into a clean directory and starts it on 3 ranks.

    python jabas_loop_user.py INIT DIR

INIT: ``hvd`` (hvd.init(), mpirun) or ``dist`` (init_process_group("gloo"), torchrun); anything else: no init of
the script's own (Jabas starts the backend: hpc_jabas.init()). Two epochs of 61 samples;
B changes at iterations 3 (to 18) and 7 (to a plan with a rank that runs nothing); the state is saved in the
middle of epoch 0 (after iteration 4). Then a second model resumes from that save and runs the same schedule to the
end. A third run, over a map-style dataset, lets B follow the measured gradient noise (measure_every=1,
adapt=(6, 30)). Then fit()'s goodput policy in the loop (policy="noise-scale"): straight to the end, cut after
iteration 4 with a save, and resumed from that save in a fresh Jabas. Rank 0 writes
DIR/out.json: each run's global sample order per iteration, B per iteration and final parameters.
"""
import json
import sys
from pathlib import Path

import torch

import hpc_jabas

how, out = sys.argv[1], Path(sys.argv[2])
if how == "hvd":
    import horovod.torch as hvd
    hvd.init()
elif how == "dist":
    import torch.distributed as dist
    dist.init_process_group("gloo")

torch.manual_seed(0)
X, Y = torch.randn(61, 5, dtype=torch.float64), torch.randn(61, 1, dtype=torch.float64)
data = torch.utils.data.TensorDataset(X, Y)


class Pairs(torch.utils.data.Dataset):
    """The same samples as a map-style dataset of (x, y) pairs: Jabas collates each micro-batch's samples."""

    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i], Y[i]


def train_step(jabas, model, optimizer, step, order: list, bs: list) -> None:
    """One iteration as the user writes it, its global sample order and B recorded."""
    order.append(step.indices)
    bs.append(jabas.B)
    for x, y in step:
        jabas.backward(torch.nn.functional.mse_loss(model(x), y), len(x))
    optimizer.step()


def run(resume: Path | None, adaptive: bool = False) -> dict:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    more = {"measure_every": 1, "adapt": (6, 30)} if adaptive else {}
    jabas = hpc_jabas.Jabas(batch=12, micro_batch=2, speeds=(1, 2, 3), seed=3, checkpoint=resume, **more)
    model, optimizer, loader = jabas.setup(model, optimizer, Pairs() if adaptive else data)
    order, bs, noise = [], [], []
    for _ in jabas.epochs(2):
        for step in loader:
            train_step(jabas, model, optimizer, step, order, bs)
            noise.append(jabas.b_noise)
            if adaptive:
                continue
            if jabas.iteration == 3:
                jabas.set_batch(18)
            if jabas.iteration == 7:
                jabas.set_batch(plan=hpc_jabas.Plan(4, (0, 2, 1)))
            if jabas.iteration == 4 and resume is None:
                jabas.save(out / "mid.pt")
    inner = model.module if hasattr(model, "module") else model
    return {"order": order, "params": [float(v) for p in inner.parameters() for v in p.detach().reshape(-1)],
            "backend": jabas.process.backend, "B": bs, "b_noise": noise}


def policy_run(stop_after: int | None, resume: Path | None) -> dict:
    """fit()'s goodput policy in the loop (policy="noise-scale", a decision every 2 iterations, linear lr rule);
    ``stop_after``: save after that iteration and stop; ``resume``: go on from that save to the end."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    lrs: list[float] = []
    optimizer.register_step_pre_hook(lambda opt, *a: lrs.append(opt.param_groups[0]["lr"]))
    jabas = hpc_jabas.Jabas(batch=12, micro_batch=2, speeds=(1, 2, 3), seed=3, checkpoint=resume,
                            policy="noise-scale", p=2, batch_min=6, batch_max=30, measure_every=1, kappa=4.0)
    model, optimizer, loader = jabas.setup(model, optimizer, data)
    order, bs = [], []
    for _ in jabas.epochs(2):
        for step in loader:
            train_step(jabas, model, optimizer, step, order, bs)
            if jabas.iteration == stop_after:
                jabas.save(out / "policy-mid.pt")
                break
        if jabas.iteration == stop_after:
            break
    inner = model.module if hasattr(model, "module") else model
    return {"order": order, "B": bs, "lr": lrs, "trajectory": jabas.trajectory,
            "params": [float(v) for p in inner.parameters() for v in p.detach().reshape(-1)]}


first = run(None)
second = run(out / "mid.pt")
third = run(None, adaptive=True)
policy = {"straight": policy_run(None, None), "cut": policy_run(4, None),
          "resumed": policy_run(None, out / "policy-mid.pt")}
if hpc_jabas.init().rank == 0:
    (out / "out.json").write_text(json.dumps({"first": first, "second": second, "adaptive": third,
                                              "policy": policy}))
