"""``hpc_jabas.Jabas``, the keep-your-loop API, as a user runs it: tests/workers/jabas_loop_user.py copied into a
clean directory and started on 3 ranks with the script's own init, hvd.init() under mpirun and its own gloo
group under torchrun (where Jabas wraps the model in DDP). B changes at iteration boundaries (12, then 18, then a
plan with a rank that runs nothing); the final parameters must match an independent one-process big-batch SGD in
float64 (<= 1e-12 relative), and a second model resumed from a save in the middle of epoch 0 must end where the
first did. A third run, over a map-style Dataset, lets B follow the measured gradient noise scale (``adapt``),
still exact."""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

USER = Path(__file__).resolve().parent / "workers" / "jabas_loop_user.py"
PY = sys.executable
SIZES = [12, 12, 12, 18, 7, 18, 18, 12, 13]     # B 12; 18 from iteration 4; 12 (n = 0, 2, 1) from 8; tails 7, 13


def reference(order: list[list[int]], lrs: list[float] | None = None) -> torch.Tensor:
    """One process, each iteration's whole batch: plain SGD with momentum on the mean loss (same seeds); ``lrs``:
    the lr of each step (default 0.1)."""
    torch.manual_seed(0)
    X, Y = torch.randn(61, 5, dtype=torch.float64), torch.randn(61, 1, dtype=torch.float64)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for k, idx in enumerate(order):
        if lrs is not None:
            opt.param_groups[0]["lr"] = lrs[k]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("launcher,init,backend", [("mpirun", "hvd", "horovod"), ("torchrun", "dist", "torch")])
def test_jabas_keeps_the_users_loop_exact_with_b_changes_and_a_mid_epoch_resume(tmp_path, launcher, init, backend):
    shutil.copy(USER, tmp_path / USER.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_JABAS_", "PYTHONPATH"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
    if launcher == "torchrun":
        cmd = [str(Path(PY).parent / "torchrun"), "--standalone", "--nproc_per_node", "3"]
    else:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "3", PY]
    p = subprocess.run([*cmd, USER.name, init, "."], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout[-3000:] + p.stderr[-5000:]
    check_user_run(json.loads((tmp_path / "out.json").read_text()), backend)


def check_user_run(d: dict, backend: str) -> None:
    """jabas_loop_user.py's out.json (3 ranks): the B schedule, exact against the big-batch reference, the resume
    ending where the first run did, and adaptive B following its rule, exact too (tests/test_public_layer_srun.py
    checks its runs with it too)."""
    first, second = d["first"], d["second"]
    assert first["backend"] == backend
    assert [len(o) for o in first["order"]] == SIZES
    assert sorted(sum(first["order"][:5], [])) == list(range(61)) == sorted(sum(first["order"][5:], []))
    assert second["order"] == first["order"][4:]               # resumed after iteration 4: the same samples
    want = reference(first["order"])
    got = torch.tensor(first["params"], dtype=torch.float64)
    assert float((want - reference([])).abs().max()) > 0.1    # the run moved the parameters
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-12
    resumed = torch.tensor(second["params"], dtype=torch.float64)
    assert float((resumed - got).abs().max() / got.abs().max()) <= 1e-12
    # adaptive: B follows the measured noise scale (rounded to micro-batches of 2, clipped to [6, 30]) from the
    # iteration after each measurement; every iteration still the exact big-batch step
    ad = d["adaptive"]
    assert ad["B"][0] == 12 and len(set(ad["B"])) > 1
    for k in range(1, len(ad["B"])):
        noise = ad["b_noise"][k]          # after step k: the measurement of iteration k - 1 (0-based)
        rule = None if noise is None else 30 if noise > 30 else max(6, min(30, 2 * math.floor(noise / 2 + 0.5)))
        assert ad["B"][k] == (ad["B"][k - 1] if rule is None else rule), (k, ad["B"], ad["b_noise"])
    want = reference(ad["order"])
    got = torch.tensor(ad["params"], dtype=torch.float64)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-12
    # fit()'s goodput policy in the loop: B moves, the lr follows the linear rule (0.1 x B / 12, the lr set for
    # B = 12) at every step, each step is the exact big-batch step at that lr, and a save after iteration 4
    # resumed in a fresh Jabas ends where the uninterrupted run did, on the same B schedule
    po = d["policy"]
    straight, cut, resumed = po["straight"], po["cut"], po["resumed"]
    assert len(set(straight["B"])) > 1, straight["B"]
    assert all(0 < len(o) <= b for o, b in zip(straight["order"], straight["B"]))      # B, or an epoch's tail
    assert all(math.isclose(lr, 0.1 * b / 12, rel_tol=1e-12) for lr, b in zip(straight["lr"], straight["B"])), \
        (straight["lr"], straight["B"])
    want = reference(straight["order"], straight["lr"])
    got = torch.tensor(straight["params"], dtype=torch.float64)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-12
    assert cut["B"] + resumed["B"] == straight["B"] and cut["order"] + resumed["order"] == straight["order"]
    end = torch.tensor(resumed["params"], dtype=torch.float64)
    assert float((end - got).abs().max() / got.abs().max()) <= 1e-12


@pytest.mark.parametrize("script,launch", [
    ("ddp_loop.py", [str(Path(PY).parent / "torchrun"), "--standalone", "--nproc-per-node=2"]),
    ("horovod_loop.py", ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", PY])])
def test_the_ported_examples_train_on_two_ranks_with_unequal_speeds(tmp_path, script, launch):
    """examples/porting/ddp_loop.py and horovod_loop.py (ddp_mnist.py and horovod_mnist.py with their loops kept by
    Jabas), as their headers say to run them: one epoch of 2048 samples, B = 128 split 1:3."""
    path = Path(__file__).resolve().parents[1] / "examples" / "porting" / script
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_JABAS_", "PYTHONPATH"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    p = subprocess.run([*launch, str(path), "--epochs", "1", "--speeds", "1", "3"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout[-3000:] + p.stderr[-5000:]
    lines = p.stdout.splitlines()
    if script == "ddp_loop.py":
        assert "epoch 0: 16 iterations, B=128" in lines, p.stdout         # 2048 samples / 128
    acc = float(next(ln for ln in lines if "test accuracy" in ln).split()[-1])
    assert acc > 0.3 and (tmp_path / script.replace(".py", ".pt")).is_file()     # chance: 0.1 (horovod_mnist.py: 0.19)

