"""What a run costs besides its iterations (core/autoscale/overheads.py), measured by the auto-scaler's meter and priced
in its epoch-end decision (runtime/job/lifecycle.py)."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lifecycle_unit import View, spec, stub_trainer

from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.autoscale.overheads import KEEP_EPOCH_ENDS, KEEP_ITERATIONS, OverheadMeter, Overheads
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.hooks import EpochEndHook
from hpc_jabas.runtime.job.lifecycle import EpochEndAutoscaler
from hpc_jabas.runtime.record import StepRecord


def _rec(iter_s: float, measure: bool) -> StepRecord:
    """A rank's iteration record at B = 64 (what the auto-scaler's meter reads: B, iter_s, measure, samples)."""
    return StepRecord(it=0, epoch=0, rank=0, B=64, samples=64, plan="b=64 n=1", b=64, x=64, n_local=1,
                      compute_s=iter_s, real_compute_s=iter_s, emulation_wait_s=0.0, wait_s=0.0, iter_s=iter_s,
                      loss_sum=0.0, loss_weight=64.0, lr_scale=1.0, measure=measure, skipped=False, slowdown=1.0)


@settings(max_examples=60, deadline=None)
@given(factor=st.floats(1.0, 3.0), p=st.integers(2, 12), base=st.floats(0.005, 2.0), n=st.integers(60, 400),
       seed=st.integers(0, 10**6), ends=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=9))
def test_the_meter_recovers_an_injected_measurement_factor_and_epoch_end(factor, p, base, n, seed, ends):
    """Iterations at two Bs with +-2% noise and a few 5x stragglers; one in p measures, at `factor` x."""
    import random
    rng = random.Random(seed)
    m = OverheadMeter()
    for i in range(n):
        B, t = (64, base) if i < n // 3 else (128, 1.9 * base)
        measure = (i + 1) % p == 0
        s = t * (factor if measure else 1.0) * rng.uniform(0.98, 1.02)
        if rng.random() < 0.03 and not measure:
            s *= 5.0                                  # a straggling normal iteration
        m.observe_iteration(B, s, measure)
    for e in ends:
        m.observe_epoch_end(e)
    ov = m.estimate()
    assert ov.measure_factor == pytest.approx(factor, rel=0.06)
    if ov.measure_factor > 1.0:
        assert ov.measure_share == pytest.approx((n // p) / n)
    assert ov.epoch_end_s == pytest.approx(sorted(ends)[len(ends) // 2] if len(ends) % 2 else
                                           (sorted(ends)[len(ends) // 2 - 1] + sorted(ends)[len(ends) // 2]) / 2)


def test_an_epochs_shrunk_tail_is_not_a_normal_iteration():
    """A policy that measures nearly every iteration leaves only the epochs' shrunk tails unmeasured; read as normal
    iterations at B (they take a fraction of one), they priced a measurement at 10x (a replayed demo chain moved to
    another mix than the real one did). With their samples given, they are left out: nothing to compare with."""
    m, tails = OverheadMeter(), OverheadMeter()
    for k in range(60):
        m.observe_iteration(64, 0.16, True, 64)
        tails.observe_iteration(64, 0.16, True, 64)
        if k % 20 == 19:                                  # an epoch's last iteration: 6 of 64 samples, unmeasured
            m.observe_iteration(64, 0.016, False, 6)
            tails.observe_iteration(64, 0.016, False)     # without its samples: taken as a normal iteration
    assert m.estimate().measure_factor == 1.0 and m.estimate().measure_share == 0.0
    assert tails.estimate().measure_factor == pytest.approx(10.0)
    m.observe_iteration(64, 0.08, False, 64)             # a full unmeasured iteration still counts
    assert len(m.iterations) == 61


def test_nothing_measured_prices_nothing_and_memory_is_bounded():
    m = OverheadMeter()
    assert m.estimate() == Overheads()
    for _ in range(3 * KEEP_ITERATIONS):
        m.observe_iteration(32, 0.01, False)           # never a measurement iteration: no factor, no share
        m.observe_epoch_end(1.0)
    m.observe_iteration(32, math.nan, True)           # a broken timing is not taken
    m.observe_epoch_end(-1.0)
    assert len(m.iterations) == KEEP_ITERATIONS and len(m.epoch_ends) == KEEP_EPOCH_ENDS
    assert m.estimate() == Overheads(epoch_end_s=1.0)
    again = OverheadMeter()
    again.load_state_dict(m.state_dict())
    assert again.estimate() == m.estimate() and list(again.iterations) == list(m.iterations)


@pytest.mark.parametrize("kw, needle", [({"measure_share": 1.5}, "measure_share=1.5"),
                                        ({"measure_factor": 0.5}, "measure_factor=0.5"),
                                        ({"epoch_end_s": -2.0}, "epoch_end_s=-2.0"),
                                        ({"epoch_end_s": math.nan}, "epoch_end_s=nan")])
def test_bad_overheads_are_one_clear_line(kw, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")) as e:
        Overheads(**kw)
    assert "\n" not in str(e.value)


def test_the_epoch_price_carries_the_overheads_and_changes_a_cost_decision():
    """A long epoch end costs GPU-hours whatever the GPU: under `cost` a move to a faster, pricier GPU that
    pays off on the iterations alone no longer does."""
    types = {"a100": "a100", "rtx2060": "rtx2060"}
    model = PerfModel.emulated(sorted(types.values()), [8, 16, 32, 64, 128], 0.002, 0.0002)
    plain = autoscale.epoch_time_fn(model, types, [64.0], 5, 2000)
    priced = autoscale.epoch_time_fn(model, types, [64.0], 5, 2000,
                                     overheads=Overheads(measure_share=0.2, measure_factor=2.0, epoch_end_s=7.0))
    for mix in ({"a100": 1}, {"a100": 1, "rtx2060": 2}):
        assert priced(mix) == pytest.approx(plain(mix) * 1.2 + 7.0)
    rates = {"a100": 4.0, "rtx2060": 2.0}
    cur, cand = {"rtx2060": 1}, {"a100": 1}
    assert autoscale.choose(cur, [cur, cand], plain, rates, "cost", 0.0, remaining_epochs=5).mix == cand
    assert autoscale.choose(cur, [cur, cand], priced, rates, "cost", 0.0, remaining_epochs=5).mix == cur


def test_the_auto_scaler_meters_steps_prices_them_and_keeps_them_across_a_resume():
    a = EpochEndAutoscaler(spec("cost", restart_prior_s=1.0), read_cluster=lambda pt: View())
    tr = stub_trainer()
    for i in range(40):
        a.on_step_end(tr, _rec(iter_s=0.02 * (3.0 if i % 5 == 4 else 1.0), measure=i % 5 == 4))
    tr.rank = 1
    a.on_step_end(tr, _rec(iter_s=99.0, measure=False))     # only rank 0 meters
    tr.rank = 0
    a.decide(tr, epoch=0)
    ov = tr.metrics.recs[-1]["overheads"]
    assert ov["measure_factor"] == pytest.approx(3.0) and ov["measure_share"] == pytest.approx(0.2)
    assert 0.0 <= ov["epoch_end_s"] < 60.0                     # the time since the last step, measured
    b = EpochEndAutoscaler(spec("cost", restart_prior_s=1.0), read_cluster=lambda pt: View())
    b.load_state_dict(a.state_dict())
    assert b.meter.estimate() == a.meter.estimate()


@settings(max_examples=200, deadline=None)
@given(done=st.integers(0, 400), span=st.integers(0, 300), p=st.integers(1, 40), k=st.sampled_from([None, 1, 2, 5]))
def test_reference_iterations_against_a_brute_force_count(done, span, p, k):
    """A reference iteration: every iteration measures (measure_every = 1 or p = 1), done = 9 mod 16, never a
    decision's unless p = 1; the count, the measuring count, the schedule the controller and the simulator read,
    and the long-run share of core/sim/simulate.py agree with an iteration-by-iteration reading."""
    from hpc_jabas.core.autoscale.overheads import is_reference, measures, references
    from hpc_jabas.core.sim import simulate
    end = done + span
    refs = [x for x in range(done + 1, end + 1) if (k == 1 or p == 1) and x % 16 == 9 and (x % p or p == 1)]
    assert references(done, end, p, k) == len(refs)
    assert all(is_reference(x, p, k) == (x in refs) for x in range(done + 1, end + 1))
    measuring = [x for x in range(done + 1, end + 1)
                 if (x % p == 0 or (k is not None and x % k == 0)) and x not in refs]
    assert simulate.measurements(done, end, p, k, reference=True) == len(measuring)
    assert [x for x in range(done + 1, end + 1) if measures(x, p, k, True)] == measuring
    assert [x for x in range(done + 1, end + 1) if measures(x, p, k, False)] == \
        [x for x in range(done + 1, end + 1) if x % p == 0 or (k is not None and x % k == 0)]
    if p == 1 and span >= 16:
        assert refs                                     # a decision every iteration still leaves references
    period = 16 * p * (k or 1)
    whole = [x for x in range(1, period + 1) if (x % p == 0 or (k is not None and x % k == 0))
             and not ((k == 1 or p == 1) and x % 16 == 9 and (x % p or p == 1))]
    assert simulate.measure_share(p, k, reference=True) == pytest.approx(len(whole) / period)


class _Pricing(EpochEndHook):
    """An epoch-end hook that prices measuring (as the auto-scaler does) and always stays."""
    prices_measuring = True

    def decide(self, trainer, epoch):
        from hpc_jabas.core.adaptive.decision import MoveDecision
        return MoveDecision.stay("test")


@pytest.mark.parametrize("pricing,p,policy", [(True, 5, "noise-scale"), (False, 5, "noise-scale"),
                                              (True, 1, "noise-scale"), (True, 1, "similarity")])
def test_a_trainer_that_measures_every_iteration_leaves_references_only_where_measuring_is_priced(tmp_path, pricing,
                                                                                                  p, policy):
    """goodput with p = 5 measures at every iteration (measure_every = 1). With a hook that prices measuring, the
    iterations completing 9, 25, 41, ... (not a decision's) do not measure, and the meter gets normal iterations to
    compare with; without one, every full iteration measures, as before. At p = 1 (a decision every iteration,
    goodput or similarity) the same iterations are decisions made without a fresh measurement."""
    import json

    import torch
    from reference import make_data, make_model

    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer
    model = make_model()
    cfg = JobConfig(policy=policy, batch=16, batch_min=16, batch_max=64, epochs=3, checkpoint=False, p=p,
                    run_dir=str(tmp_path / "run"))
    hook = _Pricing() if pricing else None
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), make_data(320), torch.nn.CrossEntropyLoss(),
                 config=cfg, world=World(rank=0, size=1, gpu_types=("rtx2060",)), epoch_end_hook=hook)
    tr.fit()
    assert tr.controller.measure_every == (1 if policy == "noise-scale" else None)
    assert tr.controller.reference == pricing
    recs = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    its = [r for r in recs if r["type"] == "iteration" and r["samples"] == r["B"]]
    assert len(its) >= 40
    unmeasured = [r["it"] + 1 for r in its if not r["measure"]]
    expect = [r["it"] + 1 for r in its if (r["it"] + 1) % 16 == 9 and ((r["it"] + 1) % p or p == 1)] if pricing else []
    assert unmeasured == expect and (len(expect) >= 2 or not pricing)
    if p == 1:                                   # every iteration decided, the references without a fresh measurement
        decisions = [r for r in recs if r["type"] == "decision"]
        assert len(decisions) >= len(its)
        if policy == "noise-scale":              # at_iteration: the iterations done when it was made
            assert [d["at_iteration"] for d in decisions if not d["stats"]["fresh"]] == expect
