"""The simulator (core/sim/simulate.py, core/sim/simconfig.py, `hpc-jabas simulate`): the closed form, determinism,
bad input, the gradient-statistic curves and the queue model, and that it decides with the core's own
perf model, planner, policies, forecaster and auto-scaler (it defines none of its own)."""
from __future__ import annotations

import ast
import inspect
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from hpc_jabas.cli.main import main
from hpc_jabas.core import planning
from hpc_jabas.core.adaptive import policy, stats
from hpc_jabas.core.autoscale import forecast, mixbound, mixsearch
from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.perf import perfmodel
from hpc_jabas.core.planning import grouptimes, proportional_plan
from hpc_jabas.core.sim import simulate
from hpc_jabas.core.sim.simconfig import (
    NoiseCurve,
    QueueModel,
    cluster_from_dict,
    job_from_dict,
    noise_curve,
    read_noise_trace,
    read_stats_trace,
)
from hpc_jabas.core.sim.simulate import COMPARED, STRATEGIES, Simulation
from hpc_jabas.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def cluster(parts=(("v100", "v100", 1), ("p100", "p100", 1)), wait=None, restart_s=30.0, seed=0):
    return cluster_from_dict({"name": "t", "restart_s": restart_s, "queue": {"seed": seed, "period_s": 600.0},
                              "partition": [{"name": n, "gpu": g, "nodes": k, "gpus_per_node": 4,
                                             **({"wait": wait[n]} if wait and n in wait else {})}
                                            for n, g, k in parts]})


def job(**kw):
    d = {"samples": 20_000, "epochs": 3, "batch": 128, "batch_min": 64, "batch_max": 2048, "micro_batch": 16,
         "p": 10, "stop": "progress", "seed": 0,
         "gradstats": {"curve": "mccandlish", "b_start": 128, "b_end": 2048, "tau": 0.3},
         "autoscale": {"max_partitions": 2, "exact_upto": 2, "restart_prior_s": 30}}
    d.update(kw)
    return job_from_dict(d)


# ---------------------------------------------------------------- the closed form

@settings(max_examples=15, deadline=None)
@given(k=hs.integers(1, 16), samples=hs.integers(500, 30_000), epochs=hs.integers(1, 4),
       strategy=hs.sampled_from(["static", "lbbsp"]))
def test_one_type_fixed_b_matches_the_perf_model_closed_form(k, samples, epochs, strategy):
    B = 64 * k                                    # 4 ranks x micro-batches of 16
    sim = Simulation(cluster((("v100", "v100", 1),)),
                     job(samples=samples, epochs=epochs, batch=B, batch_min=B, batch_max=B, stop="samples"))
    res = sim.run(strategy)
    gl = ["v100"] * 4
    plan = proportional_plan(B, 16, [1.0] * 4)
    T = sim.model.iteration_time(plan, gl)
    prof = sim.model.profile("v100")
    closed = (B // 64) * prof.time(16) + prof.update_s + sim.model.allreduce_tail(4)   # n t(b) + u + tail
    assert T == pytest.approx(closed, rel=1e-12)
    assert res.totals["time_s"] == pytest.approx(epochs * math.ceil(samples / B) * closed, rel=1e-9, abs=1e-3)
    assert res.totals["restarts"] == 0 and res.totals["queue_wait_s"] == 0.0
    assert res.totals["samples"] == epochs * samples
    assert res.totals["cost"] == pytest.approx(res.totals["time_s"] / 3600 * 4 * sim.cluster.rates["v100"], rel=1e-3)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_fixed_b_of_the_grid_runs_at_its_b_and_pays_its_statistical_efficiency(k):
    """Simulation.run(fixed_B=): the fixed-B strategy runs at that B, and with stop = "progress" the progress is
    still counted at the job's batch B0, so it needs samples / E(B) with Pollux's E(B) = (phi + B0)/(phi + B)
    (the noise scale phi held constant here: b_start = b_end)."""
    B0, phi, samples, epochs = 128, 1000.0, 20_000, 3
    sim = Simulation(cluster((("v100", "v100", 1),)),
                     job(samples=samples, epochs=epochs, batch=B0, batch_min=64, batch_max=2048,
                         gradstats={"curve": "mccandlish", "b_start": phi, "b_end": phi, "tau": 0.3}))
    res = sim.run("lbbsp", fixed_B=B0 * k)
    assert {B for _, B in res.trajectory} == {B0 * k}
    eff = (phi + B0) / (phi + B0 * k)
    need = epochs * samples / eff                                  # samples to the same progress
    assert res.totals["samples"] == pytest.approx(need, abs=B0 * k)
    for bad in (0, 2.5, True):
        with pytest.raises(ConfigError, match="fixed_B"):
            sim.run("lbbsp", fixed_B=bad)
    with pytest.raises(ConfigError, match="fixed_B"):
        sim.run("simigrad", fixed_B=256)


def test_one_curve_section_reads_each_curve_and_refuses_another_curves_keys():
    """[gradstats] is one section: a curve gets its own keys (defaults filled), a key of another curve, a typo
    or a bad value is one line naming it and what is valid."""
    assert noise_curve({"curve": "merrill", "b_min": 32}, "[gradstats]").params == \
        {"b_min": 32.0, "b_plateau": 4096.0, "u_rise": 0.15}
    c = noise_curve(None, "[gradstats]")
    assert (c.kind, c.params, c.noise) == ("mccandlish", {"b_start": 256.0, "b_end": 8192.0, "tau": 0.3}, 0.2)
    with pytest.raises(ConfigError) as e:
        noise_curve({"curve": "merrill", "b_start": 1, "tau": 2}, "[gradstats]")
    assert str(e.value) == ("[gradstats]: b_start, tau is no key of curve 'merrill'; its keys: curve, noise, "
                            "b_min, b_plateau, u_rise")
    with pytest.raises(ConfigError, match=r"^\[gradstats\]: unknown key\(s\) b_strat \(did you mean 'b_start'\?\)"):
        noise_curve({"b_strat": 1}, "[gradstats]")
    with pytest.raises(ConfigError, match=r"^\[gradstats\]: u_rise") as e:
        noise_curve({"curve": "merrill", "u_rise": 0}, "[gradstats]")
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- determinism, the comparison

def test_strategies_are_deterministic_under_a_seed():
    wait = {"v100": {"dist": "lognormal", "median_s": 300, "sigma": 1.0},
            "p100": {"dist": "exponential", "mean_s": 60}}
    a = Simulation(cluster(wait=wait), job()).compare(list(STRATEGIES))
    b = Simulation(cluster(wait=wait), job()).compare(list(STRATEGIES))
    assert set(a) == set(STRATEGIES)
    default = Simulation(cluster(wait=wait), job()).compare()
    assert list(default) == list(COMPARED) and "goodput" not in default    # eight rows, as the README says
    for n in COMPARED:
        assert default[n].totals == a[n].totals, n                       # the same streams as run alone
    for n in STRATEGIES:
        assert a[n].totals == b[n].totals, n
        assert a[n].trajectory == b[n].trajectory, n
    assert a["simigrad"].totals["time_s"] > 0
    c = Simulation(cluster(wait=wait), job(seed=7)).run("simigrad")
    assert c.trajectory != a["simigrad"].trajectory          # the seed is the measurement noise's
    rel = simulate.relative(a)
    assert rel["simigrad"]["time_s"] == 1.0
    assert "x1.00" in simulate.comparison_table(a)
    for n in ("static", "lbbsp", "simigrad", "ramp"):          # static allocations never move
        assert a[n].totals["restarts"] == 0


def _decided(res):
    """Everything a run decided and recorded, less the decisions' wall-clock timings."""
    out = {}
    for n, r in res.items():
        d = r.to_dict()
        d["totals"].pop("decision_ms_max")
        for x in d["decisions"]:
            x.pop("decision_ms")
        out[n] = d
    return out


def test_the_decision_caches_change_no_decision(monkeypatch):
    """Reused spaces, bounds, epoch times and forecaster fits: the same per-epoch records, B trajectories and
    decisions (reasons included) as a run that recomputes every one of them."""
    wait = {"v100": {"dist": "lognormal", "median_s": 300, "sigma": 1.0}}
    parts = (("v100", "v100", 2), ("p100", "p100", 2), ("a100", "a100", 1))
    j = dict(epochs=4, autoscale={"max_partitions": 3, "exact_upto": 2, "restart_prior_s": 30, "max_evals": 40})
    clock = iter(range(10**6)).__next__
    on = Simulation(cluster(parts, wait=wait), job(**j), clock=clock).compare()
    forecast._fits.clear()
    monkeypatch.setattr(forecast, "FIT_CACHE_SIZE", 0)
    off_sim = Simulation(cluster(parts, wait=wait), job(**j), clock=clock, cache=False)
    off = off_sim.compare()
    assert not off_sim._epoch_times and not off_sim._bounds and not off_sim._price_spaces and not forecast._fits
    assert _decided(on) == _decided(off)
    assert sum(len(r.decisions) for r in on.values()) > 10
    assert any(e["restart"] for r in on.values() for e in r.epochs)          # moves were decided, too


def test_the_budget_row_spends_at_most_about_the_simigrad_cost():
    res = Simulation(cluster(), job()).compare(["hpcjabas-budget"])
    assert set(res) == {"hpcjabas-budget", "simigrad"}       # the baseline ran: it sets the budget
    assert res["hpcjabas-budget"].totals["cost"] <= res["simigrad"].totals["cost"] * 1.10


def test_queue_aware_never_moves_onto_a_wait_above_the_limit():
    wait = {"p100": {"dist": "fixed", "mean_s": 50_000}}
    j = job(mix={"p100": 4}, autoscale={"max_partitions": 2, "exact_upto": 2, "max_queue_wait_s": 1000})
    res = Simulation(cluster(wait=wait), j).run("hpcjabas-queue")
    assert res.totals["queue_wait_s"] == 50_000.0             # only the first job's own wait
    assert all("p100" not in e.get("moved_to", "") for e in res.epochs)


def test_queue_waits_are_common_to_every_strategy_and_seeded():
    c = cluster(wait={"v100": {"dist": "lognormal", "median_s": 300, "sigma": 1.0}})
    q: QueueModel = c.queue
    assert q.wait({"v100": 4}, 1234.0) == q.wait({"v100": 4, "p100": 1}, 1234.0) > 0
    assert q.wait({"v100": 4}, 100.0) == q.wait({"v100": 4}, 500.0)          # same 600 s period
    assert q.wait({"p100": 4}, 100.0) == 0.0
    other = cluster(wait={"v100": {"dist": "lognormal", "median_s": 300, "sigma": 1.0}}, seed=1).queue
    assert other.wait({"v100": 4}, 100.0) != q.wait({"v100": 4}, 100.0)


# ---------------------------------------------------------------- gradient statistics

@settings(max_examples=30, deadline=None)
@given(a=hs.floats(0, 1), b=hs.floats(0, 1), start=hs.floats(16, 1e3), grow=hs.floats(1.5, 100))
def test_the_curves_rise_monotonically_between_their_ends(a, b, start, grow):
    u, v = sorted((a, b))
    mc = NoiseCurve("mccandlish", {"b_start": start, "b_end": start * grow, "tau": 0.3})
    me = NoiseCurve("merrill", {"b_min": start, "b_plateau": start * grow, "u_rise": 0.1})
    for c in (mc, me):
        assert c.at(u) <= c.at(v) * (1 + 1e-12)
        assert start * (1 - 1e-9) <= c.at(u) <= start * grow * (1 + 1e-9)
    assert mc.at(0.0) == pytest.approx(start)
    assert me.at(1.0) == pytest.approx(start + (start * grow - start) * (1 - math.exp(-10)))


def test_a_recorded_run_gives_the_noise_trace(tmp_path):
    f = tmp_path / "metrics.jsonl"
    rows = [{"type": "decision", "at_iteration": 10, "B": 64, "stats": {"b_noise": 100.0}},
            {"type": "iteration", "it": 11},
            {"type": "decision", "at_iteration": 20, "B": 100, "stats": {"b_noise": None, "similarity": 0.2}}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn")
    us, bs = read_noise_trace(f)
    assert us == (0.5, 1.0) and bs == (100.0, 100 * 0.8 / 0.4)
    j = job(gradstats={"curve": "trace", "path": str(f)})
    assert j.gradstats.at(0.75) == pytest.approx(150.0)


def test_a_trace_is_placed_by_samples_and_replays_the_fresh_estimates(tmp_path):
    # 4 iterations of 32 samples, then 4 of 128: the decision at iteration 4 comes after 128 of 640 samples
    # (0.2, where iteration / last would say 0.5); the fresh g2/s are replayed, the smoothed G2/S_trace not
    f = tmp_path / "metrics.jsonl"
    rows = [{"type": "iteration", "it": i, "samples": 32 if i < 4 else 128} for i in range(8)]
    rows.insert(4, {"type": "decision", "at_iteration": 4, "B": 128,
                    "stats": {"b_noise": 50.0, "G2": 9.0, "S_trace": 9.0, "g2": 2.0, "s": 100.0}})
    rows.append({"type": "decision", "at_iteration": 8, "B": 128,
                 "stats": {"b_noise": 80.0, "G2": 9.0, "S_trace": 9.0, "g2": None, "s": None, "similarity": 0.5}})
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    us, bs, measured = read_stats_trace(f)
    assert us == (0.2, 1.0) and bs == (50.0, 80.0)
    assert measured == ((2.0, 100.0, None, True), (None, None, 0.5, False))
    curve = job(gradstats={"curve": "trace", "path": str(f), "noise": 0.0}).gradstats
    assert curve.measured_at(0.5) == (2.0, 100.0, 0.5, True)     # each term over the records that have it
    assert curve.measured_at(0.7) == (None, None, 0.5, False)    # nearest the decision without a measurement
    assert curve.at(0.6) == pytest.approx(65.0)
    # the policy gets them: a goodput run on this trace decides on g2 = 2, s = 100 (B_noise 50), not on G2/S (1)
    sim = Simulation(cluster(), job(gradstats={"curve": "trace", "path": str(f), "noise": 0.0}, stop="samples",
                                    epochs=1, batch=64, batch_min=64, batch_max=2048))
    seen = []
    real = sim._decide.__func__

    def spy(self, policy, B, it, u, space, rng, res, fresh=True):
        orig = policy.decide

        def decide(state, sp):
            seen.append((state.g2, state.s, state.similarity))
            return orig(state, sp)
        policy.decide = decide
        try:
            return real(self, policy, B, it, u, space, rng, res, fresh=fresh)
        finally:
            policy.decide = orig
    sim._decide = spy.__get__(sim)
    sim.run("goodput")
    assert seen and all((g, s, m) == (None, None, 0.5) or (g == pytest.approx(2.0) and s == pytest.approx(100.0)
                                                          and m == 0.5) for g, s, m in seen)
    assert {g is None for g, _, _ in seen} == {True, False}            # both kinds of decision were replayed


def test_at_p_1_under_auto_scaling_the_reference_decisions_are_made_without_a_fresh_measurement():
    """p = 1: every iteration decides and measures, so an auto-scaling run (measuring priced) has no normal
    iteration unless some decision leaves its measurement out; the simulator replays the trainer's rule
    (core/autoscale/overheads.py): the decisions completing 9 mod 16 get no fresh statistics, every other one does, and
    only the strategy that prices measuring leaves any out."""
    def decisions(strategy):
        sim = Simulation(cluster(), job(stop="samples", epochs=1, samples=30_000, batch=64, batch_min=64, p=1))
        seen = []
        real = sim._decide.__func__

        def spy(self, policy, B, it, u, space, rng, res, fresh=True):
            seen.append((it, fresh))
            return real(self, policy, B, it, u, space, rng, res, fresh=fresh)
        sim._decide = spy.__get__(sim)
        sim.run(strategy)
        return seen
    seen = decisions("hpcjabas-cost")
    assert len(seen) >= 40 and [it for it, _ in seen] == list(range(1, len(seen) + 1))
    assert [it for it, fresh in seen if not fresh] == [it for it, _ in seen if it % 16 == 9]
    assert all(fresh for _, fresh in decisions("goodput"))


def test_measured_overheads_price_only_what_runs():
    """[model] measure_factor and epoch_end_s: the defaults price nothing; an epoch end adds its seconds once per
    epoch; a measurement factor slows only a policy that measures, and by less than the factor itself."""
    def run(strategy, **model):
        j = job(stop="samples", epochs=3, model={"measure_factor": 1.0, "epoch_end_s": 0.0, **model})
        return Simulation(cluster(), j).run(strategy)
    base = {n: Simulation(cluster(), job(stop="samples", epochs=3)).run(n).totals for n in ("lbbsp", "goodput")}
    assert run("lbbsp").totals == base["lbbsp"] and run("goodput").totals == base["goodput"]
    ends = run("lbbsp", epoch_end_s=2.5)
    assert ends.totals["time_s"] == pytest.approx(base["lbbsp"]["time_s"] + 3 * 2.5)
    assert ends.totals["iterations"] == base["lbbsp"]["iterations"]
    assert run("lbbsp", measure_factor=3.0).totals == base["lbbsp"]            # a fixed B measures nothing
    slow = run("goodput", measure_factor=3.0).totals
    assert slow["iterations"] == base["goodput"]["iterations"]                # the same decisions
    # goodput measures every iteration here (p = 10: measure_every = p / 10 = 1), so every iteration is 3x
    assert slow["time_s"] == pytest.approx(3.0 * base["goodput"]["time_s"], abs=4e-6)      # totals kept to 1 us

    def run_k(k, **model):
        j = job(stop="samples", epochs=3, model={"measure_factor": 1.0, "epoch_end_s": 0.0, **model},
                policy={"measure_every": k})
        return Simulation(cluster(), j).run("goodput").totals
    base4, slow4 = run_k(4), run_k(4, measure_factor=3.0)                   # every 4th and every 10th: 6 of 20
    assert slow4["iterations"] == base4["iterations"]
    assert base4["time_s"] < slow4["time_s"] < 3.0 * base4["time_s"]
    assert simulate.measurements(0, 20, 10, 4) == 6 and simulate.measure_share(10, 4) == pytest.approx(6 / 20)
    with pytest.raises(simulate.ConfigError, match="measure_factor"):
        job(model={"measure_factor": 0.5})


# ---------------------------------------------------------------- bad input, the CLI

@pytest.mark.parametrize("args, text", [
    (["simulate", "nope.toml", "examples/sim/job_resnet50.toml"], "does not exist"),
    (["simulate", "examples/sim/cluster_a.toml", "examples/sim/job_resnet50.toml", "--epochs", "0"], ">= 1"),
    (["simulate", "examples/sim/cluster_a.toml", "examples/sim/job_resnet50.toml", "--strategy", "x"],
     "unknown strategy"),
    (["simulate", "examples/sim/cluster_a.toml", "examples/sim/job_resnet50.toml", "--compare",
      "--strategies", "static,bogus"], "unknown strategy"),
    (["simulate", "examples/sim/cluster_a.toml"], "required"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, text, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(args) == 2 if args[-1] != "examples/sim/cluster_a.toml" else _exits_2(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and text in err[0] and err[0].startswith("hpc-jabas: error:")


def _exits_2(args):
    with pytest.raises(SystemExit) as e:
        main(args)
    return e.value.code == 2


@pytest.mark.parametrize("d, text", [
    ({"partition": [{"name": "a", "gpu": "v100", "nodez": 1}]}, "unknown key(s) nodez"),
    ({"partition": [{"name": "a", "gpu": "nosuchgpu"}]}, "unknown GPU type"),
    ({"partition": []}, "no [[partition]]"),
    ({"partition": [{"name": "a", "gpu": "v100", "wait": {"dist": "lognormal"}}]}, "needs median_s"),
])
def test_bad_cluster_files_name_the_key(d, text):
    with pytest.raises(simulate.ConfigError, match=None) as e:
        cluster_from_dict(d)
    assert text in str(e.value) and "\n" not in str(e.value)


def test_cli_writes_a_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc = main(["simulate", "examples/sim/cluster_a.toml", "examples/sim/job_resnet50.toml", "--epochs", "1",
               "--strategy", "lbbsp", "--out", str(tmp_path / "sim")])
    assert rc == 0
    doc = json.loads((tmp_path / "sim" / "simulation.json").read_text())
    ep = doc["results"]["lbbsp"]["epochs"]
    assert len(ep) == 1 and ep[0]["samples"] == 1_281_167 and ep[0]["time_s"] > 0
    assert "epoch" in capsys.readouterr().out


def test_report_renders_a_simulation_directory(tmp_path, capsys):
    """`hpc-jabas report SIM_DIR` draws a simulation like a run: non-empty PNGs of B and lr over time, the
    allocation, the cost per epoch and the per-type throughput, and a Markdown summary."""

    from PIL import Image
    parts = (("v100", "v100", 1), ("p100", "p100", 1), ("a100", "a100", 1))
    c = cluster(parts, wait={"a100": {"dist": "fixed", "mean_s": 120}})
    res = Simulation(c, job(epochs=3, autoscale={"max_partitions": 3, "exact_upto": 2, "restart_prior_s": 30}))\
        .compare(["static", "simigrad", "jabas", "hpcjabas-cost"])
    sim = tmp_path / "sim"
    sim.mkdir()
    (sim / "simulation.json").write_text(json.dumps(
        {"cluster": "t", "job": "j", "epochs": 3, "seed": 0, "results": {n: r.to_dict() for n, r in res.items()}}))
    assert main(["report", str(sim), "--out", str(tmp_path / "rep")]) == 0
    assert "4 strategies" in capsys.readouterr().out
    for png in ("b_lr.png", "allocation.png", "cost.png", "throughput.png"):
        with Image.open(tmp_path / "rep" / png) as im:
            assert im.size[0] > 300 and im.size[1] > 200
            lo, hi = im.convert("L").getextrema()
            assert hi - lo > 100, png                      # something is drawn, not a blank canvas
        assert (tmp_path / "rep" / png).stat().st_size > 5000
    from hpc_jabas.cli.simreport import SUMMARY
    md = (tmp_path / "rep" / SUMMARY).read_text()
    assert "| jabas |" in md and "(x1.00)" in md and "![allocation per epoch](allocation.png)" in md
    ep = res["jabas"].epochs[0]                            # what the throughput plot reads
    assert sum(ep["by_type"].values()) == pytest.approx(ep["samples_per_s"], rel=1e-3)
    assert res["jabas"].timeline[0][2] == res["jabas"].trajectory[0][1]
    assert main(["report", str(tmp_path / "nothing")]) == 2


# ---------------------------------------------------------------- no own copy of the decision core

CORE = [perfmodel, policy, forecast, autoscale, mixsearch, mixbound, grouptimes, stats,
        *[m for _, m in inspect.getmembers(planning, inspect.ismodule)]]


def _defined(module) -> set[str]:
    tree = ast.parse(Path(module.__file__).read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}


def test_the_simulator_defines_no_own_perf_model_planner_policy_forecaster_or_autoscaler():
    from hpc_jabas.core.sim import simconfig
    core_names = set().union(*(_defined(m) for m in CORE)) - {"__init__", "__post_init__", "to_dict", "from_dict",
                                                              "state_dict", "load_state_dict", "rows", "fn", "run",
                                                              "cell", "key", "_int", "_check"}
    own = _defined(simulate) | _defined(simconfig)
    clash = sorted(own & core_names)
    assert clash == [], f"the simulator redefines {clash}"
    forbidden = ("Planner", "Policy", "Forecast", "PerfModel", "Autoscal", "Search", "Bound", "plan_", "forecast_",
                 "choose", "price", "snap")
    assert not [n for n in own if any(f.lower() in n.lower() for f in forbidden)], sorted(own)
    # what it decides with is the core's, by identity
    assert simulate.make_planner is planning.make_planner
    assert simulate.make_policy is policy.make_policy and simulate.PolicyState is policy.PolicyState
    assert simulate.forecast is forecast and simulate.mixsearch is mixsearch and simulate.autoscale is autoscale
    assert simulate.group_space is grouptimes.group_space and simulate.PerfModel is perfmodel.PerfModel
    assert simulate.statistical_efficiency is stats.statistical_efficiency
    assert simulate.snap_nearest is planning.snap_nearest


def test_the_simulator_calls_the_core_at_run_time(monkeypatch):
    calls = {"forecast": 0, "search": 0, "epoch_time_fn": 0, "decide": 0}

    def wrap(mod, name, key):
        real = getattr(mod, name)

        def w(*a, **k):
            calls[key] += 1
            return real(*a, **k)
        monkeypatch.setattr(mod, name, w)
    wrap(forecast, "forecast_next_epoch", "forecast")
    wrap(mixsearch, "search", "search")
    wrap(autoscale, "epoch_time_fn", "epoch_time_fn")
    wrap(policy.GoodputPolicy, "decide", "decide")
    res = Simulation(cluster(), job()).run("hpcjabas-cost")
    searched = [d for d in res.decisions if not d["reason"].startswith("inputs unchanged")]
    assert calls["forecast"] == len(res.decisions) >= 2
    assert calls["search"] == calls["epoch_time_fn"] == len(searched) >= 1
    assert calls["decide"] >= 10
