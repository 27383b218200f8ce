"""Issue 58, findings 1, 5 and 6, as a torchrun user runs them: a script in the shape of pytorch/examples' DDP
tutorial (positional ``total_epochs save_every``, ``--batch_size`` per device), ported with ``add_arguments``,
started by torchrun on 2 ranks.

* ``3 1 --batch_size 16`` trains 3 epochs at the global batch 32 = 16 x 2 ranks, said once in the log;
* ``hpc_jabas.World.detect().size`` is the world before the Trainer (under mpirun too);
* rerunning the finished job is one line and exit code 0, naming the script's own epochs positional;
* DDP's knobs: ``--find-unused-parameters`` trains a model with a branch the loss never uses, its other
  parameters the same as the plain run's; ``static_graph`` and ``broadcast_buffers``, which the micro-batch
  seam (DDP's no_sync, unequal micro-batch counts) cannot take, are one line each naming why; the refusal of
  a model the script wrapped in DDP itself names the wrap's settings and their keys.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mpi_util import mpi_env

import hpc_jabas as hj

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

SCRIPT = '''
import argparse
import json

import torch
from torch import nn

import hpc_jabas

parser = argparse.ArgumentParser(description="simple distributed training job")
parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
parser.add_argument("save_every", type=int, help="How often to save a snapshot")
parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)")
parser.add_argument("--branch", action="store_true", help="a head the loss never uses")
hpc_jabas.add_arguments(parser)
args = parser.parse_args()
world = hpc_jabas.World.detect().size            # before the Trainer, under any launcher
torch.manual_seed(0)
x = torch.randn(256, 20)
data = torch.utils.data.TensorDataset(x, x[:, :1] * 0.5 + 0.1 * torch.randn(256, 1))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 16), nn.Tanh(), nn.Linear(16, 1))
        self.unused = nn.Linear(20, 3) if args.branch else None

    def forward(self, x):
        return self.body(x)


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
trainer = hpc_jabas.Trainer(model, opt, data, nn.MSELoss(), config=hpc_jabas.config_from_args(args))
res = trainer.fit()
if trainer.rank == 0:
    print("RESULT " + json.dumps({"world": world, "B": trainer.B, "epoch": res["epoch"],
                                  "iterations": res["iterations"], "iterations_here": res["iterations_here"],
                                  "plan": str(trainer.plan),
                                  "body": [p.detach().double().sum().item() for p in model.body.parameters()]}))
'''


def _torchrun(script: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_BACKEND"))}
    torchrun = str(Path(PY).parent / "torchrun")
    return subprocess.run([torchrun, "--standalone", "--nproc-per-node=2", str(script), *args], env=env,
                          capture_output=True, text=True, timeout=240, cwd=str(cwd))


def _result(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ddp_script")
    s = d / "multigpu_torchrun.py"
    s.write_text(SCRIPT)
    return s


#: the tutorial's command line, on two ranks of unequal declared speed (unequal micro-batch counts: DDP's no_sync
#: seam in use) and one micro-batch size
COMMON = ["3", "1", "--batch_size", "16", "--gpu-types", "v100,rtx2060", "--micro-batch", "4"]


@pytest.fixture(scope="module")
def plain(script, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    run = tmp_path_factory.mktemp("plain") / "run"
    return _torchrun(script, [*COMMON, "--run-dir", str(run)], run.parent), run


@pytest.mark.mpi
def test_the_tutorials_cli_under_torchrun_and_a_rerun_of_the_finished_job(script, plain):
    p, run = plain
    r = _result(p)
    assert (r["world"], r["B"], r["epoch"], r["iterations"]) == (2, 32, 3, 3 * 256 // 32)
    said = [ln for ln in p.stderr.splitlines() if "each rank's batch" in ln]
    assert len(said) == 1 and "--batch_size 16 is each rank's batch: the global batch B = 16 x 2 ranks = 32" in said[0]
    epochs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if '"epoch_end"' in ln]
    assert [e["epoch"] for e in epochs] == [0, 1, 2] and {e["B"] for e in epochs} == {32}
    again = _torchrun(script, [*COMMON, "--run-dir", str(run)], run.parent)
    r2 = _result(again)                    # exit code 0, and the script's own code after fit() still runs
    assert r2["iterations_here"] == 0 and r2["body"] == r["body"]
    ours = [ln for ln in (again.stdout + again.stderr).splitlines() if "already finished" in ln]
    assert len(ours) == 1, again.stdout + again.stderr
    assert "already finished at epoch 3 of 3; total_epochs 4 (or more) to go on" in ours[0], ours
    assert not [ln for ln in again.stderr.splitlines() if "hpc-jabas[" in ln and "node=" in ln]   # nothing more


@pytest.mark.mpi
def test_find_unused_parameters_trains_a_branch_the_loss_never_uses(script, plain, tmp_path):
    base = _result(plain[0])
    n = [int(c) for c in base["plan"].split("n=")[1].split()[0].split(",")]
    assert n[0] != n[1], base["plan"]                       # unequal micro-batch counts: the no_sync seam is used
    unused = _result(_torchrun(script, [*COMMON, "--branch", "--find-unused-parameters",
                                        "--run-dir", str(tmp_path / "unused")], tmp_path))
    assert unused["iterations"] == base["iterations"]
    assert unused["body"] == pytest.approx(base["body"], rel=1e-6, abs=1e-6)   # the same as without the branch


@pytest.mark.parametrize("key,reason", [("static_graph", "no_sync"), ("broadcast_buffers", "unequal micro-batch")])
def test_ddp_knobs_the_micro_batch_seam_cannot_take_are_one_line(key, reason):
    from hpc_jabas.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        hj.JobConfig(**{key: True}).validate()
    assert str(e.value).startswith(f"{key}=true cannot run here") and reason in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="find_unused_parameters=true is DistributedDataParallel's"):
        hj.JobConfig(find_unused_parameters=True, backend="horovod").validate()


def test_a_pre_wrapped_models_refusal_names_its_knobs_and_their_keys(tmp_path):
    """One process (a world of one, Gloo): the script's DDP wrap with find_unused_parameters and a bucket size."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hpc_jabas.errors import ConfigError
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        m = DDP(nn.Linear(4, 1), find_unused_parameters=True, bucket_cap_mb=50)
        data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
        with pytest.raises(ConfigError) as e:
            hj.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), data, nn.MSELoss(), config=hj.JobConfig(batch=8))
        msg = str(e.value)
        assert "already wrapped in DistributedDataParallel" in msg and "\n" not in msg
        assert "find_unused_parameters=True -> find_unused_parameters = true" in msg
        assert "bucket_cap_mb=50 -> bucket_cap_mb = 50" in msg and "static_graph" not in msg
    finally:
        dist.destroy_process_group()


@pytest.mark.mpi
def test_the_world_size_before_the_trainer_under_mpirun(tmp_path):
    s = tmp_path / "world.py"
    s.write_text("import hpc_jabas\nw = hpc_jabas.World.detect()\nprint(f'WORLD {w.rank} {w.size}', flush=True)\n")
    env = dict(mpi_env(), OMPI_MCA_rmaps_base_oversubscribe="1")
    p = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", PY, str(s)], env=env,
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    # mpirun forwards both ranks' stdout into one pipe: one rank's line can land inside the other's (seen in CI)
    assert sorted(re.findall(r"WORLD \d+ \d+", p.stdout)) == ["WORLD 0 2", "WORLD 1 2"], p.stdout
    assert "KeyError" not in p.stderr and os.environ.get("WORLD_SIZE") is None
