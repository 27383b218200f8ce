import json

import pytest

from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.autoscale.scaler import (
    Candidate,
    RestartOverhead,
    catalog_rates,
    choose,
    enumerate_mixes,
    mix_label,
    price,
)
from hpc_jabas.errors import ConfigError, InfeasibleError

TYPES = {"fast": "a100", "mid": "v100", "slow": "p100"}
SPEED = {"fast": 4.0, "mid": 2.0, "slow": 1.0}       # samples/s per GPU, arbitrary units
RATES = {"fast": 4.0, "mid": 3.0, "slow": 1.0}       # per GPU-hour
WORK = 36_000.0                                       # one epoch of work


def epoch_time(mix):
    return WORK / sum(n * SPEED[p] for p, n in mix.items())


def decide(current, cands, objective="time", overhead=0.0, **kw):
    return choose(current, cands, epoch_time, RATES, objective, overhead, **kw)


# ---------------------------------------------------------------- enumeration

def test_enumerate_all_within_limits():
    free = {"fast": 2, "slow": 1}
    mixes = enumerate_mixes(free, TYPES, max_gpus=3)
    assert mixes == [{"fast": 1}, {"slow": 1}, {"fast": 1, "slow": 1}, {"fast": 2}, {"fast": 2, "slow": 1}]
    assert enumerate_mixes(free, TYPES, max_gpus=2) == mixes[:4]
    assert enumerate_mixes(free, TYPES, max_gpus=3, min_gpus=2) == mixes[2:]
    assert enumerate_mixes(free, TYPES, max_gpus=3, max_partitions=1) == [{"fast": 1}, {"slow": 1}, {"fast": 2}]


def test_enumerate_allowed_by_partition_or_type_and_zero_free():
    free = {"fast": 1, "mid": 0, "slow": 2}
    assert enumerate_mixes(free, TYPES, 4, allowed=["slow"]) == [{"slow": 1}, {"slow": 2}]
    assert enumerate_mixes(free, TYPES, 4, allowed=["a100"]) == [{"fast": 1}]
    assert enumerate_mixes(free, TYPES, 4, allowed=["mid"]) == []
    assert all("mid" not in m for m in enumerate_mixes(free, TYPES, 4))
    assert enumerate_mixes({"fast": 0}, TYPES, 4) == []


def test_enumerate_count_matches_combinatorics():
    free = {"fast": 4, "mid": 4, "slow": 4}
    mixes = enumerate_mixes(free, TYPES, max_gpus=12)
    assert len(mixes) == 5 ** 3 - 1
    assert len({tuple(sorted(m.items())) for m in mixes}) == len(mixes)
    assert all(1 <= sum(m.values()) <= 6 for m in enumerate_mixes(free, TYPES, max_gpus=6))


@pytest.mark.parametrize("kwargs,needle", [
    (dict(free={"fast": 1}, types=TYPES, max_gpus=0), "max_gpus=0"),
    (dict(free={"fast": 1}, types=TYPES, max_gpus=2, min_gpus=3), "min_gpus=3"),
    (dict(free={"fast": -1}, types=TYPES, max_gpus=2), "partition 'fast'"),
    (dict(free={"gpu9": 1}, types=TYPES, max_gpus=2), "gpu9"),
    (dict(free={"fast": 1}, types=TYPES, max_gpus=2, allowed=["h100"]), "h100"),
    (dict(free={"fast": 1}, types=TYPES, max_gpus=2, max_partitions=0), "max_partitions=0"),
])
def test_enumerate_validation(kwargs, needle):
    with pytest.raises(ConfigError) as e:
        enumerate_mixes(**kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_no_mix_limit_on_a_legal_cluster():
    # the brute-force list has no cap any more (a legal cluster is never a ConfigError); at cluster scale
    # the decision is core/mixsearch.search (tests/test_mixsearch.py)
    assert not hasattr(autoscale, "MAX_MIXES")
    assert len(enumerate_mixes({"fast": 8, "slow": 8}, TYPES, 16)) == 9 * 9 - 1


# ---------------------------------------------------------------- pricing

def test_price_time_and_cost():
    est = price(Candidate({"fast": 2, "slow": 1}, TYPES), epoch_time, RATES)
    assert est.feasible and est.time_s == pytest.approx(WORK / 9)
    assert est.cost == pytest.approx((2 * 4.0 + 1 * 1.0) * (WORK / 9) / 3600)
    assert price({"slow": 0, "mid": 1}, epoch_time, RATES).time_s == pytest.approx(WORK / 2)
    with pytest.raises(ConfigError):
        price({"fast": 1}, epoch_time, {"slow": 1.0})
    with pytest.raises(ConfigError):
        price({"fast": 1}, lambda m: -5.0, RATES)
    with pytest.raises(ConfigError):
        Candidate({"fast": 0})


def test_catalog_rates_use_gpu_catalog():
    from hpc_jabas.core.config import gpus
    rates = catalog_rates({"mid": "v100", "slow": "p100"})
    assert rates == {"mid": gpus.get("v100").price_per_hour, "slow": gpus.get("p100").price_per_hour}


# ---------------------------------------------------------------- objectives

CANDS = [{"slow": 4}, {"mid": 2}, {"fast": 2}, {"fast": 1, "slow": 2}]
# epoch time / cost: slow:4 -> 9000 s, 10.0 ; mid:2 -> 9000 s, 15.0 ; fast:2 -> 4500 s, 10.0 ;
#                    fast:1+slow:2 -> 6000 s, 10.0


def test_objective_time_picks_fastest():
    ch = decide({"slow": 4}, CANDS, "time")
    assert ch.mix == {"fast": 2} and ch.move and "moving" in ch.reason


def test_objective_cost_picks_cheapest_tie_broken_by_time():
    ch = decide({"mid": 2}, CANDS, "cost")
    assert ch.mix == {"fast": 2}                     # 10.0 like slow:4 but faster
    ch = choose({"mid": 2}, CANDS, epoch_time, {**RATES, "fast": 8.0}, "cost", 0.0)
    assert ch.mix == {"slow": 4}                     # fast:2 costs 20 now; slow:4 10 beats fast1+slow2 15


def test_time_under_budget():
    rates = {"fast": 10.0, "mid": 3.0, "slow": 1.0}
    # over 2 epochs: slow:4 -> 20.0 ; mid:2 -> 30.0 ; fast:2 -> 50.0 ; fast:1+slow:2 -> 2*6000/3600*12 = 40.0
    def run(budget):
        return choose({"slow": 4}, CANDS, epoch_time, rates, "time-under-budget", 0.0,
                      budget=budget, remaining_epochs=2)
    assert run(100.0).mix == {"fast": 2}
    assert run(49.99).mix == {"fast": 1, "slow": 2}
    assert run(40.0).mix == {"fast": 1, "slow": 2}    # exactly on the budget is allowed
    assert run(39.99).mix == {"slow": 4}             # mid:2 fits too but is not faster
    ch = run(5.0)                                    # nothing fits: cheapest, and the reason says so
    assert ch.mix == {"slow": 4} and not ch.move and "budget" in ch.reason
    rows = {r["label"]: r for r in run(40.0).table}
    assert rows["fast:2"]["within_limit"] is False and rows["fast:1+slow:2"]["within_limit"] is True


def test_cost_under_deadline():
    # over 2 epochs: slow:4 18000 s / 20 ; mid:2 18000 s / 30 ; fast:2 9000 s / 20 ; fast1+slow2 12000 s / 20
    def run(deadline, current=None):
        current = current or {"mid": 2}
        return decide(current, CANDS, "cost-under-deadline", deadline_s=deadline, remaining_epochs=2)
    assert run(20000).mix == {"fast": 2}             # all cost 20 except mid; ties broken by time
    rates = {"fast": 5.0, "mid": 3.0, "slow": 1.0}   # fast:2 25 ; fast1+slow2 2*6000/3600*7 = 23.33 ; slow:4 20
    ch = choose({"mid": 2}, CANDS, epoch_time, rates, "cost-under-deadline", 0.0, deadline_s=12000, remaining_epochs=2)
    assert ch.mix == {"fast": 1, "slow": 2}          # exactly on the deadline
    ch = choose({"mid": 2}, CANDS, epoch_time, rates, "cost-under-deadline", 0.0, deadline_s=18000, remaining_epochs=2)
    assert ch.mix == {"slow": 4}
    ch = run(1000)                                   # nothing meets it: fastest, reason says so
    assert ch.mix == {"fast": 2} and "deadline" in ch.reason


def test_deadline_counts_restart_overhead():
    # 2 epochs + 600 s restart: fast:2 9600 s / 26.67 ; fast:1+slow:2 12600 s / 24.5 ; current mid:2 18000 s / 30
    rates = {"fast": 5.0, "mid": 3.0, "slow": 1.0}
    def run(deadline):
        return choose({"mid": 2}, [{"fast": 2}, {"fast": 1, "slow": 2}], epoch_time, rates,
                      "cost-under-deadline", 600.0, deadline_s=deadline, remaining_epochs=2)
    assert run(12600).mix == {"fast": 1, "slow": 2}
    ch = run(12599)
    assert ch.mix == {"fast": 2} and "no mix" not in ch.reason
    ch = run(9599)
    assert ch.mix == {"fast": 2} and "no mix meets the deadline" in ch.reason
    rows = {r["label"]: r for r in run(9600).table}
    assert rows["fast:2"]["total_time_s"] == pytest.approx(9600.0)
    assert rows["fast:2"]["total_cost"] == pytest.approx(2 * 4500 / 3600 * 10 + 600 / 3600 * 10)


def test_current_breaking_limit_moves_even_for_small_gain():
    # current mid:2 costs 15 > budget 12; slow:4 costs 10 and is no faster (9000 s both): still move
    ch = decide({"mid": 2}, [{"slow": 4}], "time-under-budget", budget=12.0, margin=0.5)
    assert ch.mix == {"slow": 4} and "breaks the budget" in ch.reason


# ---------------------------------------------------------------- hysteresis and overhead

def near(t_factor):
    """epoch_time_fn where mix 'fast:1' takes t_factor x the time of the current 'mid:1'."""
    return lambda mix: 1000.0 * (t_factor if "fast" in mix else 1.0)


def test_hysteresis_small_gain_stays_big_gain_moves():
    ch = choose({"mid": 1}, [{"fast": 1}], near(0.99), RATES, "time", 0.0, margin=0.05)
    assert ch.mix == {"mid": 1} and not ch.move and "below the margin" in ch.reason
    ch = choose({"mid": 1}, [{"fast": 1}], near(0.5), RATES, "time", 0.0, margin=0.05)
    assert ch.mix == {"fast": 1} and ch.move


def test_no_ping_pong():
    # after moving, the old mix is the candidate and is slower: stay
    ch = choose({"fast": 1}, [{"mid": 1}], near(0.97), RATES, "time", 0.0, margin=0.05)
    assert ch.mix == {"fast": 1}
    ch = choose({"mid": 1}, [{"fast": 1}], near(0.97), RATES, "time", 0.0, margin=0.05)
    assert ch.mix == {"mid": 1}


def test_restart_overhead_flips_decision():
    # 20% faster per epoch saves 200 s per epoch
    assert choose({"mid": 1}, [{"fast": 1}], near(0.8), RATES, "time", 100.0).mix == {"fast": 1}
    assert choose({"mid": 1}, [{"fast": 1}], near(0.8), RATES, "time", 300.0).mix == {"mid": 1}
    # ... unless enough epochs remain to pay it back
    assert choose({"mid": 1}, [{"fast": 1}], near(0.8), RATES, "time", 300.0, remaining_epochs=5).mix == {"fast": 1}
    # an overhead tracker works in place of a number
    ro = RestartOverhead(prior_s=100.0)
    assert choose({"mid": 1}, [{"fast": 1}], near(0.8), RATES, "time", ro).mix == {"fast": 1}
    ro.record(500.0)
    assert choose({"mid": 1}, [{"fast": 1}], near(0.8), RATES, "time", ro).mix == {"mid": 1}


def test_restart_overhead_costs_money_at_the_new_rate():
    ch = choose({"slow": 1}, [{"fast": 1}], lambda m: 3600.0 if "slow" in m else 900.0, RATES, "cost", 1800.0)
    row = next(r for r in ch.table if r["label"] == "fast:1")
    assert row["total_cost"] == pytest.approx(4.0 * 0.25 + 4.0 * 0.5)    # epoch + half an hour of fast:1
    assert row["total_time_s"] == pytest.approx(900.0 + 1800.0)
    assert ch.mix == {"slow": 1}                                         # 3.0 vs 1.0: stay


# ---------------------------------------------------------------- infeasible candidates

def test_infeasible_candidates_listed_never_chosen():
    def fn(mix):
        if "fast" in mix:
            return None
        if mix.get("slow", 0) > 2:
            raise InfeasibleError("B=4096 does not fit p100 memory")
        return epoch_time(mix)
    ch = choose({"mid": 1}, [{"fast": 4}, {"slow": 8}, {"mid": 2}], fn, RATES, "time", 0.0)
    assert ch.mix == {"mid": 2}
    rows = {r["label"]: r for r in ch.table}
    assert rows["fast:4"]["feasible"] is False and rows["fast:4"]["time_s"] is None
    assert rows["slow:8"]["feasible"] is False and "p100 memory" in rows["slow:8"]["note"]
    assert rows["mid:2"]["chosen"] and not rows["mid:1"]["chosen"]


def test_a_bug_in_pricing_is_not_an_infeasible_mix():
    # a ConfigError (or any other exception) from the time function is a bug, not "infeasible": it propagates
    def fn(mix):
        raise ConfigError("internal invariant broken")
    with pytest.raises(ConfigError):
        choose({"mid": 1}, [{"fast": 4}], fn, RATES, "time", 0.0)


def test_nothing_feasible_stays():
    ch = choose({"mid": 1}, [{"fast": 1}], lambda m: None, RATES, "time", 0.0)
    assert ch.mix == {"mid": 1} and not ch.move and "no feasible" in ch.reason


def test_current_infeasible_moves_without_margin():
    fn = lambda m: None if "mid" in m else 1000.0
    ch = choose({"mid": 1}, [{"fast": 1}], fn, RATES, "time", 10_000.0, margin=0.5)
    assert ch.mix == {"fast": 1} and "infeasible" in ch.reason


def test_table_is_json_ready_and_has_required_fields():
    ch = decide({"slow": 4}, CANDS, "time")
    text = json.dumps(ch.to_dict())
    assert "NaN" not in text and "Infinity" not in text
    assert len(ch.table) == 4                         # current is among the candidates: listed once
    for row in ch.table:
        assert {"mix", "time_s", "cost", "feasible", "note"} <= set(row)
    assert sum(r["chosen"] for r in ch.table) == 1 and sum(r["current"] for r in ch.table) == 1
    assert mix_label({"slow": 2, "fast": 1}) == "fast:1+slow:2"


# ---------------------------------------------------------------- validation and overhead tracker

@pytest.mark.parametrize("kwargs,needle", [
    (dict(objective="fastest"), "valid objectives: time, cost, time-under-budget, cost-under-deadline"),
    (dict(objective="time-under-budget"), "budget"),
    (dict(objective="cost-under-deadline"), "deadline_s"),
    (dict(objective="time", margin=1.0), "margin=1.0"),
    (dict(objective="time", remaining_epochs=0), "remaining_epochs=0"),
    (dict(objective="time", overhead=-1.0), "restart_overhead_s=-1.0"),
])
def test_choose_validation(kwargs, needle):
    with pytest.raises(ConfigError) as e:
        decide({"mid": 1}, [{"fast": 1}], **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_restart_overhead_tracker():
    ro = RestartOverhead(prior_s=90.0)
    assert ro.seconds == 90.0
    ro.record(30.0)
    assert ro.seconds == 30.0
    ro.record(50.0)
    assert ro.seconds == 40.0
    other = RestartOverhead()
    other.load_state_dict(ro.state_dict())
    assert other.seconds == 40.0 and other.prior_s == 90.0
    with pytest.raises(ConfigError):
        ro.record(-1.0)
    with pytest.raises(ConfigError):
        RestartOverhead(prior_s="slow")


# ---------------------------------------------------------------- pricing what the trainer would run

PTYPES = {"a100": "a100", "v100": "v100", "rtx2060": "rtx2060"}


def _model():
    from hpc_jabas.core.perf.perfmodel import PerfModel
    return PerfModel.emulated(sorted(set(PTYPES.values())), [1, 2, 4, 8, 16, 32, 64, 128, 256], 0.002, 0.0002)


def test_forecast_is_snapped_so_mixes_are_feasible_with_micro_batch_set():
    from hpc_jabas.core.planning import job_batch_space, plan_batch, snap_nearest
    model = _model()
    fc = [70.4, 77.4, 85.2, 93.7]                      # a forecast: no multiple of b = 8 among them
    free = {"a100": 1, "v100": 2, "rtx2060": 3}
    cands = enumerate_mixes(free, PTYPES, max_gpus=4)
    # what the old pricing did: plan the raw forecast -> no mix can realise it
    for m in cands:
        with pytest.raises(InfeasibleError):
            plan_batch(round(fc[1]), autoscale.expand_mix(m, PTYPES), model, b_candidates=[8])
    fn = autoscale.epoch_time_fn(model, PTYPES, fc, 5, 2000, [8], B_min=32, B_max=256)
    ch = choose({"v100": 2}, cands, fn, catalog_rates(PTYPES), "time", 0.0)
    priced = [r for r in ch.table if r["feasible"]]
    assert len(priced) >= len(cands) // 2 and all(r["time_s"] > 0 for r in priced)
    # one mix by hand: each period at the snapped B, plan of that B, until 2000 samples are used
    mix = {"a100": 1, "v100": 2}
    gl = autoscale.expand_mix(mix, PTYPES)

    class Cfg:
        planner, micro_batch, B_min, B_max, speeds = "optimal", 8, 32, 256, None
    space = job_batch_space(Cfg, gl, model)
    Bs = [snap_nearest(space, x) for x in fc]
    assert all(B % 8 == 0 and 32 <= B <= 256 for B in Bs) and Bs == sorted(Bs)
    assert all(abs(B - x) <= 0.025 * x + 4 for B, x in zip(Bs, fc))
    want, left, k = 0.0, 2000, 0
    while left > 0:
        B = Bs[min(k, 3)]
        its = min(5, -(-left // B))
        want += its * model.iteration_time(plan_batch(B, gl, model, b_candidates=[8]), gl)
        left -= its * B
        k += 1
    assert fn(mix) == pytest.approx(want)


def test_forecast_snapping_avoids_pricing_odd_B_at_tiny_micro_batches():
    from hpc_jabas.core.planning import plan_batch
    model = _model()
    gl = ["v100", "v100", "rtx2060"]
    raw = plan_batch(131, gl, model)                    # 131 is prime: only b = 1 realises it
    assert raw.b == 1
    fn = autoscale.epoch_time_fn(model, PTYPES, [131], 10, 1310, None, B_min=16, B_max=512)
    t_raw = 10 * model.iteration_time(raw, gl)
    assert fn({"v100": 2, "rtx2060": 1}) < 0.5 * t_raw


def test_no_realisable_batch_on_a_mix_is_infeasible_not_an_error():
    model = _model()
    # b = 64 on 5 GPUs needs B >= 320 > B_max
    fn = autoscale.epoch_time_fn(model, PTYPES, [128], 5, 1000, [64], B_min=64, B_max=256)
    est = price({"v100": 2, "rtx2060": 3}, fn, catalog_rates(PTYPES))
    assert not est.feasible and "no realisable global batch" in est.note
    assert price({"v100": 2}, fn, catalog_rates(PTYPES)).feasible

