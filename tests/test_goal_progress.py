"""The epoch budget in statistical progress (``goal = "final"``, core/adaptive/progress.py) against an independent
computation, and the headroom probe's price in the simulator (core/sim/simulate.py) against its closed form."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_jabas.core.adaptive.progress import ProgressBudget, progress_efficiency, progress_gain
from hpc_jabas.core.adaptive.stats import statistical_efficiency
from hpc_jabas.core.sim import simulate
from hpc_jabas.core.sim.simconfig import cluster_from_dict, job_from_dict


@settings(max_examples=300, deadline=None)
@given(G2=st.floats(1e-6, 1e3), S=st.floats(0.0, 1e6), B=st.integers(1, 8192), B0=st.integers(1, 1024))
def test_progress_gain_is_pollux_r_and_its_efficiency_is_pollux_E(G2, S, B, B0):
    s = B / B0
    # independently: E|g_B0|^2 / E|g_B|^2 with E|g_n|^2 = G2 + tr(Sigma) / n (McCandlish et al.; AdaScale's r)
    r = (G2 + S / B0) / (G2 + S / B)
    assert progress_gain(G2, S, B, B0) == pytest.approx(r, rel=1e-9)
    assert progress_gain(G2, S, B, B0) == pytest.approx((S / B0 + G2) / (S / B0 / s + G2), rel=1e-9)
    # one sample at B counts E = r / s samples at B0: Pollux's E(B) with B_noise = tr(Sigma) / |G|^2
    assert progress_efficiency(G2, S, B, B0) == pytest.approx(statistical_efficiency(B, S / G2, B0), rel=1e-9)
    assert 0.0 < progress_efficiency(G2, S, B, B0) <= 1.0 + 1e-12 or B < B0


@pytest.mark.parametrize("G2,S", [(None, None), (0.0, 5.0), (-1.0, 5.0), (float("nan"), 1.0)])
def test_without_a_resolved_estimate_a_sample_counts_as_one(G2, S):
    assert progress_gain(G2, S, 256, 32) == 8.0
    assert progress_efficiency(G2, S, 256, 32) == 1.0


def test_the_budget_counts_samples_times_E_and_finishes_past_the_samples_a_time_goal_stops_at():
    N, epochs, B0 = 1000, 2, 32
    bud = ProgressBudget(epochs * N)
    G2, S = 0.5, 64.0                              # B_noise = 128
    samples, B = 0, 32
    while not bud.finished():
        B = 32 if samples < 600 else 256
        bud.set_efficiency(progress_efficiency(G2, S, B, B0))
        bud.add(B)
        samples += B
    # written out: 600 samples at E(32) = 1 (19 iterations of 32 = 608), the rest at E(256) = 160 / 384
    e256 = (128 + 32) / (128 + 256)
    first = 19 * 32
    need = math.ceil((epochs * N - first) / (256 * e256))
    assert samples == first + need * 256
    assert samples > epochs * N                    # "final" trains more samples than "time" would
    assert bud.fraction >= 1.0 and bud.done == pytest.approx(first + need * 256 * e256)
    st_ = bud.state_dict()
    again = ProgressBudget(epochs * N, N)
    again.load_state_dict(st_)
    assert again.state_dict() == st_


def test_epochs_of_progress_are_counted_once_each_and_survive_a_checkpoint():
    bud = ProgressBudget(3 * 100.0, 100.0)
    seen = []
    for E in (1.0, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25):
        bud.set_efficiency(E)
        bud.add(64)                                # progress 64, 96, 128, 144, 160, 176, 192
        seen.append(bud.epochs_due())
    assert seen == [0, 0, 1, 0, 0, 0, 0] and bud.stepped == 1
    again = ProgressBudget(300.0, 100.0)
    again.load_state_dict(bud.state_dict())
    again.set_efficiency(1.0)
    again.add(8)                                   # 200: the second epoch of progress, counted once
    assert again.epochs_due() == 1 and again.epochs_due() == 0 and not again.finished()
    again.add(100)
    assert again.epochs_due() == 1 and again.finished()


def _sim(probe, every=2, p=10):
    cl = cluster_from_dict({"name": "t", "restart_s": 30.0, "queue": {"seed": 0, "period_s": 600.0},
                            "partition": [{"name": "v100", "gpu": "v100", "nodes": 1, "gpus_per_node": 2},
                                          {"name": "p100", "gpu": "p100", "nodes": 1, "gpus_per_node": 2}]})
    jb = job_from_dict({"samples": 6_000, "epochs": 2, "batch": 128, "batch_min": 64, "batch_max": 1024,
                        "micro_batch": 16, "p": p, "stop": "samples", "seed": 0,
                        "gradstats": {"curve": "mccandlish", "b_start": 128, "b_end": 2048, "tau": 0.3},
                        "policy": {"headroom_probe": probe, "headroom_every": every}})
    sim = simulate.Simulation(cl, jb)
    return sim, sim.run("simigrad")


def test_the_simulator_prices_each_probe_and_decides_as_without():
    sim0, r0 = _sim(0)
    sim1, r1 = _sim(200, every=2, p=10)
    assert r1.trajectory == r0.trajectory                  # a price, not a signal: the same decisions
    # the probe's closed form: 3 passes x (12 micro-batches of 16 + one of 8) on the slower of v100 and p100
    assert simulate.PROBE_PASSES == 3.0
    one = max(3.0 * (12 * sim1.model.t_micro(g, 16) + sim1.model.t_micro(g, 8)) for g in ("v100", "p100"))
    assert simulate.probe_seconds(lambda g, b: sim1.model.t_micro(g, b), ["p100", "v100"], 200, 16) == \
        pytest.approx(one, rel=1e-12)
    rounds = r0.totals["iterations"] // 10                  # simigrad decides at every 10th iteration
    probes = (rounds - 1) // 2 + 1                          # the first round, then every 2nd
    assert r1.totals["time_s"] - r0.totals["time_s"] == pytest.approx(probes * one, rel=1e-6, abs=1e-6)


def _fit(tmp_path, goal):
    import json

    import torch

    import hpc_jabas as hj
    g = torch.Generator().manual_seed(4)
    x = torch.randn(480, 8, generator=g)
    y = ((x[:, 0] + x[:, 1]) > 0).long()
    y = torch.where(torch.rand(480, generator=g) < 0.3, 1 - y, y)     # label noise: B_noise to measure
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    cfg = hj.JobConfig(gpu_types=["v100"], emulate=True, emulate_base_s=1e-4, emulate_per_sample_s=1e-5,
                       policy="noise-scale", batch=16, batch_min=16, batch_max=256, micro_batch=8, p=4, epochs=5,
                       goal=goal, run_dir=str(tmp_path / goal), checkpoint=False, metrics_period=1)
    tr = hj.Trainer(model, opt, torch.utils.data.TensorDataset(x, y), torch.nn.CrossEntropyLoss(), config=cfg,
                    scheduler=sched)
    res = tr.fit(epochs=3)                      # fit's epochs, not the key's, are the budget
    recs = [json.loads(s) for s in (tmp_path / goal / "metrics.jsonl").read_text().splitlines()]
    return tr, res, sched, recs


def test_goal_final_trains_to_its_progress_budget_and_steps_the_schedule_at_epochs_of_progress(tmp_path):
    N, epochs = 480, 3
    tr_t, res_t, sched_t, _ = _fit(tmp_path, "time")
    assert res_t["samples"] == epochs * N and sched_t.last_epoch == epochs
    tr, res, sched, recs = _fit(tmp_path, "final")
    its = sorted((r for r in recs if r["type"] == "iteration"), key=lambda r: r["it"])
    ds = sorted((r for r in recs if r["type"] == "decision"), key=lambda r: r["at_iteration"])
    assert any(d["B"] > 16 and d["stats"]["progress_E"] < 1 for d in ds)
    # the ledger written out: iteration j counts its samples x the E of the last decision in force at j
    done, E, k, ends = 0.0, 1.0, 0, []
    for r in its:
        while k < len(ds) and ds[k]["at_iteration"] <= r["it"]:
            E = min(1.0, ds[k]["stats"]["progress_E"])
            k += 1
        done += r["samples"] * E
        ends.append(done)
    assert ends[-1] >= epochs * N * (1 - 1e-12) > ends[-2]           # ended at the first iteration past the budget
    assert res["samples"] == sum(r["samples"] for r in its) > epochs * N   # more samples than "time" trains
    assert tr.sampler.epoch >= epochs                                # past its epochs of data...
    assert sched.last_epoch == epochs                                # ...the schedule stepped per epoch of progress
    assert ds[-1]["stats"]["progress"] == pytest.approx(ends[ds[-1]["at_iteration"] - 1] / (epochs * N), rel=1e-9)
