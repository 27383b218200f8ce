"""The low-level layer (``HeterogeneousSampler``, ``HeterogeneousOptimizer``, ``hpc_jabas.init``) used as a user
uses it: a script that imports only ``hpc_jabas`` (and torch, horovod.torch), copied into a clean directory and
started there on 3 ranks by the real launchers, under the script's own initialisation: hvd.init() under mpirun,
its own ``init_process_group("gloo")`` under torchrun (the model as it is, and in the script's own DDP wrap), and
``hpc_jabas.init()``. Plans change every two iterations and two of them leave a rank without micro-batches. The
final parameters must match an independent one-process big-batch SGD in float64 (<= 1e-12 relative). Misuse is
one line and exit code 2, never a traceback (here as a script; every misuse check in-process: test_optim_unit.py)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
USER = HERE / "workers" / "public_layer_user.py"
PY = sys.executable
RTOL = 1e-12


def user_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_JABAS_", "PYTHONPATH"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1", PYTHONUNBUFFERED="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", HPC_JABAS_ERROR_GRACE_S="1")
    return env


def launch(tmp: Path, how: str, script: Path = USER, *args: str) -> subprocess.CompletedProcess:
    """The script started on 3 ranks from ``tmp`` (its own copy there), by mpirun or torchrun."""
    if script.parent != tmp:
        shutil.copy(script, tmp / script.name)
    if how == "torchrun":
        cmd = [str(Path(PY).parent / "torchrun"), "--standalone", "--nproc_per_node", "3"]
    else:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "3", PY]
    return subprocess.run([*cmd, script.name, *args], cwd=tmp, env=user_env(), capture_output=True, text=True,
                          timeout=240)


def reference(order: list[list[int]]) -> torch.Tensor:
    """One process, the whole batch of each iteration: plain SGD with momentum on the mean loss (the script's
    data and model, from the same seeds)."""
    torch.manual_seed(0)
    X, Y = torch.randn(61, 5, dtype=torch.float64), torch.randn(61, 1, dtype=torch.float64)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for idx in order:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def check_run(run: dict) -> None:
    order = run["order"]
    assert len(order) == 9 and sorted(sum(order[:6], [])) == list(range(61))       # one epoch, then more
    got = torch.cat([torch.tensor(v, dtype=torch.float64) for v in run["params"].values()])
    want = reference(order)
    start = reference([])
    assert float((want - start).abs().max()) > 0.1                     # the run moved the parameters
    assert float((got - want).abs().max() / want.abs().max()) <= RTOL


def run_user(tmp: Path, launcher: str, init: str, *more: str) -> tuple[dict, subprocess.CompletedProcess]:
    import json
    p = launch(tmp, launcher, USER, init, "out.json", *more)
    if not more:
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    assert "Traceback" not in p.stderr, p.stderr[-5000:]
    return json.loads((tmp / "out.json").read_text()), p


def test_horovod_script_with_its_own_hvd_init_trains_exactly(tmp_path):
    d, _ = run_user(tmp_path, "mpirun", "hvd")
    assert d["world"] == 3 and d["init"][:3] == [0, 3, "horovod"]
    check_run(d["runs"]["plain"])


def test_ddp_script_with_its_own_process_group_trains_exactly_with_and_without_its_ddp_wrap(tmp_path):
    d, _ = run_user(tmp_path, "torchrun", "dist")
    assert d["world"] == 3 and d["init"][:3] == [0, 3, "torch"]
    check_run(d["runs"]["plain"])                 # no wrap: one allreduce after the backward
    check_run(d["runs"]["ddp"])                   # the script's DDP: its reduction in the last backward


def test_hpc_jabas_init_starts_a_backend_then_a_rank_that_misses_a_backward_says_so_in_one_line(tmp_path):
    d, p = run_user(tmp_path, "mpirun", "jabas", "misuse")
    assert d["world"] == 3 and d["init"][:3] == [0, 3, "horovod"]       # auto: Horovod where it imports
    check_run(d["runs"]["plain"])
    assert p.returncode != 0 and "stepped" not in p.stdout
    said = [ln for ln in p.stderr.splitlines() if "hpc-jabas" in ln and "error" in ln]
    assert len(said) == 1 and "step() after 1 backward() call(s), but begin(n_local=2, ...) announced 2" in said[0], \
        p.stderr[-3000:]


MISUSE = '''
import sys
import torch
import hpc_jabas
case = sys.argv[1]          # "noinit": no hpc_jabas.init(), hvd.init() or init_process_group
model = torch.nn.Linear(3, 1)
opt = hpc_jabas.HeterogeneousOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
x = torch.randn(4, 3)
opt.begin(2, 8)
for _ in range(2):
    opt.backward(model(x).pow(2).mean(), 4)
opt.step()
print("stepped")
'''


def test_a_script_that_starts_no_backend_is_told_in_one_line(tmp_path):
    (tmp_path / "misuse.py").write_text(MISUSE)
    case, says = "noinit", "no backend runs in this process: call hpc_jabas.init()"
    p = subprocess.run([PY, "misuse.py", case], cwd=tmp_path, env=user_env(), capture_output=True, text=True,
                       timeout=120)         # not the tests' fork server: the script's own excepthook must run
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "hpc-jabas" in ln or "Traceback" in ln]
    assert lines == [f"hpc-jabas: error: {lines[0].split('error: ', 1)[-1]}"] and says in lines[0], p.stderr

