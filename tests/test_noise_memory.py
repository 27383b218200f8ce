"""The goodput policy's noise-scale estimate as Pollux runs it, opt-in (issue 34): a memory fixed in training
samples (``noise_memory``), fed by noise-only measurements between decisions (``measure_every``)."""
from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from reference import make_data, make_model

from hpc_jabas.core.adaptive.stats import NoiseMemory, NoiseWindow
from hpc_jabas.errors import ConfigError


def hand_weighted(xs: list[float], ns: list[float], memory: float) -> float:
    """Reference: the weight of measurement i is the share of its own n_i samples, 1 - exp(-n_i / M), times
    exp(-(the samples trained after it) / M); the estimate is the weighted mean."""
    ws = [(1 - math.exp(-ns[i] / memory)) * math.exp(-sum(ns[i + 1:]) / memory) for i in range(len(xs))]
    return sum(w * x for w, x in zip(ws, xs)) / sum(ws)


@given(obs=st.lists(st.tuples(st.floats(-5, 5), st.floats(0, 500), st.integers(1, 4096)), min_size=1, max_size=30),
       memory=st.floats(10, 1e5))
def test_noise_memory_is_the_sample_weighted_average(obs, memory):
    est = NoiseMemory(memory)
    for g2, s, n in obs:
        est.add(g2, s, n)
    ns = [float(n) for _, _, n in obs]
    assert est.count == len(obs)
    assert est.G2 == pytest.approx(hand_weighted([g for g, _, _ in obs], ns, memory), rel=1e-9, abs=1e-9)
    assert est.S == pytest.approx(hand_weighted([s for _, s, _ in obs], ns, memory), rel=1e-9, abs=1e-9)


def test_memory_is_in_samples_not_in_measurements():
    """A step change of the noise scale after t0 samples: t samples later the estimate is the same whether it
    was measured every 64 or every 1024 samples, and equals the closed form; a 20-measurement window is not."""
    M, t0, t = 30_000.0, 40_960, 10_240
    got = []
    for every in (64, 1024):
        mem, win = NoiseMemory(M), NoiseWindow(20)
        for k in range((t0 + t) // every):
            s = 100.0 if k * every < t0 else 900.0
            mem.add(1.0, s, every)
            win.add(1.0, s)
        got.append((mem.b_noise, win.b_noise))
    D, W_old = math.exp(-t / M), 1 - math.exp(-t0 / M)
    closed = 900.0 + (100.0 - 900.0) * W_old * D / (W_old * D + 1 - D)
    assert got[0][0] == pytest.approx(closed, rel=1e-9) and got[1][0] == pytest.approx(closed, rel=1e-9)
    assert got[0][1] == 900.0 and got[1][1] == 500.0         # the window forgets by measurements


def test_bad_values_are_one_clear_line():
    from hpc_jabas.core.adaptive.policy import make_policy
    from hpc_jabas.core.config.sections import JobConfig
    for kw, words in [({"measure_every": 0}, "measure_every=0"), ({"measure_every": 2.5}, "measure_every=2.5"),
                      ({"noise_memory": -1}, "noise_memory=-1"), ({"noise_memory": "x"}, "noise_memory='x'")]:
        with pytest.raises(ConfigError) as e:
            JobConfig.from_dict(kw)
        assert words in str(e.value) and "\n" not in str(e.value)
    for bad in (0, -3.0, math.inf, math.nan, True):
        with pytest.raises(ConfigError, match="noise_memory=.* training samples > 0"):
            make_policy("noise-scale", B0=32, B_min=8, B_max=256, noise_memory=bad)
    with pytest.raises(ConfigError, match="samples=0"):
        NoiseMemory(100).add(1.0, 1.0, 0)


def test_policy_observe_and_checkpoint_round_trip():
    from hpc_jabas.core.adaptive.policy import PolicyState, make_policy
    from hpc_jabas.core.planning import BatchSpace
    space = BatchSpace(16, 512, lambda lo, hi: [(B, 0.01 + B * 1e-4) for B in range(lo, hi + 1) if B % 16 == 0])
    a = make_policy("noise-scale", B0=32, B_min=16, B_max=512, noise_memory=5000.0)
    xs = [(0.9, 80.0, 128), (1.1, 120.0, 128), (math.nan, 5.0, 128), (1.0, 95.0, 256)]
    taken = [a.observe(g, s, n) for g, s, n in xs]
    assert taken == [True, True, False, True] and a.seen == 3 and a.noise.count == 3
    ref = hand_weighted([80.0, 120.0, 95.0], [128.0, 128.0, 256.0], 5000.0) / \
        hand_weighted([0.9, 1.1, 1.0], [128.0, 128.0, 256.0], 5000.0)
    assert a.noise.b_noise == pytest.approx(ref, rel=1e-12)
    b = make_policy("noise-scale", B0=32, B_min=16, B_max=512, noise_memory=5000.0)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert (b.seen, b.noise.count, b.noise.b_noise) == (a.seen, a.noise.count, a.noise.b_noise)
    state = PolicyState(B=32, iteration=40, g2=1.2, s=70.0, samples=512)
    da, db = a.decide(state, space), b.decide(state, space)
    assert (da.B, da.reason) == (db.B, db.reason) and a.noise.b_noise == b.noise.b_noise
    # a checkpoint of the default (20-measurement window) estimate into a policy with a memory: it restarts
    c = make_policy("noise-scale", B0=32, B_min=16, B_max=512)
    c.observe(1.0, 50.0)
    b.load_state_dict(c.state_dict())
    assert isinstance(b.noise, NoiseMemory) and b.noise.count == 0 and b.seen == 0


def test_noise_only_measurement_has_no_half_batch_buffer():
    from hpc_jabas.runtime.gradstats import Measurement
    params = list(make_model().parameters())
    full, noise = Measurement(params, [0, 1]), Measurement(params, [0, 1], similarity=False)
    assert sum(t.numel() for t in full.flat.values()) == sum(p.numel() for p in params)
    assert noise.flat == {} and noise.h0 == []
    full.remove_hooks()
    noise.remove_hooks()


def _run(tmp_path, name, **kw):
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer
    n, B = kw.pop("n", 64), 16
    model = make_model()
    kw.setdefault("lr_rule", "none")
    kw.setdefault("p", 4)
    kw.setdefault("policy", "noise-scale")
    cfg = JobConfig(batch=B, batch_min=8, batch_max=64, checkpoint=False, run_dir=str(tmp_path / name), **kw)
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), make_data(n), torch.nn.CrossEntropyLoss(),
                 config=cfg, world=World(rank=0, size=1, gpu_types=("rtx2060",)))
    tr.fit()
    recs = [json.loads(ln) for ln in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return tr, [r for r in recs if r["type"] == "iteration"], [r for r in recs if r["type"] == "decision"]


def test_noise_only_measurement_equals_the_full_one(tmp_path):
    """Iteration 3 (before any decision takes effect) measured with the half-batch sum (the similarity policy's
    measurement) and without (goodput's): the same micro-batch norms and |g|^2 (the one micro-batch split in two in
    both), no similarity in the noise-only one."""
    _, full, _ = _run(tmp_path, "full", epochs=1, policy="similarity")
    _, cheap, _ = _run(tmp_path, "cheap", epochs=1, measure_every=1)
    assert [r["it"] for r in full if "stats" in r] == [3] and [r["it"] for r in cheap if "stats" in r] == [0, 1, 2, 3]
    a, b = full[3]["stats"], cheap[3]["stats"]
    assert math.isfinite(a["similarity"]) and b["similarity"] is None
    assert b["M"] == a["M"] == 2 and cheap[3]["n_local"] == [2] and b["half_samples"] == a["half_samples"]
    for k in ("sq_micro", "sq_global"):
        assert b[k] == pytest.approx(a[k], rel=1e-12)


def test_measure_every_feeds_the_policy_between_decisions(tmp_path):
    """Goodput with measure_every=1 and a memory of 2,000 samples on one GPU: each decision's estimate is the
    sample-weighted average of every iteration's measurement so far (the hand reference), decisions see more
    measurements than decisions, and the first decision already moves past the warm-up."""
    from hpc_jabas.core.adaptive.stats import noise_scale_terms
    M = 2000.0
    tr, its, decisions = _run(tmp_path, "every", n=128, epochs=2, measure_every=1, noise_memory=M)
    assert len(decisions) >= 3
    meas, since = [], 0.0                      # (G2, S, the samples each stands for) of every measured iteration
    for r in its:
        since += r["samples"]
        if "stats" in r:
            g2, s = noise_scale_terms(r["stats"]["b"], r["stats"]["sq_micro"], r["stats"]["S"],
                                      r["stats"]["sq_global"])
            meas.append((r["it"], g2, s, since))
            since = 0.0
    for j, d in enumerate(decisions):
        m = [x for x in meas if x[0] < d["at_iteration"]]
        ns = [x[3] for x in m]
        g_ref, s_ref = hand_weighted([x[1] for x in m], ns, M), hand_weighted([x[2] for x in m], ns, M)
        st = d["stats"]
        assert st["measurements"] == st["window_count"] == len(m) > j + 1
        assert st["b_noise_window"] == (pytest.approx(max(s_ref, 0.0) / g_ref, rel=1e-9) if g_ref > 0 else math.inf)
    assert "warming up" not in decisions[0]["reason"]
    # the controller's state (checkpointed) round-trips: the estimate and the samples since the last measurement
    from hpc_jabas.runtime.controller import AdaptiveController
    c = AdaptiveController(tr.cfg)
    c.policy.use_memory(M)                     # what attach sets, before a resume loads the state
    c.load_state_dict(json.loads(json.dumps(tr.controller.state_dict())))
    assert c.policy.noise.b_noise == tr.controller.policy.noise.b_noise and c._fed == tr.controller._fed


def test_adascale_reads_the_sample_memory_estimate(tmp_path):
    """lr_rule = adascale with noise_memory: each decision's gain r = (G2 + S / B_ref) / (G2 + S / B) reads the
    policy's estimate (the hand-weighted averages of every measurement so far), not the controller's moving
    average per measurement."""
    from hpc_jabas.core.adaptive.stats import NoiseScale, noise_scale_terms
    M, B_ref = 2000.0, 8
    _, its, decisions = _run(tmp_path, "adascale", n=128, epochs=1, measure_every=1, noise_memory=M,
                             lr_rule="adascale", batch_ref=B_ref)

    def gain(B, G2, S):                       # AdaScale: E|g_Bref|^2 / E|g_B|^2 with E|g_b|^2 = G2 + S / b
        return (G2 + S / B_ref) / (G2 + S / B) if G2 > 0 else B / B_ref
    moved_apart = 0
    for d in decisions:
        m = [r for r in its if "stats" in r and r["it"] < d["at_iteration"]]
        terms = [noise_scale_terms(r["stats"]["b"], r["stats"]["sq_micro"], r["stats"]["S"], r["stats"]["sq_global"])
                 for r in m]
        ns = [float(r["samples"]) for r in m]
        G2, S = hand_weighted([t[0] for t in terms], ns, M), hand_weighted([t[1] for t in terms], ns, M)
        assert d["lr_scale"] == pytest.approx(gain(d["B"], G2, S), rel=1e-9)
        ema = NoiseScale()
        for r in m:
            ema.update(r["stats"]["b"], r["stats"]["sq_micro"], r["stats"]["S"], r["stats"]["sq_global"])
        moved_apart += abs(gain(d["B"], ema.G2, ema.S) - d["lr_scale"]) > 1e-6
    assert len(decisions) >= 2 and moved_apart >= 1


def test_measure_every_decides_early_once_warmed_up(tmp_path):
    """p = 8, measure_every = 1: the first decision comes after the warm-up's 3 + 1 measurements (iteration 4),
    and it already decides on the noise scale; then every p iterations."""
    _, its, decisions = _run(tmp_path, "early", n=192, epochs=2, p=8, measure_every=1)
    assert [d["at_iteration"] for d in decisions][:3] == [4, 8, 16]
    assert decisions[0]["stats"]["measurements"] == 4 and "warming up" not in decisions[0]["reason"]
    assert "B_noise=" in decisions[0]["reason"] or "unresolved" in decisions[0]["reason"]


def test_default_goodput_measures_ten_times_a_period_with_a_memory_of_one_epoch(tmp_path):
    """Goodput's defaults: measure_every = p / 10 (p = 20: every 2nd iteration, noise-only), the first decision once
    the warm-up's 3 + 1 measurements are in (iteration 8), and a memory of min(1,000 x B0, one epoch) samples
    (B0 = 16, 96 samples a epoch: 96). Set by hand, measure_every = p is one measurement per decision again."""
    tr, its, decisions = _run(tmp_path, "default", n=96, epochs=8, p=20)
    assert [r["it"] for r in its[:12] if "stats" in r] == [1, 3, 5, 7, 9, 11]
    assert all(r["stats"]["similarity"] is None for r in its if "stats" in r)
    assert decisions[0]["at_iteration"] == 8 and decisions[0]["stats"]["measurements"] == 4
    assert tr.controller.policy.noise_memory == 96.0
    tr, its, decisions = _run(tmp_path, "once", n=128, epochs=2, measure_every=4)
    assert [r["it"] for r in its[:12] if "stats" in r] == [3, 7, 11]
    assert "warming up" in decisions[0]["reason"]
    assert [d["stats"]["window_count"] for d in decisions[:3]] == [1, 2, 3]
    assert tr.controller.policy.noise_memory == pytest.approx(16 / -math.log(0.999)) or \
        tr.controller.policy.noise_memory == 128.0


def test_the_simulator_measures_as_the_controller_does(monkeypatch):
    """The simulator with [policy] measure_every = 2 (p = 10, goodput, one v100 node): its noise-only measurements
    and decisions, with the samples each fresh one stands for, against the trainer's rule walked iteration by
    iteration (measure after iteration i when i % k == 0, unless it is an epoch's short last iteration; every
    sample since the previous fresh measurement counted; decide every p iterations and once early, after the
    warm-up's 3 + 1 measurements, at iteration 8)."""
    from test_simulate import cluster, job

    from hpc_jabas.core.adaptive.policy import GoodputPolicy
    from hpc_jabas.core.sim.simulate import Simulation
    events: list[tuple] = []
    inside = []
    observe, decide = GoodputPolicy.observe, GoodputPolicy.decide

    def spy_observe(self, g2, s, samples=None):
        if not inside:
            events.append(("measure", samples))
        return observe(self, g2, s, samples)

    def spy_decide(self, state, space):
        inside.append(1)
        try:
            d = decide(self, state, space)
        finally:
            inside.pop()
        events.append(("decide", state.samples if state.g2 is not None else None, d.B))
        return d
    monkeypatch.setattr(GoodputPolicy, "observe", spy_observe)
    monkeypatch.setattr(GoodputPolicy, "decide", spy_decide)
    N, epochs, k, p = 20_000, 2, 2, 10
    res = Simulation(cluster((("v100", "v100", 1),)), job(stop="samples", epochs=epochs, p=p,
                                                          policy={"measure_every": k, "noise_memory": 5000})).run(
        "goodput")
    decided = iter([e[2] for e in events if e[0] == "decide"])
    want: list[tuple] = []
    B, it, since = res.trajectory[0][1], 0, 0
    for _ in range(epochs):
        left = N
        while left > 0:
            n = min(B, left)
            left -= n
            it += 1
            since += n
            if it % p == 0 or it == 4 * k:
                want.append(("decide", since, None))
                since = 0
                B = next(decided)
            elif it % k == 0 and n == B:
                want.append(("measure", since))
                since = 0
    assert [e[:2] for e in events] == [e[:2] for e in want]
    assert sum(e[0] == "measure" for e in events) > 3 * sum(e[0] == "decide" for e in events) > 0
    assert len({e[2] for e in events if e[0] == "decide"}) >= 2          # B moved: the walk followed it
