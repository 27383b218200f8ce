"""The one decision protocol (runtime/protocol.py): rank 0 decides, every rank applies the same
decision, and nothing rank 0's decide step raises takes the job down (invariants 4 and 8).

Unit tests drive DecisionChannel and the rank-0 metrics gather with stand-in collectives; the
MPI tests run 3 Horovod ranks with a policy and an auto-scaler that fail on rank 0."""
import json

import pytest
import torch
from mpi_util import run_ranks

from hpc_jabas.core.adaptive.decision import Decision, MoveDecision
from hpc_jabas.core.planning import Plan
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.metrics import PER_RANK, IterationMetrics
from hpc_jabas.runtime.persist import checkpoint as ckpt
from hpc_jabas.runtime.protocol import DecisionChannel
from hpc_jabas.runtime.record import StepRecord


class Sink:
    def __init__(self):
        self.recs = []

    def write(self, r):
        self.recs.append(r)


def two_ranks():
    """Rank 0's channel and rank 1's, joined by a broadcast that hands rank 0's envelope over."""
    sent = []

    def bcast0(obj, name):
        sent.append((name, obj))
        return obj

    def bcast1(obj, name):
        assert obj is None and sent[-1][0] == name      # same round name on both ranks
        return sent[-1][1]
    sink = Sink()
    return DecisionChannel(0, sink, bcast0), DecisionChannel(1, None, bcast1), sink, sent


PLAN = Plan(4, (2, 1, 1))


def noop():
    return Decision.noop(7, 16, PLAN, 1.0, reason="contained")


def both(c0, c1, decide, **kw):
    d0 = c0.run("decision", 7, decide, Decision.from_dict, noop=noop, **kw)
    d1 = c1.run("decision", 7, lambda: pytest.fail("decide ran on rank 1"), Decision.from_dict, noop=noop, **kw)
    return d0, d1


def test_a_decision_reaches_every_rank_unchanged():
    c0, c1, sink, sent = two_ranks()
    d = Decision(7, 32, Plan(4, (4, 2, 2)), 1.41, reason="similarity", stats={"similarity": 0.3}, kind="batch")
    d0, d1 = both(c0, c1, lambda: d)
    assert d0 == d1 == d and sent[0][0] == "hj.decide.decision"
    assert c0.contained_errors == c1.contained_errors == 0 and sink.recs == []


def test_rank0_exception_is_contained_as_a_noop_on_every_rank():
    c0, c1, sink, _ = two_ranks()

    def boom():
        raise ZeroDivisionError("policy blew up")
    d0, d1 = both(c0, c1, boom)
    assert d0 == d1 == noop() and d0.kind == "noop"
    assert c0.contained_errors == c1.contained_errors == 1
    (rec,) = sink.recs
    assert rec["type"] == "contained_error" and rec["stage"] == "decision" and rec["it"] == 7 and rec["count"] == 1
    assert rec["error"] == "ZeroDivisionError: policy blew up"
    assert "Traceback" in rec["traceback"] and "in boom" in rec["traceback"]
    both(c0, c1, boom)
    assert c0.contained_errors == c1.contained_errors == 2 and sink.recs[-1]["count"] == 2


def test_a_decision_that_fails_validation_or_encoding_is_contained():
    c0, c1, sink, _ = two_ranks()

    def check(d):
        if d.plan.world_size != 3:
            raise RuntimeError(f"plan {d.plan} does not fit 3 ranks")
    d0, d1 = both(c0, c1, lambda: Decision(7, 8, Plan(4, (1, 1)), 1.0), validate=check)
    assert d0 == d1 == noop() and c1.contained_errors == 1
    assert "does not fit 3 ranks" in sink.recs[-1]["error"]
    d0, d1 = both(c0, c1, lambda: object())             # no to_dict: an internal bug, contained too
    assert d0 == d1 == noop() and c1.contained_errors == 2 and "AttributeError" in sink.recs[-1]["error"]


def test_no_decision_and_failing_noop_give_none_everywhere():
    c0, c1, sink, _ = two_ranks()
    assert both(c0, c1, lambda: None) == (None, None) and c1.contained_errors == 0

    def bad_noop():
        raise ValueError("noop too")

    def boom():
        raise RuntimeError("x")
    d0 = c0.run("r", 3, boom, Decision.from_dict, noop=bad_noop)
    d1 = c1.run("r", 3, boom, Decision.from_dict, noop=bad_noop)
    assert d0 is None and d1 is None and c0.contained_errors == c1.contained_errors == 1


def test_move_decisions_ride_the_same_protocol_and_state_round_trips():
    c0, c1, sink, _ = two_ranks()
    mv = MoveDecision(True, {"rtx2060": 2}, "cheaper")
    r0 = c0.run("epoch_end.decide", 9, lambda: mv, MoveDecision.from_dict, noop=lambda: MoveDecision.stay("x"))
    r1 = c1.run("epoch_end.decide", 9, lambda: mv, MoveDecision.from_dict, noop=lambda: MoveDecision.stay("x"))
    assert r0 == r1 == mv
    c0.contained_errors = 5
    c2 = DecisionChannel(0, None, lambda o, n: o)
    c2.load_state_dict(c0.state_dict())
    assert c2.contained_errors == 5


def test_interrupts_are_not_contained():
    c = DecisionChannel(0, Sink(), lambda o, n: o)

    def stop():
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        c.run("decision", 0, stop, Decision.from_dict)


def test_decision_kinds_are_checked():
    with pytest.raises(ValueError, match="kind 'resize'"):
        Decision(1, 8, Plan(4, (2,)), 1.0, kind="resize")
    with pytest.raises(ValueError, match="kind 'resize'"):
        Decision.from_dict({**Decision(1, 8, Plan(4, (2,)), 1.0).to_dict(), "kind": "resize"})
    with pytest.raises(ValueError, match="needs a partition mix"):
        MoveDecision(True, None)


def _rec(rank, it, **kw):
    r = {"rank": rank, "it": it, "epoch": 0, "B": 12, "samples": 12, "plan": "b=2 n=3,2,1", "lr_scale": 1.0,
         "compute_s": 0.1 * (rank + 1), "real_compute_s": 0.05, "emulation_wait_s": 0.05, "wait_s": 0.01 * it,
         "iter_s": 0.2 + rank, "n_local": 3 - rank, "loss_sum": 1.5 * (rank + 1), "slowdown": 1.0 + rank,
         "contained_errors": 1, "b": 2, "x": 2 * (3 - rank), "loss_weight": 2.0 * (3 - rank), "measure": False,
         "skipped": False}
    r.update(kw)
    return StepRecord(**r)


def test_metrics_gathered_to_rank0_as_one_float_tensor():
    """Ranks 1 and 2 send their numbers; rank 0 writes one record per iteration, fields as before."""
    sent = {}

    def gather_from(rank):
        def g(t, name):
            assert name == "hj.metrics" and t.dtype == torch.float64 and t.shape[1] == len(PER_RANK)
            sent[rank] = t
            return torch.cat([sent[r] for r in sorted(sent)]) if rank == 0 else t
        return g
    sinks = [Sink() for _ in range(3)]
    ms = [IterationMetrics(r, 3, sinks[r], gather_from(r)) for r in range(3)]
    for r in (2, 1, 0):
        for it in (4, 5):
            ms[r].add(_rec(r, it, stats={"similarity": 0.5}, measure=True) if it == 5 else _rec(r, it, measure=False))
        assert len(ms[r]) == 2
    for r in (1, 2, 0):
        ms[r].flush()
    assert sinks[1].recs == [] and sinks[2].recs == [] and len(ms[0]) == 0
    a, b = sinks[0].recs
    assert a == {"type": "iteration", "it": 4, "epoch": 0, "B": 12, "samples": 12, "plan": "b=2 n=3,2,1",
                 "iter_s": 2.2, "samples_per_s": 12 / 2.2, "lr_scale": 1.0, "loss": (1.5 + 3.0 + 4.5) / 12,
                 "compute_s": [0.1, 0.2, 0.30000000000000004], "wait_s": [0.04] * 3, "n_local": [3, 2, 1],
                 "slowdown": [1.0, 2.0, 3.0], "contained_errors": 1, "measure": False}
    assert b["it"] == 5 and b["stats"] == {"similarity": 0.5} and b["wait_s"] == [0.05] * 3 and b["measure"] is True
    ms[0].flush()                       # nothing pending: no collective, nothing written
    assert len(sinks[0].recs) == 2


def test_metrics_from_a_missing_rank_is_an_error():
    m = IterationMetrics(0, 3, Sink(), lambda t, name: t)      # only rank 0's rows came back
    m.add(_rec(0, 1))
    with pytest.raises(RuntimeError, match="came from ranks \\[0\\], expected 0..2"):
        m.flush()


# ---- 3 Horovod ranks ------------------------------------------------------------------------------
ADAPTIVE = {"planner": "lbbsp", "micro_batch": 4, "speeds": [1.0, 0.5, 0.25], "p": 5, "batch": 32,
            "batch_min": 16, "batch_max": 96, "lr_rule": "sqrt", "policy": "similarity", "gamma": 0.9,
            "alpha": 0.25, "checkpoint": False, "epochs": 100}


def _metrics(run_dir):
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_rank0_policy_failures_are_contained_and_all_ranks_agree(tmp_path, backend):
    run_dir = tmp_path / "run"
    fail_at = {"10": "raise", "20": "bad_plan"}
    res = run_ranks("protocol_worker.py", {"mode": "decide", "run_dir": str(run_dir), "steps": 30, "n": 512,
                                           "fail_at": fail_at, "config": ADAPTIVE}, np_=3, backend=backend)
    assert [r["backend"] for r in res] == [backend] * 3
    # training went on to the end, on every rank
    assert [r["iterations"] for r in res] == [30, 30, 30]
    assert [r["contained_errors"] for r in res] == [2, 2, 2]
    # invariant 4: the same (B, plan, lr) on every rank at every iteration
    hist = res[0]["history"]
    assert len(hist) == 30 and [h["it"] for h in hist] == list(range(30))
    for r in res[1:]:
        assert r["history"] == hist
    assert res[1]["params"] == res[0]["params"] == res[2]["params"]
    # the failed rounds changed nothing; the others decided as usual
    for it in (10, 20):
        assert (hist[it]["B"], hist[it]["plan"], hist[it]["lr_scale"]) == \
               (hist[it - 1]["B"], hist[it - 1]["plan"], hist[it - 1]["lr_scale"])
    recs = _metrics(run_dir)
    errors = [r for r in recs if r["type"] == "contained_error"]
    assert [(e["stage"], e["it"], e["count"]) for e in errors] == [("decision", 10, 1), ("decision", 20, 2)]
    assert errors[0]["error"] == "ZeroDivisionError: injected policy failure at iteration 10"
    assert "Traceback" in errors[0]["traceback"] and "in decide" in errors[0]["traceback"]
    assert "does not fit 3 ranks" in errors[1]["error"]
    decisions = [r for r in recs if r["type"] == "decision"]
    assert [d["at_iteration"] for d in decisions] == [5, 15, 25, 30] and {d["kind"] for d in decisions} == {"batch"}
    its = {r["it"]: r for r in recs if r["type"] == "iteration"}
    assert sorted(its) == list(range(30))
    assert [its[i]["contained_errors"] for i in (0, 9, 10, 19, 20, 29)] == [0, 0, 1, 1, 2, 2]
    for i, h in enumerate(hist):
        assert (its[i]["B"], its[i]["lr_scale"]) == (h["B"], h["lr_scale"])
        if its[i]["samples"] == h["B"]:               # (an epoch's shrunk tail runs a smaller plan)
            assert its[i]["plan"] == h["plan"]
        assert len(its[i]["compute_s"]) == 3 and sum(its[i]["n_local"]) * 4 == its[i]["samples"]


def test_autoscaler_failure_at_an_epoch_end_keeps_the_checkpoint_and_the_job(tmp_path):
    run_dir = tmp_path / "run"
    cfg = {"epochs": 3, "batch": 24, "emulate": True, "gpu_types": ["v100"] * 3, "emulate_base_s": 0.0005,
           "emulate_per_sample_s": 0.0, "keep_checkpoints": 5}
    res = run_ranks("protocol_worker.py", {"mode": "epoch_end", "run_dir": str(run_dir), "n": 96,
                                           "stop_after_epochs": 2, "config": cfg}, np_=3)
    k = 96 // 24                                  # iterations per epoch
    # the failure at epoch 0's end was contained; the job went on into epoch 1 (and stopped after it)
    for r in res:
        assert r["epoch"] == 2 and r["iterations"] == 2 * k and r["contained_errors"] == 1
    assert res[0]["cluster_calls"] == 2           # epoch 0 (raised) and epoch 1
    # epoch 0's checkpoint is on disk although its decide step failed; so are the later ones
    names = [p.name for p in ckpt.list_checkpoints(run_dir / "checkpoints")]
    assert names == [ckpt.name_for(e + 1, (e + 1) * k) for e in range(3)]
    first = ckpt.load(run_dir / "checkpoints" / names[0])
    assert first["sampler"]["epoch"] == 1 and first["iteration"] == k
    recs = _metrics(run_dir)
    (err,) = [r for r in recs if r["type"] == "contained_error"]
    assert err["stage"] == "epoch_end.decide" and err["it"] == k
    assert err["error"].startswith("KeyError") and "injected" in err["error"] and "Traceback" in err["traceback"]
    # the hook's state after epoch 1's decide (its forecast) is not in epoch 1's checkpoint, written
    # before that decide, but it comes back on resume from the side file that follows the checkpoint
    st = res[0]["hook_state"]
    assert st["forecast"]["start"] == 2 * k and st["forecast"]["B"]
    assert ckpt.load(run_dir / "checkpoints" / names[1])["lifecycle"]["forecast"]["start"] == k   # epoch 0's
    for r in res:
        assert r["resumed"] and r["resumed_iteration"] == 2 * k
        assert r["final"] == {"epoch": 3, "iterations": 3 * k, "contained_errors": 1, "moved_to": None}
    assert res[0]["resumed_hook_state"] == st
    auto = [r for r in recs if r["type"] == "autoscale"]
    assert [a["epoch"] for a in auto] == [1, 2] and auto[0]["move"] is False
    assert auto[1]["reason"] == "last epoch" and auto[1]["forecast_error"] >= 0.0   # the resumed job scored it


def test_extension_points_are_typed():
    """Checked before Horovod starts: the wrong kind of object is one clear error."""
    from hpc_jabas.runtime.trainer import Trainer
    m = torch.nn.Linear(2, 2)
    args = (m, torch.optim.SGD(m.parameters(), lr=0.1), [], torch.nn.MSELoss())
    with pytest.raises(TypeError, match="hooks.Controller"):
        Trainer(*args, controller=object())
    with pytest.raises(TypeError, match="hooks.EpochEndHook"):
        Trainer(*args, epoch_end_hook=lambda tr, epoch: False)       # the old callable style
    with pytest.raises(TypeError, match="hooks.Callback"):
        Trainer(*args, callbacks=[print])
    with pytest.raises(ConfigError, match="scheduler_step='step' is invalid; use one of epoch, iteration"):
        Trainer(*args, scheduler_step="step")


def test_scheduler_steps_per_epoch_or_per_iteration_and_callbacks_fire(tmp_path):
    cfg = {"epochs": 2, "batch": 24, "planner": "fixed", "plan": "b=4 n=3,3"}
    (res0, res1) = run_ranks("protocol_worker.py", {"mode": "hooks", "run_dir": "", "n": 96, "config": cfg}, np_=2)
    k = 96 // 24
    for r in (res0, res1):
        ep, it = r["epoch"], r["iteration"]
        assert ep["iterations"] == it["iterations"] == 2 * k
        assert ep["last_epoch"] == 2 and ep["lr"] == pytest.approx(0.1 * 0.5 ** 2)
        assert it["last_epoch"] == 2 * k and it["lr"] == pytest.approx(0.1 * 0.5 ** (2 * k))
        for c in (ep, it):
            assert c["first"] == 1 and c["steps"] == list(range(2 * k)) and c["epochs"] == [0, 1]
