"""hpc_jabas.slurm.cluster against the real local Slurm cluster (slurm/local/up.sh), plus the pure parsers
(hpc_jabas.slurm.text) and view it builds from scontrol's records."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from slurm_env import LAYOUT
from support.slurm_records import NODE_V1  # real records of the local cluster, shared with bench/faults.py
from support.slurm_records import node as _node
from support.slurm_records import part as _part

from hpc_jabas.errors import ConfigError, SlurmError
from hpc_jabas.slurm import cluster, sbatch
from hpc_jabas.slurm import text as stext


# ---- pure parsers --------------------------------------------------------------------------------
def test_parse_oneliner_keeps_values_with_spaces():
    d = stext.parse_oneliner(NODE_V1)
    assert d["NodeName"] == "gpuv1" and d["Gres"] == "gpu:v100:2" and d["State"] == "IDLE"
    assert d["OS"].startswith("Linux 6.18") and d["AllocTRES"] == "" and d["CfgTRES"].endswith("gres/gpu=2")


@pytest.mark.parametrize("text,want", [
    ("gpu:a100:2", {"a100": 2}), ("gpu:2", {None: 2}), ("(null)", {}), ("", {}),
    ("gpu:a100:2(S:0-1),mps:400", {"a100": 2}), ("gpu:v100:1(IDX:0)", {"v100": 1}),
    ("gpu:a100:0(IDX:N/A)", {"a100": 0}), ("gpu:a100:1,gpu:v100:3(S:0,1)", {"a100": 1, "v100": 3}),
])
def test_parse_gres(text, want):
    assert stext.parse_gres(text) == want


@pytest.mark.parametrize("weights,gtype,want", [
    ("CPU=0.0,GRES/gpu=4.0", "a100", 4.0), ("CPU=1.0,Mem=0.25G", "a100", None), ("", None, None),
    ("cpu=1,gres/gpu:a100=3.5,gres/gpu=1", "a100", 3.5), ("GRES/gpu:v100=2", "v100", 2.0),
])
def test_parse_billing(weights, gtype, want):
    assert stext.parse_billing(weights, gtype) == want


def test_expand_hostlist_and_states():
    assert stext.expand_hostlist("gpuv[1-2,05-06],gpua1") == ["gpuv1", "gpuv2", "gpuv05", "gpuv06", "gpua1"]
    assert stext.expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    for s in ("idle", "mixed", "allocated", "IDLE+POWERED_DOWN"):
        assert stext.node_usable(s), s
    for s in ("down*", "idle+drain", "mixed+drain", "idle*", "DOWN+NOT_RESPONDING", "IDLE+MAINT", "ALLOCATED+FAIL"):
        assert not stext.node_usable(s), s


def test_build_view_free_untyped_mapping_and_errors():
    nodes = [_node("n1", "gpu:v100:2", alloc="cpu=1,gres/gpu=1", state="MIXED"),
             _node("n2", "gpu:v100:2", "IDLE+DRAIN"), _node("c1", "(null)", parts="cpu"),
             _node("g1", "gpu:4", parts="gpu"), _node("x1", "gpu:tesla:2", parts="odd")]
    parts = [_part("v100", "n[1-2]"), _part("cpu", "c1", weights="CPU=1.0"), _part("gpu", "g1"), _part("odd", "x1")]
    v = cluster.build_view(nodes, parts)
    assert v.partition("v100").gpus_total == 4 and v.partition("v100").gpus_free == 1   # n2 drained, n1 holds 1
    assert v.types == {"v100": "v100"} and v.billing == {"v100": 2.0}
    with pytest.raises(ConfigError, match=r"partition 'cpu' has no GPUs.*partitions with GPUs: gpu, odd, v100"):
        v.gpu_partition("cpu")
    with pytest.raises(ConfigError, match=r"partition 'odd' has GPUs of type 'tesla', which is not in the GPU catalog"):
        v.gpu_partition("odd")
    with pytest.raises(ConfigError, match=r"untyped GPUs.*partition_types=\{'gpu': '<type>'\}"):
        v.gpu_partition("gpu")
    v2 = cluster.build_view(nodes, parts, partition_types={"gpu": "RTX_2060", "odd": "a100"})
    assert v2.types == {"gpu": "rtx2060", "odd": "a100", "v100": "v100"}
    assert v2.gpu_partition("gpu").gpus_free == 4
    with pytest.raises(ConfigError,
                       match=r"unknown partition 'h100' in partition_types; partitions here: cpu, gpu, odd, v100"):
        cluster.build_view(nodes, parts, partition_types={"h100": "h100"})
    with pytest.raises(ConfigError, match=r"unknown GPU type 'tpu'; known types: .*v100"):
        cluster.build_view(nodes, parts, partition_types={"gpu": "tpu"})
    with pytest.raises(ConfigError, match=r"holds v100 GPUs \(typed GRES\) but partition_types says 'a100'"):
        cluster.build_view(nodes, parts, partition_types={"v100": "a100"})


# ---- rank_gpu_type from environments ---------------------------------------------------------------
HET = {  # what ranks of `srun --het-group=0,1` saw on the local cluster (a100 x1 + v100 x2)
    "SLURM_JOB_ID": "6", "SLURM_HET_SIZE": "2", "SLURM_JOB_PARTITION": "v100",
    "SLURM_JOB_PARTITION_HET_GROUP_0": "a100", "SLURM_JOB_PARTITION_HET_GROUP_1": "v100",
    "SLURM_JOB_NODELIST_HET_GROUP_0": "gpua1", "SLURM_JOB_NODELIST_HET_GROUP_1": "gpuv[1-2]",
}


def test_rank_gpu_type_from_env_without_slurm_commands(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")        # only the environment can answer
    assert cluster.rank_gpu_type({}) is None
    assert cluster.rank_gpu_type({"HOME": "/root"}) is None
    assert cluster.rank_gpu_type({**HET, "SLURMD_NODENAME": "gpua1"}) == "a100"   # not the last component's v100
    assert cluster.rank_gpu_type({**HET, "SLURMD_NODENAME": "gpuv2"}) == "v100"
    assert cluster.rank_partition({**HET, "SLURMD_NODENAME": "gpua1"}) == "a100"
    assert cluster.rank_gpu_type({"SLURM_JOB_ID": "3", "SLURM_JOB_PARTITION": "rtx"}) == "rtx2060"
    env = {"SLURM_JOB_ID": "3", "SLURM_JOB_PARTITION": "gpu-big", "SLURMD_NODENAME": "n7"}
    assert cluster.rank_gpu_type(env, partition_types={"gpu-big": "A100_80GB"}) == "a100-80gb"
    with pytest.raises(ConfigError, match=r"cannot tell the GPU type.*'gpu-big'.*partition_types"):
        cluster.rank_gpu_type(env)
    with pytest.raises(ConfigError, match=r"unknown GPU type 'k80'"):
        cluster.rank_gpu_type(env, partition_types={"gpu-big": "k80"})


# ---- errors without a controller -----------------------------------------------------------------
def test_no_sinfo_on_path():
    with pytest.raises(SlurmError, match=r"^no Slurm here: sinfo not found") as e:
        cluster.read_cluster(env={"PATH": "/nonexistent"})
    assert "\n" not in str(e.value)


def test_missing_slurm_conf(tmp_path):
    with pytest.raises(SlurmError, match=r"controller unreachable: SLURM_CONF=.*does not exist"):
        cluster.read_cluster(env={**os.environ, "SLURM_CONF": str(tmp_path / "nope.conf")})


# ---- against the real cluster ----------------------------------------------------------------------
@pytest.mark.slurm
@pytest.mark.slurm_exclusive
def test_partitions_types_totals_billing(slurm_cluster):
    v = cluster.read_cluster()
    assert set(v.partitions) == set(LAYOUT)
    for name, (gtype, nodes, per_node, weight) in LAYOUT.items():
        p = v.gpu_partition(name)
        assert p.gpu_type == gtype and p.gres_types == (gtype,)
        assert p.nodes == nodes and p.gpus_total == per_node * len(nodes)
        assert p.billing_per_gpu == weight
        assert all(s == "idle" for s in p.node_states.values()), p.node_states
    assert v.types == {p: t[0] for p, t in LAYOUT.items()}
    assert v.billing == {"a100": 4.0, "v100": 2.0, "rtx2060": 1.0}
    assert v.total == {"a100": 2, "v100": 4, "rtx2060": 4}
    assert v.partition("v100").default
    assert "a100" in v.summary()


@pytest.mark.slurm
def test_unknown_partition_and_bad_mapping(slurm_cluster):
    v = cluster.read_cluster()
    with pytest.raises(ConfigError, match=r"^unknown partition 'h100'; partitions here: a100, rtx2060, v100$"):
        v.partition("h100")
    with pytest.raises(ConfigError, match=r"unknown partition 'gpu' in partition_types"):
        cluster.read_cluster(partition_types={"gpu": "v100"})
    with pytest.raises(ConfigError, match=r"unknown GPU type 'tesla-x'"):
        cluster.read_cluster(partition_types={"v100": "tesla-x"})
    assert cluster.read_cluster(partition_types={"v100": "Tesla-V100"}).types["v100"] == "v100"


@pytest.mark.slurm
def test_controller_unreachable(slurm_cluster, tmp_path):
    conf = tmp_path / "slurm.conf"
    text = slurm_cluster.slurm_conf.read_text()
    conf.write_text("\n".join("SlurmctldPort=1" if ln.startswith("SlurmctldPort=") else ln for ln in text.splitlines()))
    t0 = time.time()
    with pytest.raises(SlurmError, match=r"^Slurm controller unreachable: .*Unable to contact slurm controller"):
        cluster.read_cluster(env={**os.environ, "SLURM_CONF": str(conf)})
    assert time.time() - t0 < cluster.TIMEOUT_S + 5


@pytest.mark.slurm
def test_one_node_job_sees_its_gpus_and_a_private_tmp(slurm_cluster, tmp_path):
    marker = tmp_path / "host-only"
    marker.write_text("x")
    r = slurm_cluster.run("srun", "-p", "rtx2060", "--gres=gpu:rtx2060:3", "-n1", "--mem=100M", "bash", "-c",
                          f'echo "$SLURMD_NODENAME|$SLURM_JOB_PARTITION|$CUDA_VISIBLE_DEVICES|'
                          f'$(test -e {marker} && echo shared || echo private)"')
    node, part, devs, tmp = r.stdout.strip().split("|")
    # 3 of the node's 4 GPUs; which 3 depends on what a job before this one still held (srun may wait for it)
    ids = [int(d) for d in devs.split(",")]
    assert (node, part, tmp) == ("gpur1", "rtx2060", "private") and len(set(ids)) == 3, r.stdout + r.stderr
    assert set(ids) <= {0, 1, 2, 3}, r.stdout


def _free(partition):
    return cluster.read_cluster().partition(partition).gpus_free


def _wait_free(partition, want, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        if _free(partition) == want:
            return
        time.sleep(0.3)
    assert _free(partition) == want


@pytest.mark.slurm
@pytest.mark.slurm_exclusive
def test_free_gpus_drop_while_a_job_holds_them(slurm_cluster):
    _wait_free("v100", 4)
    jid = slurm_cluster.sbatch("-p", "v100", "--gres=gpu:v100:2", "-n1", "--mem=100M", "-o", "/dev/null",
                               "--wrap", "sleep 300")
    try:
        slurm_cluster.wait_running(jid)
        v = cluster.read_cluster()
        assert v.partition("v100").gpus_free == 2 and v.partition("v100").gpus_total == 4
        assert v.free_by_type()["v100"] == 2 and v.free["a100"] == 2
        assert "mixed" in v.partition("v100").node_states.values()
    finally:
        slurm_cluster.cancel(jid)
    _wait_free("v100", 4)


@pytest.mark.slurm
@pytest.mark.slurm_exclusive
def test_drained_node_is_not_free(slurm_cluster):
    _wait_free("v100", 4)
    slurm_cluster.run("scontrol", "update", "nodename=gpuv2", "state=drain", "reason=test")
    try:
        v = cluster.read_cluster()
        p = v.partition("v100")
        assert p.gpus_free == 2 and p.gpus_total == 4
        assert "drain" in p.node_states["gpuv2"] and not v.nodes["gpuv2"].usable
    finally:
        slurm_cluster.run("scontrol", "update", "nodename=gpuv2", "state=resume")
    _wait_free("v100", 4)


HELLO = r"""
import json, os, sys
sys.path.insert(0, {root!r})
from mpi4py import MPI
from hpc_jabas.slurm import cluster
c = MPI.COMM_WORLD
total = c.allreduce(c.rank + 1)
row = dict(rank=c.rank, size=c.size, total=total, node=os.environ.get("SLURMD_NODENAME"),
           part=cluster.rank_partition(os.environ), gpu_type=cluster.rank_gpu_type(os.environ))
rows = c.gather(row, root=0)
if c.rank == 0:
    open({out!r}, "w").write(json.dumps(rows))
"""


@pytest.mark.slurm
def test_hetjob_one_mpi_world_and_rank_types(slurm_cluster, slurm_tmp):
    """a100 x1 + v100 x2 as one heterogeneous job, one MPI world of 3 ranks over PMIx; each rank's type.
    The srun runs under the job scripts' hj_srun, as in every job hpc-jabas writes: Slurm 22.05's srun of
    a het step can hang after its tasks exit (this test timed out on it once in a dozen runs without)."""
    root = str(Path(__file__).resolve().parents[1])
    out = slurm_tmp / "rows.json"
    (slurm_tmp / "hello.py").write_text(HELLO.format(root=root, out=str(out)))
    (slurm_tmp / "job.sh").write_text(
        "#!/bin/bash\n"
        "#SBATCH --partition=a100 --gres=gpu:a100:1 -n1 --mem=500M\n"
        "#SBATCH hetjob\n"
        "#SBATCH --partition=v100 --gres=gpu:v100:2 -n2 --mem=500M\n"
        f"{sbatch.HJ_SRUN}\n"
        f"hj_srun srun --het-group=0,1 --mpi=pmix {slurm_cluster.python} {slurm_tmp / 'hello.py'}\n")
    jid = slurm_cluster.sbatch("-o", str(slurm_tmp / "job.out"), str(slurm_tmp / "job.sh"))
    st = slurm_cluster.wait_state(jid, timeout=120)
    log = (slurm_tmp / "job.out").read_text() if (slurm_tmp / "job.out").exists() else ""
    assert st == "COMPLETED", f"hetjob {jid} ended {st}:\n{log}"
    rows = json.loads(out.read_text())
    assert [r["size"] for r in rows] == [3, 3, 3] and {r["total"] for r in rows} == {6}
    assert [r["gpu_type"] for r in rows] == ["a100", "v100", "v100"]
    assert [r["part"] for r in rows] == ["a100", "v100", "v100"]
    assert rows[0]["node"] == "gpua1" and rows[1]["node"].startswith("gpuv")
    # sacct knows both components, with their partitions and the GPU billing of each
    # (right after the end, slurmdbd may still list the job as plain "<id>"; the "+k" records follow)
    end = time.time() + 30
    while True:
        acct = slurm_cluster.run("sacct", "-j", jid, "-X", "-n", "-P", "-o", "JobID,Partition,State,AllocTRES").stdout
        comps = {ln.split("|")[0]: ln.split("|") for ln in acct.splitlines() if ln.strip()}
        if {f"{jid}+0", f"{jid}+1"} <= set(comps) and all(c[2] == "COMPLETED" for c in comps.values()) \
                or time.time() > end:
            break
        time.sleep(0.5)
    assert comps[f"{jid}+0"][1:3] == ["a100", "COMPLETED"] and "billing=4" in comps[f"{jid}+0"][3]
    assert comps[f"{jid}+1"][1:3] == ["v100", "COMPLETED"] and "billing=4" in comps[f"{jid}+1"][3]


@pytest.mark.slurm
def test_hj_srun_stops_an_srun_that_outlives_its_step_and_keeps_the_steps_outcome(slurm_cluster, slurm_tmp):
    """The guard for the het-step hang: a command that runs its step and then never returns (as the hung
    srun does) is stopped a grace after the step ended, and the job ends as its step did."""
    jids = {}
    blind = "sacct() { return 1; }; HJ_SRUN_ACCT_S=2\n"     # sacct unreachable: no guessed success
    for name, code, pre in (("ok", 0, ""), ("bad", 1, ""), ("blind", 0, blind)):
        (slurm_tmp / f"{name}.sh").write_text(
            "#!/bin/bash\n"
            f"{sbatch.HJ_SRUN}\n{pre}"
            f"HJ_SRUN_GRACE_S=2 hj_srun bash -c 'srun -n1 sh -c \"sleep 3; exit {code}\"; exec sleep 600'\n"
            "echo \"after $?\"\n")
        jids[name] = slurm_cluster.sbatch("-p", "rtx2060", "--gres=gpu:rtx2060:1", "--mem=100M",
                                          "-o", str(slurm_tmp / f"{name}.out"), str(slurm_tmp / f"{name}.sh"))
    try:
        st = {name: slurm_cluster.wait_state(jid, timeout=90) for name, jid in jids.items()}
    finally:
        for jid in jids.values():
            slurm_cluster.cancel(jid)
    logs = {name: (slurm_tmp / f"{name}.out").read_text() for name in jids}
    assert st == {"ok": "COMPLETED", "bad": "COMPLETED", "blind": "COMPLETED"}, logs
    assert "after 0" in logs["ok"] and "after 1" in logs["bad"] and "after 1" in logs["blind"], logs
    assert "sacct does not tell" in logs["blind"] and "sacct does not tell" not in logs["ok"] + logs["bad"], logs
    assert all("after its step ended" in log for log in logs.values()), logs


@pytest.mark.slurm
def test_requeue_restarts_the_job_and_sacct_sees_it(slurm_cluster, slurm_tmp):
    log = slurm_tmp / "starts.log"
    jid = slurm_cluster.sbatch("-p", "rtx2060", "--gres=gpu:rtx2060:1", "--mem=100M", "--requeue", "-o", "/dev/null",
                               "--wrap", f"echo start ${{SLURM_RESTART_COUNT:-0}} >> {log}; sleep 300")
    try:
        slurm_cluster.wait_running(jid)
        end = time.time() + 20
        while not log.exists() and time.time() < end:
            time.sleep(0.2)
        slurm_cluster.run("scontrol", "requeue", jid)
        end = time.time() + 90                      # cred_expire=10 -> about 12 s
        while time.time() < end and len(log.read_text().splitlines()) < 2:
            time.sleep(0.5)
        assert log.read_text().split() == ["start", "0", "start", "1"]
        states = slurm_cluster.run("sacct", "-D", "-j", jid, "-X", "-n", "-P", "-o", "State").stdout.split()
        assert "REQUEUED" in states and "RUNNING" in states
    finally:
        slurm_cluster.cancel(jid)
    assert slurm_cluster.wait_state(jid, timeout=30).startswith("CANCELLED")


def test_hidden_partition_is_not_offered():
    """A Hidden partition (the local cluster's higher-tier "urgent" over the rtx2060 node, as a site's
    preemptor or admin queue) is listed to root by scontrol, but the view, and so the auto-scaler, skips it."""
    nodes = [_node("r1", "gpu:rtx2060:4", parts="rtx2060,urgent")]
    parts = [_part("rtx2060", "r1"), _part("urgent", "r1") + " PriorityTier=10 Hidden=YES"]
    v = cluster.build_view(nodes, parts)
    assert v.types == {"rtx2060": "rtx2060"} and v.partition("rtx2060").gpus_free == 4
    shown = cluster.build_view(nodes, [_part("rtx2060", "r1"), _part("urgent", "r1") + " Hidden=NO"])
    assert shown.types == {"rtx2060": "rtx2060", "urgent": "rtx2060"}
