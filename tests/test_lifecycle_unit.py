"""Epoch-end auto-scaler adapter with a stub cluster view: forecast, pricing, choice, forecast error."""
import pytest
from fake_trainer import FakeTrainer

from hpc_jabas.core.adaptive.decision import MoveDecision
from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.job.lifecycle import EpochEndAutoscaler, epoch_time_fn, expand_mix


class View:
    types = {"a100": "a100", "v100": "v100", "rtx2060": "rtx2060"}
    free = {"a100": 0, "v100": 2, "rtx2060": 4}
    billing = {"a100": 4.0, "v100": 2.0, "rtx2060": 1.0}


def stub_trainer(epochs=3, policy="similarity"):
    cfg = JobConfig(epochs=epochs, batch=64, batch_min=32, batch_max=256, policy=policy, p=5, planner="optimal",
                    emulate=True).validate()
    traj = [(0, 64), (5, 80), (10, 96), (15, 112)]
    return FakeTrainer(cfg, iteration=16, B=64, num_samples=1000, trajectory=traj)


def spec(objective, **kw):
    return JobSpec(task="examples.train_digits:build", config={"autoscale": {"objective": objective, **kw}},
                   chain_dir="/tmp/x", mix={"a100": 1, "v100": 2})


def test_expand_mix_sorted_partitions():
    assert expand_mix({"v100": 2, "a100": 1}, View.types) == ["a100", "v100", "v100"]


def test_epoch_time_more_gpus_is_faster_and_consumes_the_epoch():
    model = PerfModel.emulated(["a100", "v100", "rtx2060"], [4, 8, 16, 32, 64], 0.002, 0.0002)
    fn = epoch_time_fn(model, View.types, [64, 128], 5, 1000)
    t1, t3 = fn({"rtx2060": 1}), fn({"rtx2060": 3})
    assert t3 < t1
    # one rtx2060: 5 its of 64 + the rest at 128: exactly the model's iteration times
    from hpc_jabas.core.planning import plan_batch
    g = ["rtx2060"]
    expect = (5 * model.iteration_time(plan_batch(64, g, model), g)
              + 6 * model.iteration_time(plan_batch(128, g, model), g))
    assert t1 == pytest.approx(expect)


def test_cost_objective_moves_to_cheap_mix_and_time_objective_stays_or_grows():
    tr = stub_trainer()
    a = EpochEndAutoscaler(spec("cost", restart_prior_s=1.0), read_cluster=lambda pt: View())
    d = a.decide(tr, epoch=0)
    rec = tr.metrics.recs[-1]
    assert d.move and set(d.mix) == {"rtx2060"} and d.reason == rec["reason"]
    assert rec["forecast"] and all(32 <= B <= 256 for B in rec["forecast"])
    assert any(r["feasible"] for r in rec["table"]) and rec["rates"] == View.billing
    tr2 = stub_trainer()
    d2 = EpochEndAutoscaler(spec("time", restart_prior_s=1e6), read_cluster=lambda pt: View()).decide(tr2, 0)
    assert not d2.move and d2.mix is None     # a huge restart overhead never pays off


def test_last_epoch_does_not_move_and_forecast_error_is_scored():
    tr = stub_trainer(epochs=2)
    a = EpochEndAutoscaler(spec("cost"), read_cluster=lambda pt: View())
    a.decide(tr, epoch=0)
    fc = a.state.forecast
    tr.iteration = fc["start"] + 3 * fc["p"]
    tr.trajectory.append((fc["start"], 128))
    d = a.decide(tr, epoch=1)
    assert d == MoveDecision.stay("last epoch") and tr.metrics.recs[-1]["reason"] == "last epoch"
    assert tr.metrics.recs[-1]["forecast_error"] >= 0.0


def test_state_round_trips_and_restart_overheads_price_the_move():
    a = EpochEndAutoscaler(spec("cost", restart_prior_s=1.0), read_cluster=lambda pt: View())
    a.decide(stub_trainer(), epoch=0)
    a.record_restart(12.5)
    b = EpochEndAutoscaler(spec("cost", restart_prior_s=1.0), read_cluster=lambda pt: View())
    b.load_state_dict(a.state_dict())
    assert b.state == a.state and b.state.restart_overheads == [12.5] and b.state.forecast["B"]
    tr = stub_trainer()
    b.decide(tr, epoch=0)
    assert tr.metrics.recs[-1]["restart_overhead_s"] == pytest.approx(12.5)   # the measured one, not the prior


def test_expected_failures_stay_and_act_without_submitter_stays():
    from hpc_jabas.errors import SlurmError

    def no_slurm(pt):
        raise SlurmError("sinfo not found")
    tr = stub_trainer()
    d = EpochEndAutoscaler(spec("cost"), read_cluster=no_slurm).decide(tr, epoch=0)
    assert not d.move and "sinfo not found" in d.reason and tr.metrics.recs[-1]["error"] == "sinfo not found"
    a = EpochEndAutoscaler(spec("cost"), read_cluster=lambda pt: View())
    res = a.act(tr, MoveDecision(True, {"rtx2060": 2}, "cheaper"))
    assert not res.move and tr.metrics.recs[-1]["type"] == "autoscale_note"


def test_act_submits_and_names_the_next_job(tmp_path):
    sub = []
    s = JobSpec(task="m:f", config={"autoscale": {"objective": "cost"}}, chain_dir=str(tmp_path),
                mix={"a100": 1, "v100": 2})
    a = EpochEndAutoscaler(s, submit_fn=lambda sp: sub.append(sp) or 4242, job_id="41")
    tr = stub_trainer()
    tr.last_checkpoint_time = 1000.0
    res = a.act(tr, MoveDecision(True, {"rtx2060": 2}, "cheaper"))
    assert res == MoveDecision(True, {"rtx2060": 2}, "cheaper", job_id="4242")
    assert sub[0].mix == {"rtx2060": 2}
    from hpc_jabas.slurm import chain as chainlog
    moves = [e for e in chainlog.read(str(tmp_path)) if e["event"] == "move"]
    assert moves[-1]["to_job"] == 4242 and moves[-1]["checkpoint_time"] == 1000.0


def test_unknown_autoscale_key_is_one_clear_line():
    with pytest.raises(ConfigError, match="unknown autoscale key 'objectiv'"):
        EpochEndAutoscaler(JobSpec(task="m:f", config={"autoscale": {"objectiv": "time"}}, chain_dir="/tmp/x",
                                   mix={"v100": 1}))


def test_queue_wait_is_asked_only_when_configured_and_a_busy_partition_is_avoided(monkeypatch):
    from hpc_jabas.slurm import queue
    asked = []

    def estimator(view, spec):
        def wait(mix):
            asked.append(dict(mix))
            return 86_400.0 if "rtx2060" in mix else 5.0        # the cheap partition is busy for a day
        return wait
    monkeypatch.setattr(queue, "wait_estimator", estimator)
    tr = stub_trainer()
    d = EpochEndAutoscaler(spec("cost", restart_prior_s=1.0), read_cluster=lambda pt: View()).decide(tr, 0)
    assert d.move and set(d.mix) == {"rtx2060"} and asked == []           # default: no queue estimate
    tr = stub_trainer()
    d = EpochEndAutoscaler(spec("cost", restart_prior_s=1.0, max_queue_wait_s=3600.0),
                           read_cluster=lambda pt: View()).decide(tr, 0)
    assert asked and "rtx2060" not in (d.mix or {}) and "queue wait priced" in d.reason
    rows = {r["label"]: r for r in tr.metrics.recs[-1]["table"]}
    assert all(not r["feasible"] for lbl, r in rows.items() if "rtx2060" in lbl)


def test_whole_node_units_from_the_view():
    from support.slurm_records import node as _node
    from support.slurm_records import part as _part

    from hpc_jabas.slurm.cluster import build_view
    view = build_view([_node("gpuv1", "gpu:v100:2", "IDLE", "v100"), _node("gpuv2", "gpu:v100:2", "IDLE", "v100"),
                       _node("gpur1", "gpu:rtx2060:4", "IDLE", "rtx2060")],
                      [_part("v100", "gpuv[1-2]"), _part("rtx2060", "gpur1", "CPU=0.0,GRES/gpu=1.0")])
    tr = stub_trainer()
    s = JobSpec(task="examples.train_digits:build", chain_dir="/tmp/x", mix={"v100": 2},
                config={"autoscale": {"objective": "time", "restart_prior_s": 0.0, "unit": 0}})
    EpochEndAutoscaler(s, read_cluster=lambda pt: view).decide(tr, 0)
    rows = tr.metrics.recs[-1]["table"]
    assert len(rows) > 1 and all(r["mix"].get("rtx2060", 0) in (0, 4) and r["mix"].get("v100", 0) in (0, 2, 4)
                                 for r in rows)


@pytest.mark.parametrize("objective,kw", [("cost", {}), ("time", {}), ("time", {"margin": 0.0}),
                                          ("time-under-budget", {"budget": 1e-4}),
                                          ("time-under-budget", {"budget": 0.00163, "margin": 0.0}),
                                          ("cost-under-deadline", {"deadline_s": 0.4}),
                                          ("cost-under-deadline", {"deadline_s": 0.59})])
def test_the_search_decides_as_brute_force_did(monkeypatch, objective, kw):
    """The hook's decision with mixsearch.search equals choose over every mix (the old enumerate_mixes path)."""
    from hpc_jabas.core.autoscale import mixsearch
    from hpc_jabas.core.autoscale import scaler as autoscale

    def decide():
        tr = stub_trainer()
        d = EpochEndAutoscaler(spec(objective, restart_prior_s=0.05, max_gpus=6, **kw),
                               read_cluster=lambda pt: View()).decide(tr, 0)
        return d, tr.metrics.recs[-1]
    import functools
    monkeypatch.setattr(mixsearch, "search", functools.partial(mixsearch.search, brute_max=0))   # the tree
    d_search, rec = decide()
    assert "exact" in rec["reason"] and "nodes" in rec["reason"]

    def brute(current, free, types, fn, rates, obj, overhead, bound, *, max_gpus, min_gpus, allowed, max_partitions,
              unit, exact_upto, wait_fn, max_queue_wait_s, **kw):
        cands = autoscale.enumerate_mixes(free, types, max_gpus=max_gpus, min_gpus=min_gpus, allowed=allowed,
                                          max_partitions=max_partitions)
        return autoscale.choose(current, cands, fn, rates, obj, overhead, **kw)
    monkeypatch.setattr(mixsearch, "search", brute)
    d_brute, _ = decide()
    assert (d_search.move, d_search.mix) == (d_brute.move, d_brute.mix)
