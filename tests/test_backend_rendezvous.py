"""The torch backend's start-up (runtime/comm/torch_backend.py, rendezvous.py) and the backend key.

* how a rank learns its place from the launcher's environment (pure: torchrun, Open MPI's mpirun, MPICH's PMI,
  srun including a heterogeneous step, a batch shell, nothing);
* a world of one rank with no launcher and its gradient reducer, DistributedDataParallel: the collectives of
  every iteration counted (a small constant, not one per parameter), the zero step of a rank without
  micro-batches, the result one big batch's update;
* a real 2-rank torchrun launch training against the one-process reference (backend auto picks torch there);
* the ``backend`` key: one line naming the value and the valid ones, from a job file and from the flag.
"""
import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from mpi_util import PY, ROOT, WORKERS, mpi_env, run_ranks, run_script
from reference import reference_run
from test_equivalence import assert_params_close

from hpc_jabas.core.config.cliargs import ArgumentParser, add_arguments
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm.rendezvous import Launch, launcher
from hpc_jabas.runtime.comm.torch_backend import stream_of


@pytest.mark.parametrize("env,want", [
    ({"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n1",
      "MASTER_PORT": "29400", "OMPI_COMM_WORLD_RANK": "0"}, ("torchrun", 3, 4, 1, "n1", 29400)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}, ("mpirun", 2, 3, 0, None, None)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, ("mpirun", 1, 2, 0, None, None)),
    # srun: block distribution puts rank 0 on the step's first node; the port comes from the job and step ids
    ({"SLURM_STEP_ID": "2", "SLURM_PROCID": "4", "SLURM_STEP_NUM_TASKS": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
      "SLURM_JOB_ID": "1234", "SLURM_STEP_NODELIST": "gpuv[2-3],gpua1"}, ("srun", 4, 6, 1, "gpuv2", "port")),
    # a heterogeneous step: ranks numbered across the components (seen on the local cluster), no node guess
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "3", "SLURM_HET_SIZE": "2",
      "SLURM_JOB_ID": "6", "SLURM_STEP_NODELIST": "gpur1,gpuv1"}, ("srun", 2, 3, 0, None, "port")),
    ({"SLURM_STEP_ID": "batch", "SLURM_PROCID": "0", "SLURM_NTASKS": "3"}, ("single", 0, 1, 0, None, None)),
    ({}, ("single", 0, 1, 0, None, None)),
])
def test_launcher_from_the_environment(env, want):
    ln = launcher(env)
    assert isinstance(ln, Launch)
    port = "port" if ln.how == "srun" and ln.port is not None and 20000 <= ln.port < 40000 else ln.port
    assert (ln.how, ln.rank, ln.size, ln.local_rank, ln.addr, port) == want


def test_srun_steps_of_one_job_meet_on_different_ports():
    env = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_JOB_ID": "77",
           "SLURM_STEP_NODELIST": "gpuv1"}
    ports = {launcher(dict(env, SLURM_STEP_ID=str(s))).port for s in range(5)}
    ports |= {launcher(dict(env, SLURM_JOB_ID=str(j))).port for j in range(78, 83)}
    assert len(ports) == 10


def test_launcher_refuses_a_garbled_rank_and_horovodrun_in_one_line():
    with pytest.raises(ConfigError, match=r"^OMPI_COMM_WORLD_SIZE='three' in the environment is invalid; "
                                          r"it must be an integer >= 0$"):
        launcher({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "three"})
    # horovodrun --gloo's ranks would each make a world of one: refused, not trained apart
    with pytest.raises(ConfigError, match=r"^these ranks were started by horovodrun --gloo.*mpirun, srun or torchrun$"):
        launcher({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "3", "HOROVOD_LOCAL_RANK": "1"})


def test_groups_of_the_trainers_names():
    """Only the stop-signal agreement, in flight across an iteration, has a group of its own."""
    assert [stream_of(n) for n in ("hj.m.h0.0", "hj.m.scal", "hj.w", "hj.safepoint", "hj.lossmode", "wm")] == \
        ["default", "default", "default", "hj.safepoint", "default", "default"]


def test_backend_key_one_line_from_a_job_file_and_the_flag(capsys):
    assert JobConfig.from_dict({"train": {"backend": "torch"}}).backend == "torch"
    assert JobConfig().backend == "auto"
    with pytest.raises(ConfigError) as e:
        JobConfig.from_dict({"train": {"backend": "nccl"}})
    assert str(e.value) == "backend='nccl' is unknown; valid: horovod, torch, auto"
    p = ArgumentParser(prog="train")
    add_arguments(p)
    assert p.parse_args(["--backend", "horovod"]).backend == "horovod"
    with pytest.raises(SystemExit) as ex:
        p.parse_args(["--backend", "mpi"])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and len(err.strip().splitlines()) == 1 and "'mpi'" in err and "torch" in err
    assert isinstance(p, argparse.ArgumentParser)


def test_submit_refuses_an_unknown_backend_before_slurm(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(f'[train]\nbatch = 32\nbackend = "nccl"\n[job]\ntask = "examples.train_digits:build"\n'
                   f'chain_dir = "{tmp_path / "chain"}"\n')
    p = subprocess.run([str(Path(PY).parent / "hpc-jabas"), "submit", str(job), "--mix", "v100:2"],
                       capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["hpc-jabas: error: backend='nccl' is unknown; valid: horovod, torch, auto"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["job.toml"]          # nothing written, nothing submitted


def test_one_rank_world_ddp_reducer_collectives_and_zero_step(tmp_path):
    out = tmp_path / "ddp.json"
    p = run_script([str(WORKERS / "ddp_worker.py"), str(out)], env=dict(mpi_env(), OMP_NUM_THREADS="1"),
                   cwd=str(ROOT), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert (r["controller"], r["backend"], r["size"]) == ("single", "torch", 1)
    assert r["reducer"] == "DistributedDataParallel" and r["bucket_views"]     # the gradients are DDP's buckets
    assert r["none_at_begin"]             # set to None at each iteration's start (torch's zero_grad), views after
    # collectives per iteration, of 30 parameter tensors: never one per parameter. Iteration 0 adds the loss
    # kind's agreement, iteration 1 DDP's bucket rebuild (2 broadcasts); then a normal iteration is one bucket's
    # allreduce and a measuring one adds the half-batch sum (one flat buffer) and the small scalar vector; a
    # noise-only measurement (the last) only the scalars
    assert r["params"] == 30 and r["stats"] == [False, True, False, True, True, True]
    assert r["collectives"][2:] == [1, 3, 3, 2] and max(r["collectives"]) <= 5, r["collectives"]
    assert r["max_diff"] < 1e-12          # three micro-batches of 3, 5 and 4 samples = one batch of 12 (float64)
    # no micro-batch here: one synced zero step (one collective), the user's forward and hooks not run, zero
    # gradients, and DDP's module the user's model again afterwards
    assert r["zero"] == {"collectives": 1, "forwards": 0, "max_grad": 0.0, "module_back": True}
    assert r["bucket_bytes_cap"] == 512 * 1024      # the config's bucket_cap_mb = 0.5, through the Trainer


@pytest.mark.mpi
def test_torchrun_two_ranks_equal_one_big_batch():
    spec = {"optimizer": "momentum", "lr": 0.05, "plan": "b=4 n=1,3", "steps": 12, "n": 256, "checkpoint": False,
            "schedule": {"6": "b=2 n=5,3"}}
    with tempfile.TemporaryDirectory() as td:
        sp = Path(td) / "spec.json"
        sp.write_text(json.dumps(dict(spec, out_dir=td)))
        env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_BACKEND"))}
        cmd = [str(Path(PY).parent / "torchrun"), "--standalone", "--nproc-per-node=2",
               str(WORKERS / "train_worker.py"), str(sp)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=str(ROOT))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
        res = [json.loads((Path(td) / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["backend"] for r in res] == ["torch", "torch"]     # auto under torchrun, Horovod installed or not
    ref = reference_run(spec)
    for r in res:
        assert r["iterations"] == 12
        assert_params_close(r["params"], ref)
    assert os.environ.get("TORCHELASTIC_RUN_ID") is None


#: a DDP script's start: its own process group first (a world of one over TCP), then hpc-jabas; argv[1]: "use"
#: (the model as it is) or "wrapped" (the model still in the script's DistributedDataParallel)
OWN_GROUP_SCRIPT = """import json, socket, sys
import torch
import torch.distributed as dist
from torch import nn
import hpc_jabas
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
group = dist.group.WORLD
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
model = nn.Linear(4, 2)
if sys.argv[1] == "wrapped":
    model = nn.parallel.DistributedDataParallel(model)
cfg = hpc_jabas.JobConfig(batch=8, run_dir=sys.argv[2], epochs=1)          # backend auto
tr = hpc_jabas.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), ds, nn.CrossEntropyLoss(), config=cfg)
tr.fit(max_iterations=3)
from hpc_jabas.runtime.comm import seam as comm
out = {"backend": comm.backend(), "iterations": tr.iteration, "same_group": dist.group.WORLD is group,
       "reducer": type(tr.forward_module).__name__}
comm.shutdown()
out["still_initialized"] = dist.is_initialized()
print("@@" + json.dumps(out))
"""


def _own_group_run(tmp_path, how: str) -> subprocess.CompletedProcess:
    script = tmp_path / "own_group.py"
    script.write_text(OWN_GROUP_SCRIPT)
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_BACKEND"))}
    return subprocess.run([PY, str(script), how, str(tmp_path / "run")], env=env, capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path))


def test_an_existing_process_group_is_used_and_said_once(tmp_path):
    p = _own_group_run(tmp_path, "use")
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(next(ln[2:] for ln in p.stdout.splitlines() if ln.startswith("@@")))
    # backend auto picks torch (Horovod is installed here: the script's group decides), trains on that group,
    # and leaves it to the script at shutdown
    assert out == {"backend": "torch", "iterations": 3, "same_group": True, "reducer": "DistributedDataParallel",
                   "still_initialized": True}
    said = [ln for ln in (p.stdout + p.stderr).splitlines() if "process group" in ln]
    assert len(said) == 1 and "using this process's process group (gloo, rank 0 of 1)" in said[0], said


def test_a_model_already_in_ddp_is_one_line_telling_what_to_remove(tmp_path):
    p = _own_group_run(tmp_path, "wrapped")
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == [
        "hpc-jabas: error: the model given to Trainer is already wrapped in DistributedDataParallel: remove the "
        "DistributedDataParallel(...) wrap and pass the model itself (hpc-jabas reduces the gradients: on the "
        "torch backend it wraps the model in DDP for you)"], p.stderr
    assert not (tmp_path / "run").exists()          # refused before anything was written


def test_an_unused_parameter_is_one_line_not_ddps_error(tmp_path):
    """A model with a layer its loss does not use: DDP (find_unused_parameters=False) would fail at the next
    forward with its own many-line error; the first iteration names the parameters in one line instead."""
    script = tmp_path / "unused.py"
    script.write_text(OWN_GROUP_SCRIPT.replace('model = nn.Linear(4, 2)\n', 'class Net(nn.Module):\n'
                                               '    def __init__(self):\n'
                                               '        super().__init__()\n'
                                               '        self.fc, self.aux = nn.Linear(4, 2), nn.Linear(4, 2)\n'
                                               '    def forward(self, x):\n'
                                               '        return self.fc(x)\n'
                                               'model = Net()\n'))
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_BACKEND"))}
    p = subprocess.run([PY, str(script), "use", str(tmp_path / "run")], env=env, capture_output=True, text=True,
                       timeout=120, cwd=str(tmp_path))
    assert p.returncode == 2, p.stdout + p.stderr
    errs = [ln for ln in p.stderr.splitlines() if "error" in ln.lower()]
    assert errs == ["hpc-jabas: error: parameter(s) aux.weight, aux.bias got no gradient in the last micro-batch's "
                    "backward: DistributedDataParallel (the torch backend) reduces only parameters the loss uses; "
                    "set find_unused_parameters = true (--find-unused-parameters), requires_grad=False on the "
                    "unused ones, or backend='horovod'"], p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.mpi
def test_ddp_reducer_says_when_this_ranks_compute_ends_before_waiting_for_the_others():
    """DDP's own reduction (no comm hook): the reducer still says when this rank's last gradient is ready, before
    the reduction waits for a slower rank (the clock stops there, an emulated GPU waits there): rank 0's ready
    comes at once, its backward ends only after rank 1's SLOW_S; in the checked first iteration (a hook on every
    parameter) and after it (one hook on the last one). The gradients are the mean of both ranks' (float64)."""
    slow = 0.4
    res = run_ranks("ddp_ready_worker.py", {"slow_s": slow}, np_=2, timeout=120)
    for rk in res:
        assert len(rk["its"]) == 4 and all(it["ready_s"] is not None for it in rk["its"]), rk
        assert max(it["grad_err"] for it in rk["its"]) < 1e-12, rk
    fast = res[0]["its"]
    assert all(it["ready_s"] < 0.25 * slow for it in fast), fast          # not the wait for rank 1
    assert all(it["backward_s"] > 0.75 * slow for it in fast), fast       # the wait is in the backward
