"""The curvature headroom measured online (``headroom_probe``) and Seesaw's late-phase floor (``seesaw``), in one-rank
fits as a user's script runs them (``import hpc_jabas``), against closed forms:

- on a least-squares model whose design is isotropic (X'X / n = s^2 I, so H = 2 s^2 I for the mean squared error)
  eps_max = g'g / g'Hg = 1 / (2 s^2) at every weight, so every probe's eps_max and h = 2 eps_max / (lr x lr scale
  / (1 - momentum)) are known exactly;
- the probe leaves training as it was (a cap too wide to bind: B trajectory and weights bit-identical with it off);
- Seesaw under a step schedule (x 1/4 an epoch) lifts B to batch / alpha with the lr kept (SGD) or x sqrt(alpha)
  (Adam), and no further than the headroom cap;
- the floor's rule (core/adaptive/seesaw.py) under hypothesis.
"""
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hpc_jabas as hj
from hpc_jabas.core.adaptive.seesaw import SeesawFloor, floor_batch, seesaw_floor, seesaw_lr_scale
from hpc_jabas.core.planning.space import BatchSpace

N, D, S2 = 256, 6, 0.7          # samples, features, the design's s^2


def _isotropic():
    rng = np.random.default_rng(5)
    q, _ = np.linalg.qr(rng.standard_normal((N, D)))
    X = q * math.sqrt(N * S2)                                   # X'X / N = S2 I exactly (up to rounding)
    y = X @ rng.standard_normal(D) + 0.5 * rng.standard_normal(N)
    return torch.tensor(X), torch.tensor(y).unsqueeze(1)


def _decisions(run_dir):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r["type"] == "decision"]


def _fit(run_dir, model, opt, ds, loss, sched=None, **kw):
    cfg = hj.JobConfig(gpu_types=["v100"], emulate=True, emulate_base_s=1e-4, emulate_per_sample_s=1e-5,
                       run_dir=str(run_dir), checkpoint=False, metrics_period=4, **kw)
    tr = hj.Trainer(model, opt, ds, loss, config=cfg, scheduler=sched)
    tr.fit()
    return tr


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def test_online_eps_max_and_h_are_the_closed_form_on_an_isotropic_quadratic(tmp_path):
    X, y = _isotropic()
    torch.manual_seed(0)
    model = torch.nn.Linear(D, 1, bias=False)
    lr, beta = 0.02, 0.9
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=beta)
    _fit(tmp_path, model, opt, torch.utils.data.TensorDataset(X, y), torch.nn.MSELoss(), policy="similarity",
         gamma=0.99, alpha=0.5, batch=16, batch_min=16, batch_max=64, micro_batch=8, lr_rule="linear", p=4,
         epochs=2, guard=False, headroom_probe=N, headroom_every=1, headroom_c=1e6)
    ds = _decisions(tmp_path)
    fresh = [d for d in ds if d["stats"].get("headroom_fresh")]
    assert len(fresh) == len(ds) >= 4                            # every round probes (headroom_every = 1)
    eps = 1.0 / (2.0 * S2)
    seen_B = set()
    for d in fresh:
        hd = d["stats"]["headroom"]
        B_h = hd["B"]
        seen_B.add(B_h)
        lr_eff = lr * (B_h / 16) / (1 - beta)                    # the linear rule's scale at the B it ran
        assert hd["eps_max"] == pytest.approx(eps, rel=1e-9)
        assert hd["lr_eff"] == pytest.approx(lr_eff, rel=1e-12)
        assert hd["h"] == pytest.approx(2 * eps / lr_eff, rel=1e-9)
        assert hd["samples"] == N
    assert len(seen_B) >= 2                                      # measured at more than one B (and lr scale)


def _mlp_run(run_dir, probe):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(384, 8, generator=g)
    y = ((x[:, 0] - x[:, 1]) > 0).long()
    y = torch.where(torch.rand(384, generator=g) < 0.2, 1 - y, y)
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Tanh(),
                                torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    tr = _fit(run_dir, model, opt, torch.utils.data.TensorDataset(x, y), torch.nn.CrossEntropyLoss(),
              policy="noise-scale", batch=16, batch_min=8, batch_max=128, micro_batch=8, p=4, epochs=2,
              headroom_probe=96 if probe else 0, headroom_c=1e9)
    return tr, model


def test_the_probe_leaves_training_as_it_was(tmp_path):
    tr0, m0 = _mlp_run(tmp_path / "off", probe=False)
    tr1, m1 = _mlp_run(tmp_path / "on", probe=True)
    assert tr1.b_trajectory() == tr0.b_trajectory() and len(tr0.b_trajectory()) > 1
    for a, b in zip(m0.state_dict().values(), m1.state_dict().values()):
        assert torch.equal(a, b)
    ds = _decisions(tmp_path / "on")
    assert [d["B"] for d in ds] == [d["B"] for d in _decisions(tmp_path / "off")]
    hs = [d["stats"]["headroom"]["h"] for d in ds if d["stats"].get("headroom_fresh")]
    assert hs and all(isinstance(h, float) and h > 0 for h in hs)
    assert "headroom" not in json.dumps([d["stats"] for d in _decisions(tmp_path / "off")])


def _seesaw_run(run_dir, adam, **kw):
    X, y = _isotropic()
    torch.manual_seed(0)
    model = torch.nn.Linear(D, 1, bias=False)
    lr = 0.01
    opt = torch.optim.Adam(model.parameters(), lr=lr) if adam else torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.25)
    # similarity with gamma near -1 always asks to shrink; at batch_min it stays: only the floor moves B
    tr = _fit(run_dir, model, opt, torch.utils.data.TensorDataset(X, y), torch.nn.MSELoss(), sched=sched,
              policy="similarity", gamma=-0.999, batch=16, batch_min=16, batch_max=256, micro_batch=8, p=4,
              epochs=3, guard=False, seesaw=True, **kw)
    return tr, _decisions(run_dir)


@pytest.mark.parametrize("adam", [False, True])
def test_seesaw_lifts_B_by_one_over_alpha_under_a_step_schedule(tmp_path, adam):
    tr, ds = _seesaw_run(tmp_path, adam)
    per_epoch = N // 16                                          # 16 iterations at B = 16: rounds at 4, 8, 12, 16
    first = [d for d in ds if d["at_iteration"] <= per_epoch]
    assert first and all(d["B"] == 16 and d["stats"]["seesaw"]["floor"] is None for d in first)
    lifted = [d for d in ds if d["stats"]["seesaw"]["floor"] is not None]
    assert lifted, "the floor never bound"
    for d in lifted:
        alpha = d["stats"]["seesaw"]["alpha"]
        assert alpha in (pytest.approx(0.25), pytest.approx(0.0625))
        assert d["B"] == round(16 / alpha)                        # 64, then 256 (all realisable at b = 8)
        k = d["B"] / 16
        assert d["lr_scale"] == pytest.approx(math.sqrt(k) if adam else k, rel=1e-12)
        # the lr in force: SGD the peak's, Adam the peak's x sqrt(alpha)
        assert 0.01 * alpha * d["lr_scale"] == pytest.approx(0.01 * (math.sqrt(alpha) if adam else 1.0))
        assert "seesaw" in d["reason"]
    assert tr.B == 256


def test_seesaw_is_capped_by_the_measured_headroom(tmp_path):
    # after the first cut h = 2 eps_max / lr_eff = 1 / S2 / 0.0025 = 571 at B = 16: c = 0.005 caps at 45.7 < 64
    tr, ds = _seesaw_run(tmp_path, False, headroom_probe=N, headroom_every=1, headroom_c=0.005)
    capped = 0
    for d in ds:
        hd = d["stats"]["headroom"]
        assert hd["h"] == pytest.approx(2 / (2 * S2) / hd["lr_eff"], rel=1e-9)
        if d["stats"]["seesaw"]["floor"] is not None:
            assert d["B"] <= 0.005 * hd["h"] * hd["B"]               # never past c x h x B_h
            assert d["lr_scale"] == pytest.approx(d["B"] / 16)       # SGD: the lr takes the rest of the cut
            if d["B"] < round(16 / d["stats"]["seesaw"]["alpha"]):
                capped += 1
                assert "capped" in d["reason"]
    assert capped >= 1


def _space(B_min, B_max, grain):
    return BatchSpace(B_min, B_max, lambda lo, hi: [(B, None) for B in range(max(lo, B_min), min(hi, B_max) + 1)
                                                    if B % grain == 0])


@settings(max_examples=300, deadline=None)
@given(B=st.integers(8, 512), alpha=st.floats(0.01, 1.5), lim=st.one_of(st.none(), st.floats(1.0, 4096.0)),
       grain=st.sampled_from([1, 8, 32]))
def test_floor_batch_lifts_to_the_first_realisable_above_the_floor_within_the_cap(B, alpha, lim, grain):
    sp = _space(8, 1024, grain)
    f = seesaw_floor(32, alpha, B_max=sp.B_max)
    got = floor_batch(sp, B, f, lim)
    if f is None or f <= B:
        assert got is None
        return
    if got is None:                       # nothing realisable above B within the cap
        ok = [x for x in range(B + 1, 1025) if x % grain == 0 and (lim is None or x <= lim)]
        assert not ok or min(ok) > f and lim is not None and all(x > lim for x in ok if x >= f)
        return
    assert got > B and got % grain == 0 and (lim is None or got <= lim)
    above = [x for x in range(math.ceil(f - 1e-9), 1025) if x % grain == 0]
    if above and (lim is None or above[0] <= lim):
        assert got == above[0]             # the first realisable at or above the floor
    else:
        assert got < f or not above        # capped (or the range's top): below the floor


@settings(max_examples=200, deadline=None)
@given(alpha=st.floats(0.001, 0.999), B_ref=st.integers(1, 4096))
def test_seesaw_lr_at_the_full_floor_is_the_peaks_for_sgd_and_sqrt_alpha_for_adam(alpha, B_ref):
    f = seesaw_floor(B_ref, alpha)
    assert f == pytest.approx(B_ref / alpha, rel=1e-12)
    assert alpha * seesaw_lr_scale(f, B_ref, adam=False) == pytest.approx(1.0, rel=1e-12)
    assert alpha * seesaw_lr_scale(f, B_ref, adam=True) == pytest.approx(math.sqrt(alpha), rel=1e-12)
    fl = SeesawFloor(B_ref, adam=False)
    assert fl.observe(0.1) == 1.0 and fl.floor() is None           # no cut yet: no floor
    fl.observe(0.2)                                                # a warm-up's rise is no cut
    assert fl.observe(0.2 * alpha) == pytest.approx(alpha) and fl.floor() == pytest.approx(B_ref / alpha)


def test_an_optimizer_the_probe_cannot_read_is_one_line_before_any_step(tmp_path):
    X, y = _isotropic()
    model = torch.nn.Linear(D, 1, bias=False)
    with pytest.raises(hj.ConfigError, match=r"^optimizer=RMSprop has no headroom probe; valid: SGD .*Adam, AdamW$"):
        _fit(tmp_path, model, torch.optim.RMSprop(model.parameters(), lr=0.01), torch.utils.data.TensorDataset(X, y),
             torch.nn.MSELoss(), policy="similarity", batch=16, batch_min=16, batch_max=64, epochs=1,
             headroom_probe=32)
    with pytest.raises(hj.ConfigError, match="goal='x' is unknown; valid: time, final"):
        hj.JobConfig(goal="x").validate()
