"""Queue-aware moves on the real local cluster (slurm/local/up.sh): another job keeps the rtx2060
partition busy; `sbatch --test-only` gives that partition a long expected wait and a free one none, and the
queue-aware decision (core/mixsearch.search with slurm/queue's wait) avoids the busy partition that the
queue-blind one picks."""
from __future__ import annotations

import pytest
from slurm_env import slurm_cluster, slurm_tmp  # noqa: F401  (fixtures)

from hpc_jabas.core.autoscale import mixsearch
from hpc_jabas.slurm import queue
from hpc_jabas.slurm.cluster import read_cluster

# samples/s per GPU of a made-up job: rtx2060 is the cheapest per sample (billing 1 per 1.5, v100 2 per 2)
SPEED = {"a100": 4.0, "v100": 2.0, "rtx2060": 1.5}
WORK = 36_000.0

pytestmark = pytest.mark.slurm


def epoch_time(mix):
    return WORK / sum(n * SPEED[p] for p, n in mix.items())


@pytest.mark.slurm_exclusive
def test_queue_aware_choice_avoids_a_busy_partition(slurm_cluster, slurm_tmp):  # noqa: F811
    env = slurm_cluster.env
    blocker = slurm_cluster.sbatch("--partition=rtx2060", "--gres=gpu:rtx2060:4", "--ntasks=1", "--mem=256M",
                                   "--time=30", f"--output={slurm_tmp}/blocker.out", "--wrap=sleep 1800")
    try:
        slurm_cluster.wait_running(blocker)
        view = read_cluster(env=env)
        assert view.free["rtx2060"] == 0
        # the busy partition starts when the blocker's 30-minute limit ends; a free one now; a hetjob when its
        # last component does
        busy = queue.expected_wait({"rtx2060": 4}, view, None, env)
        idle = queue.expected_wait({"v100": 2}, view, None, env)
        het = queue.expected_wait({"rtx2060": 2, "v100": 2}, view, None, env)
        assert idle is not None and idle < 60, idle
        # (Slurm's backfill plans the start at or after the blocker's limit; seen: 1790-2700 s)
        assert busy is not None and 600 < busy <= 2 * 1800, busy
        assert het is not None and het > 600, het
        # more GPUs than the partition has: Slurm refuses, no start
        assert queue.expected_wait({"v100": 8}, view, None, env) is None

        cap = queue.capacity(view, view.free)
        assert cap["rtx2060"] == 4
        types, rates = view.types, view.billing
        bound = mixsearch.Bound(WORK, {p: SPEED[p] for p in types})
        kw = dict(max_gpus=4, max_partitions=1, remaining_epochs=2)
        blind = mixsearch.search({"v100": 2}, cap, types, epoch_time, rates, "cost", 0.0, bound, **kw)
        assert blind.mix == {"rtx2060": 4}                       # cheapest per sample, if it were free
        aware = mixsearch.search({"v100": 2}, cap, types, epoch_time, rates, "cost", 0.0, bound,
                                 wait_fn=queue.wait_estimator(view, None, env), max_queue_wait_s=600.0, **kw)
        assert "rtx2060" not in aware.mix and "queue wait priced" in aware.reason, aware.reason
        rows = {r["label"]: r for r in aware.table}
        assert "rtx2060:4" not in rows or not rows["rtx2060:4"]["feasible"]
        # time objective, no cap: half an epoch left on v100:2 (4500 s), 3000 s on rtx2060:4; the ~1800 s wait
        # makes the move slower than staying
        kw = dict(max_gpus=4, allowed=["rtx2060"], remaining_epochs=0.5)
        t = mixsearch.search({"v100": 2}, cap, types, epoch_time, rates, "time", 0.0, bound, **kw)
        assert t.mix == {"rtx2060": 4}
        t = mixsearch.search({"v100": 2}, cap, types, epoch_time, rates, "time", 0.0, bound,
                             wait_fn=queue.wait_estimator(view, None, env), **kw)
        assert t.mix == {"v100": 2} and not t.move, t.reason
        row = next(r for r in t.table if r["label"] == "rtx2060:4")
        assert row["wait_s"] > 600 and row["total_time_s"] == pytest.approx(row["time_s"] * 0.5 + row["wait_s"])
    finally:
        slurm_cluster.cancel(blocker)
