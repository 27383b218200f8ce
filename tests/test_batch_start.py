"""batch_start = "knee": an adaptive run starts where the modelled throughput stops rising (core/adaptive/policy.py
``throughput_knee``), its lr warmed up from the batch's over the first decision period; the batch stays the lr
reference. The knee against its closed form, the warm-up against a one-process reference fed the same lr per
step, resume in the middle of the warm-up exact, and misuse one line."""
from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import make_data, make_model, reference_run

from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.planning import throughput_knee
from hpc_jabas.errors import ConfigError


@settings(max_examples=200, deadline=None)
@given(st.floats(0.001, 0.1), st.floats(1e-5, 1e-2), st.integers(1, 64), st.sampled_from([0.02, 0.05, 0.1]))
def test_knee_of_a_linear_time_has_a_closed_form(a, c, lo, rise):
    """t(B) = a + c B on every integer B: doubling raises B / t by 2 (a + c B) / (a + 2 c B), at most 1 + rise
    from B >= a (1 - rise) / (2 rise c) on; the top of the range when that is past half of it."""
    top = 4096
    rows = [(B, a + c * B) for B in range(1, top + 1)]
    got = throughput_knee(rows, lo=lo, rise=rise)
    want = max(lo, math.ceil(a * (1 - rise) / (2 * rise * c) - 1e-9))
    if 2 * want > top:
        assert got == top
    else:
        assert abs(got - want) <= 1, (got, want)      # float rounding at the boundary
        assert (2 * got) / (a + 2 * c * got) <= (1 + rise) * got / (a + c * got) * (1 + 1e-12)


def test_knee_on_a_coarse_space_and_without_times():
    rows = [(32, 0.01), (64, 0.012), (128, 0.016), (256, 0.03), (512, 0.06)]   # 3.2k, 5.3k, 8k, 8.5k, 8.5k /s
    assert throughput_knee(rows, lo=32) == 256          # 128 -> 256: +6.7% (> 5%); 256 -> 512: +0%
    assert throughput_knee(rows, lo=32, rise=0.1) == 128
    assert throughput_knee(rows, lo=300) == 512
    assert throughput_knee([(32, None)], lo=1) is None and throughput_knee([], lo=1) is None


@pytest.mark.parametrize("policy", ["fixed", "ramp"])
def test_knee_needs_an_adaptive_policy_in_one_line(policy):
    with pytest.raises(ConfigError) as e:
        JobConfig(policy=policy, batch=8, batch_min=8, batch_max=64, batch_start="knee").validate()
    msg = str(e.value)
    assert "\n" not in msg and "batch_start='knee'" in msg and "similarity or noise-scale" in msg
    with pytest.raises(ConfigError) as e:
        JobConfig(batch_start="top").validate()
    assert "batch_start" in str(e.value) and "knee" in str(e.value)


def _trainer(tmp_path, name: str, n: int = 240):
    from hpc_jabas.runtime.comm.world import World
    from hpc_jabas.runtime.trainer import Trainer

    cfg = JobConfig(policy="noise-scale", batch=8, batch_min=8, batch_max=96, epochs=50, p=6, lr_rule="linear",
                    batch_start="knee", checkpoint_every=3, run_dir=str(tmp_path / name))
    model = make_model()
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.02), make_data(n), torch.nn.CrossEntropyLoss(),
                 config=cfg, world=World(rank=0, size=1, gpu_types=("v100",)))
    return tr, cfg


def _records(tmp_path, name):
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "iteration"]


def test_a_knee_start_warms_the_lr_up_and_equals_a_reference_fed_the_same_lr(tmp_path):
    tr, cfg = _trainer(tmp_path, "run")
    rows = tr.planner.batch_space(cfg.B_min, cfg.B_max).table()
    knee = throughput_knee([r for r in rows if r[0] <= 240], lo=8)
    assert knee is not None and knee > 8, rows
    assert tr.B == knee and tr.state.lr_scale == pytest.approx(knee / 8)      # linear, batch 8 the reference
    tr.fit(max_iterations=10)
    its = _records(tmp_path, "run")
    assert its[0]["B"] == knee
    w = 6                                                       # the first decision period
    for r in its:
        factor = r.get("lr_warmup", 1.0)
        want = (8 + (knee - 8) * min(1.0, (r["it"] + 1) / w)) / knee if r["B"] == knee else None
        if r["it"] < w - 1:
            assert factor < 1.0
        if want is not None:
            assert factor == pytest.approx(want, rel=1e-12)
    assert its[0]["lr_scale"] * its[0]["lr_warmup"] == pytest.approx(1.0 + (knee - 8) / (6 * 8))
    ref = reference_run({"optimizer": "sgd", "lr": 0.02, "plan": its[0]["plan"], "steps": len(its), "n": 240,
                         "schedule": {str(r["it"]): r["plan"] for r in its},
                         "lr_scales": {str(r["it"]): r["lr_scale"] * r.get("lr_warmup", 1.0) for r in its}})
    got = tr.model.state_dict()
    assert max(float((got[k] - ref[k]).abs().max()) for k in ref) < 1e-9


def test_a_resume_in_the_middle_of_the_warm_up_is_exact(tmp_path):
    straight, _ = _trainer(tmp_path, "a")
    straight.fit(max_iterations=8)
    first, _ = _trainer(tmp_path, "b")
    first.fit(max_iterations=3)
    first.save_checkpoint()                                    # at iteration 3, inside the warm-up
    assert first.state.lr_warmup is not None
    again, _ = _trainer(tmp_path, "b")
    again.fit(max_iterations=8, resume=True)
    assert again.resumed_from is not None and again.state.lr_warmup == first.state.lr_warmup
    a, b = straight.model.state_dict(), again.model.state_dict()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) == 0.0
    assert [r.get("lr_warmup") for r in _records(tmp_path, "a")][3:8] == \
        [r.get("lr_warmup") for r in _records(tmp_path, "b") if r["it"] >= 3][-5:]
