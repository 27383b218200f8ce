"""slurm/queue.py without Slurm: `sbatch --test-only` output parsed into a queue wait, the probe's options
(those of the chain's real job), and the wait asked through a stand-in sbatch on PATH."""
from __future__ import annotations

import time

import pytest
from test_slurm_text import _exe, _spec, _view

from hpc_jabas.errors import SlurmError
from hpc_jabas.slurm import queue

ONE = "sbatch: Job 123 to start at 2026-12-01T10:00:00 using 4 processors on nodes gpuv1 in partition v100\n"
HET = ("sbatch: Job 77 to start at 2026-12-01T10:00:00 using 2 processors on nodes gpua1 in partition a100\n"
       "sbatch: Job 77 to start at 2026-12-01T12:30:00 using 4 processors on nodes gpuv[1-2] in partition v100\n")


def _t(s: str) -> float:
    return time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%S"))


def test_parse_test_only_lines():
    (e,) = queue.parse_test_only(ONE)
    assert e == queue.StartEstimate("123", "2026-12-01T10:00:00", 4, "gpuv1", "v100")
    a, b = queue.parse_test_only(HET)
    assert (a.partition, b.partition, b.nodes) == ("a100", "v100", "gpuv[1-2]")
    # older Slurm prints no partition; a job that Slurm refuses prints no estimate
    (c,) = queue.parse_test_only("sbatch: Job 9 to start at 2026-12-01T09:00:05 using 1 processors on nodes n1")
    assert c.partition is None and c.nodes == "n1"
    assert queue.parse_test_only("sbatch: error: Batch job submission failed: Requested node configuration "
                                 "is not available") == []
    assert queue.parse_test_only("") == []


def test_wait_from_output():
    now = _t("2026-12-01T09:00:00")
    assert queue.wait_from_output(ONE, now) == pytest.approx(3600.0)
    assert queue.wait_from_output(HET, now) == pytest.approx(3.5 * 3600)       # the last component's start
    assert queue.wait_from_output(ONE, _t("2026-12-01T11:00:00")) == 0.0        # could start now
    assert queue.wait_from_output("sbatch: error: QOSMaxGRESPerUser", now) is None


def test_probe_has_the_real_jobs_options(tmp_path):
    spec = _spec(tmp_path, {"v100": 3}, account="proj", qos="low", time_min=90, sbatch_args="--constraint=ib")
    args = queue.test_only_args({"v100": 3, "a100": 1}, _view(), spec)
    assert args[:2] == ["sbatch", "--test-only"]
    i = args.index(":")
    first, second = args[2:i], args[i + 1:]
    assert "--partition=a100" in first and "--gres=gpu:a100:1" in first and "--ntasks=1" in first
    assert "--partition=v100" in second and "--nodes=2" in second and "--gpus-per-task=v100:1" in second
    for comp in (first, second):
        assert {"--time=90", "--account=proj", "--qos=low", "--constraint=ib"} <= set(comp)


def test_expected_wait_through_a_stand_in_sbatch(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 7200))
    line = f"sbatch: Job 5 to start at {start} using 2 processors on nodes gpua1 in partition a100"
    _exe(b / "sbatch", f'cat > {b}/stdin.txt\necho "$@" > {b}/args.txt\necho "{line}" >&2\n')
    env = {"PATH": f"{b}:/usr/bin:/bin", "SLURM_JOB_ID": "99"}
    w = queue.expected_wait({"a100": 2}, _view(), None, env)
    assert 7190 <= w <= 7200
    assert (b / "args.txt").read_text().startswith("--test-only") and "true" in (b / "stdin.txt").read_text()
    # Slurm refuses the job (exit 1, no estimate): no start; too many GPUs for the partition: no start, no call
    _exe(b / "sbatch", 'echo "sbatch: error: Batch job submission failed: Requested node configuration is not '
                       'available" >&2\nexit 1\n')
    assert queue.expected_wait({"a100": 2}, _view(), None, env) is None
    assert queue.expected_wait({"a100": 9}, _view(), None, env) is None
    # no sbatch at all: expected_wait says so; the estimator turns it into "no start"
    with pytest.raises(SlurmError, match="no Slurm here"):
        queue.expected_wait({"a100": 2}, _view(), None, {"PATH": str(tmp_path)})
    assert queue.wait_estimator(_view(), None, {"PATH": str(tmp_path)})({"a100": 2}) is None


def test_capacity_counts_busy_gpus_on_usable_nodes_only():
    from hpc_jabas.slurm.cluster import ClusterView, NodeView, PartitionView
    nodes = {"gpur1": NodeView("gpur1", "mixed", ("rtx2060",), {"rtx2060": 4}, 4),      # busy: another job
             "gpuv1": NodeView("gpuv1", "idle", ("v100",), {"v100": 2}, 0),
             "gpuv2": NodeView("gpuv2", "drained", ("v100",), {"v100": 2}, 0)}
    parts = {"rtx2060": PartitionView("rtx2060", "rtx2060", ("rtx2060",), ("gpur1",), {"gpur1": "mixed"}, 4, 0, 1.0),
             "v100": PartitionView("v100", "v100", ("v100",), ("gpuv1", "gpuv2"),
                                   {"gpuv1": "idle", "gpuv2": "drained"}, 4, 2, 2.0)}
    view = ClusterView(parts, nodes)
    assert queue.capacity(view, {"rtx2060": 0, "v100": 2}) == {"rtx2060": 4, "v100": 2}
    # a stand-in view without partitions: what is available now
    assert queue.capacity(object(), {"v100": 1}) == {"v100": 1}
