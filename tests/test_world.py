"""World (runtime/comm/world.py) without Horovod: a plain frozen value, its checks, and the pure parts of detect()."""
import dataclasses
import logging
import socket
import subprocess
import sys

import pytest

from hpc_jabas import ConfigError, World
from hpc_jabas.runtime.comm.world import (
    check_gpu_types,
    combine_sources,
    gpu_type_of_device_name,
    local_gpu_type,
    node_name,
)


def test_a_world_is_built_by_hand_and_frozen():
    w = World(rank=2, size=3, gpu_types=["v100", "p100", "rtx2060"], source="flag", device="cpu",
              nodes=["n0", "n0", "n1"], devices=["cpu"] * 3, emulated=True)
    assert w.gpu_types == ("v100", "p100", "rtx2060") and w.gpu_type == "rtx2060" and w.node == "n1"
    assert w.describe() == "rank 2/3 node=n1 gpu=rtx2060 device=cpu(emulated rtx2060)"
    assert w.describe(0) == "rank 0/3 node=n0 gpu=v100 device=cpu(emulated v100)"
    assert w.ranks()[1] == {"rank": 1, "node": "n0", "gpu": "p100", "device": "cpu(emulated p100)"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.rank = 0                                   # type: ignore[misc]
    one = World(rank=0, size=1, gpu_types=("a100",), source="cuda", device="cuda:0")
    assert one.describe() == f"rank 0/1 node={node_name()} gpu=a100 device=cuda:0"
    assert one.ranks() == [{"rank": 0, "node": None, "gpu": "a100", "device": "cuda:0"}]


@pytest.mark.parametrize("kw, needle", [
    (dict(rank=0, size=2, gpu_types=("v100",)), "lists 1 types but the job has 2 ranks"),
    (dict(rank=3, size=2, gpu_types=("v100", "v100")), "rank 3 is invalid for 2 ranks"),
    (dict(rank=0, size=0, gpu_types=()), "world size 0 is invalid"),
    (dict(rank=0, size=1, gpu_types=("v100",), source="guess"), "source 'guess' is unknown"),
    (dict(rank=0, size=2, gpu_types=("v100", "v100"), nodes=("n0",)), "nodes lists 1 entries for 2 ranks"),
])
def test_a_bad_world_is_one_config_error(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        World(**kw)


def test_flag_types_are_catalog_keys_one_per_rank():
    assert check_gpu_types(["V100", "RTX_2060", "tesla-p100"], 3) == ["v100", "rtx2060", "p100"]
    with pytest.raises(ConfigError, match="lists 2 types but the job has 3 ranks"):
        check_gpu_types(["v100", "p100"], 3)
    with pytest.raises(ConfigError, match="unknown GPU type 'k80'"):
        check_gpu_types(["v100", "k80"], 2)


@pytest.mark.parametrize("name, key", [
    ("NVIDIA A100-SXM4-40GB", "a100"), ("Tesla V100-SXM2-16GB", "v100"), ("NVIDIA H100", "h100"),
    ("NVIDIA GeForce RTX 3090", "rtx3090"), ("NVIDIA TITAN RTX", "titan-rtx"), ("NVIDIA RTX A6000", "a6000"),
    ("NVIDIA GeForce RTX 2060", "rtx2060"), ("Quadro P4000", "p4000"), ("NVIDIA L40S", "l40s"),
    ("NVIDIA H200", "h200"), ("Some Future GPU", None),
])
def test_cuda_device_names(name, key):
    assert gpu_type_of_device_name(name) == key


def test_a_ranks_type_slurm_then_cuda_then_a_v100(caplog):
    slurm = {"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "p100"}
    assert local_gpu_type(slurm, slurm_type=lambda env: "p100") == ("p100", "slurm")
    none = lambda env: None                                        # noqa: E731
    assert local_gpu_type({}, cuda_name="NVIDIA A100-SXM4-80GB", slurm_type=none)[1] == "cuda"
    assert local_gpu_type({}, emulate=True, slurm_type=none) == ("v100", "emulation")
    assert local_gpu_type({}, slurm_type=none) == ("v100", "default")
    with caplog.at_level(logging.WARNING, logger="hpc_jabas"):
        logging.getLogger("hpc_jabas").propagate = True
        try:
            assert local_gpu_type({}, cuda_name="Some Future GPU", rank=1, slurm_type=none) == ("v100", "default")
        finally:
            logging.getLogger("hpc_jabas").propagate = False
    assert "rank 1: GPU 'Some Future GPU' is not in the catalog" in caplog.text


def test_slurms_environment_through_the_cluster_module(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")                    # no Slurm command can answer
    assert local_gpu_type({"SLURM_JOB_ID": "3", "SLURM_JOB_PARTITION": "rtx"}) == ("rtx2060", "slurm")
    assert local_gpu_type({"HOME": "/root"}, emulate=True) == ("v100", "emulation")


def test_node_name_and_sources():
    assert node_name({"SLURMD_NODENAME": "gpua1"}) == "gpua1"
    assert node_name({}) == socket.gethostname()
    assert combine_sources(["slurm", "slurm"]) == "slurm"
    assert combine_sources(["slurm", "cuda"]) == "mixed"


def test_the_world_module_needs_no_torch_or_horovod():
    code = ("import sys; import hpc_jabas.runtime.comm.world as w; "
            "print(sorted(m for m in ('torch', 'horovod', 'submitit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.mpi
def test_the_start_record_says_where_every_rank_runs(tmp_path):
    """3 Horovod ranks: World.detect gathers each rank's type, node and device into metrics.jsonl's start record."""
    import json

    from mpi_util import run_ranks
    run_dir = tmp_path / "run"
    spec = {"optimizer": "sgd", "lr": 0.01, "plan": "b=4 n=1,1,1", "steps": 2, "n": 64, "checkpoint": False,
            "emulate": True, "gpu_types": ["v100", "P100", "rtx_2060"], "run_dir": str(run_dir)}
    run_ranks("train_worker.py", spec, np_=3)
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in recs if r["type"] == "start")
    assert start["gpu_types"] == ["v100", "p100", "rtx2060"] and start["gpu_source"] == "flag"
    assert start["ranks"] == [{"rank": r, "node": socket.gethostname(), "gpu": g, "device": f"cpu(emulated {g})"}
                              for r, g in enumerate(["v100", "p100", "rtx2060"])]
