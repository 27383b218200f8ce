"""The divergence guard on adaptive moves (core/adaptive/guard.py, docs/formulas.md section 8): no revert on stationary
noise (a false-revert rate bounded over many seeds), a revert on a jump beyond the band, no move above the restored
B during the cool-down, the state through a checkpoint; and one real run where a policy that raises B and the lr
diverges after a move and the guard brings B back."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hpc_jabas as hj
from hpc_jabas.core.adaptive.guard import DivergenceGuard, band_verdict, guard_window
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.trainer import Trainer


def _noise(rng: np.random.Generator, dist: str, level: float, scale: float) -> float:
    if dist == "normal":
        return float(rng.normal(level, scale))
    if dist == "t3":                       # heavy tails
        return float(level + scale * rng.standard_t(3) / math.sqrt(3.0))
    return float(level * rng.lognormal(0.0, scale / level))      # skewed to the right, as small-batch losses are


def _drive(g: DivergenceGuard, losses, p: int, start_B: int = 16, grow: int = 8):
    """A policy that asks to grow B (and the lr with it, linearly) at every round of p iterations, the guard in
    front of it. Returns (moves, reverts, the trajectory of (round end, B))."""
    B, lr, it, moves, reverts, traj = start_B, 1.0, 0, 0, [], []
    for x in losses:
        g.observe(it, x)
        it += 1
        if it % p:
            continue
        rv = g.check(it, it)
        if rv is not None:
            reverts.append((it, rv))
            B, lr = rv.B, rv.lr_scale
        elif g.allow(it, B, lr, B + grow, (B + grow) / start_B) is None:
            g.moved(it, B, lr, B + grow, (B + grow) / start_B)
            B, lr, moves = B + grow, (B + grow) / start_B, moves + 1
        traj.append((it, B))
    return moves, reverts, traj


# ---- the rule on stationary noise: false reverts -----------------------------------------------------------

FALSE_REVERT_BOUND = 0.01          # per move up, over a run of moves on noise that does not change


@settings(max_examples=12, deadline=None, derandomize=True)
@given(dist=st.sampled_from(["normal", "t3", "lognormal"]), level=st.floats(0.05, 10.0),
       rel_scale=st.floats(0.02, 0.5), p=st.sampled_from([5, 8, 20, 50]), seed=st.integers(0, 2 ** 31))
def test_stationary_noise_rarely_reverts(dist, level, rel_scale, p, seed):
    """The loss is one distribution throughout (no move changes it): over 40 seeds x 30 moves each, the share of
    moves reverted stays under FALSE_REVERT_BOUND."""
    moves = reverts = 0
    for s in range(40):
        rng = np.random.default_rng(seed + s)
        g = DivergenceGuard(window=guard_window(p), cooldown=10 * p)
        losses = [_noise(rng, dist, level, rel_scale * level) for _ in range(30 * p)]
        m, rv, _ = _drive(g, losses, p)
        moves += m
        reverts += len(rv)
    assert moves >= 40 * 20
    assert reverts / moves < FALSE_REVERT_BOUND, (dist, p, reverts, moves)


def test_false_revert_rate_measured():
    """The figure docs/formulas.md gives: per move up, on 200 runs of 60 moves at p = 8 (normal noise, 30% of the
    level, and lognormal noise of the same spread)."""
    rates = {}
    for dist in ("normal", "lognormal"):
        moves = reverts = 0
        for s in range(200):
            rng = np.random.default_rng(s)
            g = DivergenceGuard(window=guard_window(8), cooldown=80)
            m, rv, _ = _drive(g, [_noise(rng, dist, 1.0, 0.3) for _ in range(60 * 8)], 8)
            moves, reverts = moves + m, reverts + len(rv)
        rates[dist] = reverts / moves
    assert rates["normal"] < 0.002 and rates["lognormal"] < 0.01, rates


@settings(max_examples=40, deadline=None, derandomize=True)
@given(n0=st.integers(5, 100), n1=st.integers(1, 100), level=st.floats(-5.0, 5.0), scale=st.floats(0.01, 2.0),
       seed=st.integers(0, 2 ** 31))
def test_a_rise_within_the_band_is_no_revert_and_beyond_it_is(n0, n1, level, scale, seed):
    """The verdict against the threshold it states: post means just under it pass, a jump past it reverts."""
    rng = np.random.default_rng(seed)
    pre = list(rng.normal(level, scale, n0))
    base = band_verdict(pre, [level] * n1, sigma=5.0, rise=0.1)
    assert base is not None
    thr = base.threshold
    assert thr >= base.pre_mean + 0.1 * abs(base.pre_mean) - 1e-12
    assert thr >= base.pre_mean + 5.0 * base.pre_std * math.sqrt(1 / n0 + 1 / n1) - 1e-12
    under = band_verdict(pre, [thr - 1e-6 * (1 + abs(thr))] * n1, sigma=5.0, rise=0.1)
    over = band_verdict(pre, [thr + 1e-6 * (1 + abs(thr))] * n1, sigma=5.0, rise=0.1)
    assert under is not None and not under.exceeded
    assert over is not None and over.exceeded
    nan = band_verdict(pre, [level] * (n1 - 1) + [math.inf], sigma=5.0, rise=0.1)
    assert nan is not None and nan.exceeded


@settings(max_examples=30, deadline=None, derandomize=True)
@given(p=st.sampled_from([5, 10, 20]), jump=st.floats(2.0, 50.0), when=st.integers(3, 8),
       seed=st.integers(0, 2 ** 31))
def test_a_jump_after_a_move_reverts_to_the_B_before_it(p, jump, when, seed):
    """The loss jumps by `jump` standard deviations (and > 10% of it) from the move announced at round `when`:
    the next round reverts to the B in force before that move, once."""
    rng = np.random.default_rng(seed)
    level, sd = 2.0, 0.1
    step = max(jump * sd, 0.3 * level)
    losses = []
    for it in range(12 * p):
        losses.append(float(rng.normal(level + (step if it >= when * p else 0.0), sd)))
    g = DivergenceGuard(window=guard_window(p), cooldown=10 * p)
    moves, reverts, traj = _drive(g, losses, p)
    assert reverts, "no revert after the jump"
    it, rv = reverts[0]
    assert it == (when + 1) * p                      # judged at the round after the move
    assert rv.B_bad == 16 + 8 * when and rv.B == 16 + 8 * (when - 1)
    assert rv.band.post_mean > rv.band.threshold > rv.band.pre_mean
    assert rv.until == it + 10 * p


@settings(max_examples=40, deadline=None, derandomize=True)
@given(wishes=st.lists(st.tuples(st.integers(-40, 60), st.floats(0.5, 4.0)), min_size=5, max_size=40),
       cooldown=st.integers(1, 20), p=st.sampled_from([5, 10]))
def test_no_move_above_the_restored_B_during_the_cool_down(wishes, cooldown, p):
    """After a revert to B_good, no (B, lr) above (B_good, its lr) is allowed before the cool-down ends, whatever
    the policy asks; after it ends, a move up is allowed again."""
    g = DivergenceGuard(window=guard_window(p), cooldown=cooldown * p)
    it = 0
    for _ in range(3 * p):
        g.observe(it, 1.0 + 0.01 * (it % 3))
        it += 1
    g.moved(it, 32, 1.0, 64, 2.0)                    # a move up ...
    for _ in range(p):
        g.observe(it, 10.0)                          # ... after which the loss explodes
        it += 1
    rv = g.check(it, it)
    assert rv is not None and (rv.B, rv.lr_scale, rv.B_bad) == (32, 1.0, 64)
    B, lr = rv.B, rv.lr_scale
    for dB, lr_w in wishes:
        for _ in range(p):
            g.observe(it, 1.0)
            it += 1
        assert g.check(it, it) is None
        Bw = max(1, B + dB)
        why = g.allow(it, B, lr, Bw, lr_w)
        if it < rv.until:
            if Bw > 32 or lr_w > 1.0:
                assert why is not None and "cool-down" in why
        if why is None:
            g.moved(it, B, lr, Bw, lr_w)
            B, lr = Bw, lr_w
        if it < rv.until:
            assert B <= 32 and lr <= 1.0
    if it >= rv.until and g.watch is None:
        assert g.allow(it, B, lr, B + 1, lr) is None


def test_a_revert_that_does_not_stop_the_rise_goes_one_good_state_further_back():
    p = 10
    g = DivergenceGuard(window=guard_window(p), cooldown=100)
    it, B, lr = 0, 16, 1.0
    rng = np.random.default_rng(0)
    for B_next in (24, 36):                          # two good moves on a flat loss
        for _ in range(3 * p):
            g.observe(it, float(rng.normal(1.0, 0.05)))
            it += 1
        assert g.check(it, it) is None
        g.moved(it, B, lr, B_next, B_next / 16)
        B, lr = B_next, B_next / 16
    for _ in range(p):
        g.observe(it, float(rng.normal(1.0, 0.05)))
        it += 1
    assert g.check(it, it) is None                   # 36 accepted
    g.moved(it, B, lr, 54, 54 / 16)
    for _ in range(p):
        g.observe(it, 3.0)
        it += 1
    rv = g.check(it, it)
    assert rv is not None and (rv.B, rv.B_bad) == (36, 54)
    for _ in range(p):
        g.observe(it, 3.5)                           # still rising at B = 36
        it += 1
    rv2 = g.check(it, it)
    assert rv2 is not None and (rv2.B, rv2.B_bad, rv2.reverts) == (24, 36, 2)
    assert rv2.until - it == 2 * 100                 # the second cool-down twice the first
    for _ in range(p):
        g.observe(it, 2.0)                           # coming down: no third revert
        it += 1
    assert g.check(it, it) is None


@settings(max_examples=25, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2 ** 31), cut=st.integers(1, 300), jump_at=st.integers(5, 25))
def test_state_round_trip_and_determinism(seed, cut, jump_at):
    """A guard checkpointed at any iteration and loaded into a fresh one (other parameters' defaults, then
    configured) decides exactly as the uninterrupted one; the same losses give the same decisions."""
    p = 8
    rng = np.random.default_rng(seed)
    losses = [float(rng.normal(1.0, 0.2)) + (3.0 if i >= jump_at * p else 0.0) for i in range(40 * p)]
    ref = _drive(DivergenceGuard(window=guard_window(p), cooldown=5 * p), losses, p)
    assert ref == _drive(DivergenceGuard(window=guard_window(p), cooldown=5 * p), losses, p)

    g = DivergenceGuard(window=guard_window(p), cooldown=5 * p)
    head = _drive(g, losses[:cut - cut % p], p)
    state = json.loads(json.dumps(g.state_dict()))   # what a checkpoint keeps, through plain JSON
    g2 = DivergenceGuard()
    g2.configure(guard_window(p), 5 * p)
    g2.load_state_dict(state)
    assert g2.state_dict() == g.state_dict()
    # go on from the cut with the trajectory's B
    B = head[2][-1][1] if head[2] else 16
    for gg in (g, g2):
        it, Bc, lr, out = cut - cut % p, B, B / 16, []
        for x in losses[cut - cut % p:]:
            gg.observe(it, x)
            it += 1
            if it % p:
                continue
            rv = gg.check(it, it)
            if rv is not None:
                Bc, lr = rv.B, rv.lr_scale
            elif gg.allow(it, Bc, lr, Bc + 8, (Bc + 8) / 16) is None:
                gg.moved(it, Bc, lr, Bc + 8, (Bc + 8) / 16)
                Bc, lr = Bc + 8, (Bc + 8) / 16
            out.append((it, Bc))
        if gg is g:
            first = out
    assert out == first


def test_bad_parameters_are_one_line_errors():
    for kw in ({"sigma": 0.0}, {"sigma": float("nan")}, {"rise": -0.1}):
        with pytest.raises(ConfigError) as e:
            DivergenceGuard(**kw)
        assert "\n" not in str(e.value) and "guard_" in str(e.value)
    with pytest.raises(ConfigError):
        hj.JobConfig(guard_sigma=0.0).validate()
    cfg = hj.JobConfig()
    assert cfg.guard is True and cfg.guard_sigma == 5.0 and cfg.guard_rise == 0.1 and cfg.guard_cooldown == 10


# ---- a real run ------------------------------------------------------------------------------------------------

N = 2048


def _fit(run_dir, lr: float, guard: bool = True, epochs: int = 4, checkpoint: bool = False):
    """1 rank on the CPU: a small MLP, momentum SGD 0.9, the similarity policy asked to grow at every decision
    (gamma = 0.99, alpha = 0.5) with the linear lr rule: B and the lr x1.5 a period, p = 8."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(1)
    parser = hj.ArgumentParser()
    hj.add_arguments(parser)
    argv = ["--policy", "similarity", "--gamma", "0.99", "--alpha", "0.5", "--batch", "16", "--batch-min", "16",
            "--batch-max", "256", "--lr-rule", "linear", "--p", "8", "--epochs", str(epochs),
            "--run-dir", str(run_dir)] + ([] if guard else ["--no-guard"]) + ([] if checkpoint else ["--no-checkpoint"])
    cfg = hj.config_from_args(parser.parse_args(argv))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                 torch.utils.data.TensorDataset(x, y), torch.nn.CrossEntropyLoss(), config=cfg,
                 world=World(rank=0, size=1, gpu_types=("v100",)))
    tr.fit()
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return tr, recs


def test_a_diverging_adaptive_run_is_brought_back(tmp_path, capfd):
    tr, recs = _fit(tmp_path / "run", lr=0.1)
    err = capfd.readouterr().err
    guards = [r for r in recs if r["type"] == "guard"]
    lines = [ln for ln in err.splitlines() if "divergence guard:" in ln]
    assert len(guards) >= 1 and len(lines) == len(guards)        # one line per revert, one record
    gr = guards[0]
    its = {r["it"]: r for r in recs if r["type"] == "iteration"}
    # the move diverged: the loss after it was beyond the band, well above where it was
    assert gr["post_mean"] > gr["threshold"] > gr["pre_mean"] and gr["post_mean"] > 2 * gr["pre_mean"]
    assert gr["B_from"] > gr["B"] and str(gr["B"]) in lines[0] and str(gr["B_from"]) in lines[0]
    # B (and the lr scale) back from the announced iteration, none above them during the cool-down
    at = gr["at_iteration"]
    assert its[at]["B"] == gr["B"] and its[at]["lr_scale"] == pytest.approx(gr["lr_scale"])
    cool = [r for i, r in its.items() if at <= i < gr["cooldown_until"]]
    assert cool and max(r["B"] for r in cool) <= gr["B"]
    assert max(r["lr_scale"] for r in cool) <= gr["lr_scale"] * (1 + 1e-9)
    # the run ends with a finite loss, below the diverged one
    last = [r["loss"] for r in recs if r["type"] == "iteration" and r["epoch"] == 3]
    final = sum(last) / len(last)
    assert math.isfinite(final) and final < gr["post_mean"], (final, gr)
    dec = next(r for r in recs if r["type"] == "decision" and r["at_iteration"] == at)
    assert dec["reason"].startswith("divergence guard") and dec["stats"]["guard"]["exceeded"]
    # the guard's state is in the controller's checkpoint state and loads back
    st = tr.controller.state_dict()["guard"]
    g2 = DivergenceGuard()
    g2.load_state_dict(json.loads(json.dumps(st)))
    assert g2.reverts == len(guards) and g2.state_dict() == st
    # without the guard the same run keeps its large B
    _, recs0 = _fit(tmp_path / "off", lr=0.1, guard=False)
    assert not [r for r in recs0 if r["type"] == "guard"]
    last0 = [r["loss"] for r in recs0 if r["type"] == "iteration" and r["epoch"] == 3]
    assert max(r["B"] for r in recs0 if r["type"] == "iteration" and r["epoch"] == 3) > gr["B"]
    assert final < sum(last0) / len(last0)


def test_a_normal_adaptive_run_is_left_alone(tmp_path, capfd):
    """The same task at a lr the growing B tolerates: the guard judges every move and reverts none."""
    _, recs = _fit(tmp_path / "run", lr=0.01)
    assert "divergence guard" not in capfd.readouterr().err
    assert not [r for r in recs if r["type"] == "guard"]
    judged = [r["stats"]["guard"] for r in recs if r["type"] == "decision" and "guard" in r["stats"]]
    assert len(judged) >= 5 and not any(j["exceeded"] for j in judged)
    Bs = [r["B"] for r in recs if r["type"] == "iteration"]
    assert max(Bs) >= 128                                         # B grew as asked


def test_the_guard_resumes_exactly(tmp_path):
    """One epoch, a checkpoint, a new job resuming it for three more: the same B, lr scale and loss at every
    iteration and the same revert as the uninterrupted run (the guard's state and the losses since the last round
    are in the checkpoint)."""
    _, straight = _fit(tmp_path / "straight", lr=0.1, checkpoint=True)
    _fit(tmp_path / "cut", lr=0.1, epochs=1, checkpoint=True)
    _, cut = _fit(tmp_path / "cut", lr=0.1, checkpoint=True)

    def line(recs):
        its = {r["it"]: (r["B"], r["lr_scale"], r["loss"]) for r in recs if r["type"] == "iteration"}
        return [its[i] for i in sorted(its)]
    guards = [[{k: v for k, v in r.items() if k != "it"} for r in recs if r["type"] == "guard"]
              for recs in (straight, cut)]
    assert guards[0] and guards[0] == guards[1]
    first_job = max(r["it"] for r in cut if r["type"] == "epoch_end" and r["epoch"] == 0)
    assert first_job < guards[0][0]["moved_at"]              # the move and its verdict come after the resume
    assert line(straight) == line(cut)
    verdicts = [[(r["at_iteration"], r["stats"].get("guard")) for r in recs if r["type"] == "decision"]
                for recs in (straight, cut)]
    assert verdicts[0] == verdicts[1]                        # each verdict on the same windows of losses


@pytest.mark.mpi
def test_two_mixes_revert_alike(tmp_path):
    """Allocation invariance on 2 real ranks: the same diverging run (the similarity policy growing B and the lr
    1.5x a period, momentum SGD at lr 0.5) on two GPU mixes, planned differently, gathers the same whole-batch
    losses, so the guard reverts at the same iteration to the same B and every B and lr scale agree."""
    from mpi_util import run_ranks_cases
    config = {"planner": "optimal", "micro_batch": 8, "policy": "similarity", "p": 5, "gamma": 0.99, "alpha": 0.5,
              "batch_min": 16, "batch_max": 256, "lr_rule": "linear"}
    specs = [{"optimizer": "momentum", "lr": 0.5, "plan": "b=8 n=1,1", "steps": 60, "n": 2048, "checkpoint": False,
              "run_dir": str(tmp_path / f"mix{i}"), "gpu_types": mix, "config": config}
             for i, mix in enumerate((["v100", "p100"], ["a100", "rtx2060"]))]
    res = run_ranks_cases("train_worker.py", specs, np_=2, timeout=600)
    guards = []
    for spec in specs:
        recs = [json.loads(ln) for ln in (tmp_path / spec["run_dir"]).joinpath("metrics.jsonl").read_text()
                .splitlines()]
        guards.append([(r["it"], r["B"], r["B_from"], r["cooldown_until"]) for r in recs if r["type"] == "guard"])
    assert guards[0] and guards[0] == guards[1], guards
    ha, hb = res[0][0]["history"], res[1][0]["history"]
    assert [h["B"] for h in ha] == [h["B"] for h in hb]
    assert [h["lr_scale"] for h in ha] == pytest.approx([h["lr_scale"] for h in hb], rel=1e-15)
    assert [h["plan"] for h in ha] != [h["plan"] for h in hb]          # the mixes did plan differently


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_no_large_move_up_before_it_can_be_judged_and_an_early_jump_reverts(p):
    """A short decision period and a policy that asks for 4x at once: the rounds before 5 losses exist keep B (such
    a move could not be judged: no noise band); the first move up comes at the first round with >= 5 losses, and
    when the loss jumps right after it (an early move to a B the run cannot take), the next round reverts it. A move
    of at most 2x (B and lr) goes ahead unjudged, as a fixed B twice as large would."""
    from hpc_jabas.core.adaptive.guard import MIN_PRE
    rng = np.random.default_rng(p)
    first = -(-MIN_PRE // p) * p                     # the first round with MIN_PRE losses before it
    losses = [float(rng.normal(2.0, 0.05)) + (3.0 if it >= first else 0.0) for it in range(first + 3 * p)]
    g = DivergenceGuard(window=guard_window(p), cooldown=10 * p)
    moves, reverts, traj = _drive(g, losses, p, grow=48)
    assert [B for it, B in traj if it < first] == [16] * (first // p - 1)
    assert dict(traj)[first] == 64                    # the first move, judged against the 5+ losses before it
    assert reverts and reverts[0][0] == first + p and reverts[0][1].B == 16 and reverts[0][1].B_bad == 64
    assert reverts[0][1].band.pre_n >= MIN_PRE
    fresh = DivergenceGuard()
    why = fresh.allow(0, 16, 1.0, 48, 3.0)
    assert why is not None and "0 losses so far" in why
    assert fresh.allow(0, 16, 1.0, 32, 2.0) is None            # 2x: unjudged, allowed
    assert fresh.allow(0, 16, 1.0, 32, 2.5) is not None        # B 2x but the lr 2.5x: waits
