"""A user's loop with fit()'s batch-size policy (``hpc_jabas.Jabas(policy=...)``), as a user writes it: ``import
hpc_jabas`` and torch only, the backend started by ``hpc_jabas.init()`` (HPC_JABAS_BACKEND picks it).
tests/test_loop_policy.py copies it into a clean directory and starts it on one rank (python) or two (mpirun).

    python jabas_policy_user.py POLICY[,POLICY...] DIR

Two epochs of 96 samples, micro_batch 4, B from 16 in [8, 64], p = 2. The first run goes to the end; the second
saves after iteration 5 and stops there (the process's state dropped), then a third Jabas over a fresh model and
optimizer resumes from that save and runs to the end. Every rank writes DIR/out.<rank>.<POLICY>.json: per
iteration the B run, the lr the torch optimizer stepped with and the measurement (GradStats) taken, and the
sampler's position after it; the policy's trajectory and the final parameters, for each run.
"""
import json
import sys
from pathlib import Path

import torch

import hpc_jabas

policies, out = sys.argv[1].split(","), Path(sys.argv[2])
proc = hpc_jabas.init()
torch.manual_seed(0)
X = torch.randn(96, 5, dtype=torch.float64)
Y = X @ torch.randn(5, 1, dtype=torch.float64) + 0.3 * torch.randn(96, 1, dtype=torch.float64)
data = torch.utils.data.TensorDataset(X, Y)
KEYS = {"noise-scale": {"measure_every": 1, "kappa": 4.0}, "ramp": {"epochs": 2, "ramp_at": [0.25, 0.5]},
        "similarity": {"gamma": 0.5, "alpha": 0.5}}


def run(policy: str, stop_after: int | None, resume: Path | None) -> dict:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    lrs: list[float] = []
    optimizer.register_step_pre_hook(lambda opt, *a: lrs.append(opt.param_groups[0]["lr"]))
    speeds = (1.0, 2.0)[:proc.size]
    jabas = hpc_jabas.Jabas(batch=16, micro_batch=4, speeds=speeds, seed=3, checkpoint=resume, policy=policy,
                            p=2, batch_min=8, batch_max=64, **KEYS.get(policy, {}))
    model, optimizer, loader = jabas.setup(model, optimizer, data)
    its = []
    for _ in jabas.epochs(2):
        for step in loader:
            B = jabas.B
            for x, y in step:
                jabas.backward(torch.nn.functional.mse_loss(model(x), y), len(x))
            optimizer.step()
            st = optimizer.last_stats
            its.append({"it": jabas.iteration, "B": B, "samples": step.samples,
                        "stats": st.to_dict() if st is not None else None,
                        "epoch": jabas.sampler.epoch, "cursor": jabas.sampler.cursor})
            if stop_after is not None and jabas.iteration == stop_after:
                jabas.save(out / "mid.pt")
                break
        if stop_after is not None and jabas.iteration == stop_after:
            break
    inner = model.module if hasattr(model, "module") else model
    return {"its": its, "lr": lrs, "trajectory": jabas.trajectory, "lr_scale": jabas.lr_scale,
            "params": [float(v) for p in inner.parameters() for v in p.detach().reshape(-1)],
            "params_hex": [v.hex() for p in inner.parameters() for v in p.detach().reshape(-1).tolist()],
            "backend": proc.backend, "n": len(data)}


for policy in policies:
    whole = run(policy, None, None)
    cut = run(policy, 5, None)
    resumed = run(policy, None, out / "mid.pt")
    (out / f"out.{proc.rank}.{policy}.json").write_text(json.dumps({"whole": whole, "cut": cut, "resumed": resumed}))
