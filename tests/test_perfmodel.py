"""Perf model: interpolation and its extrapolation flag, allreduce fit, iteration time, JSON round trip."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_jabas.core.config import gpus
from hpc_jabas.core.perf.perfmodel import (
    EMU_MEM_SAMPLES_PER_GB,
    AllreduceModel,
    ComputeProfile,
    PerfModel,
    emulated_time,
)
from hpc_jabas.core.planning import Plan
from hpc_jabas.errors import ConfigError


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


# -- compute profile ----------------------------------------------------------------------------

def test_interpolation_inside_range():
    p = ComputeProfile("v100", b=[2, 4, 8], t=[1.0, 2.0, 3.0], max_b=64)
    assert p.time(2) == 1.0 and p.time(4) == 2.0 and p.time(8) == 3.0
    assert p.time(3) == pytest.approx(1.5)
    assert p.time(6) == pytest.approx(2.5)
    assert not p.extrapolated(3) and not p.extrapolated(8)
    assert p.extrapolations() == []


def test_extrapolation_is_linear_and_recorded():
    p = ComputeProfile("V100", b=[8, 2, 4], t=[3.0, 1.0, 2.0], max_b=64)  # unsorted input, alias-ish name
    assert p.gpu == "v100" and p.b == [2, 4, 8]
    assert p.extrapolated(16) and p.extrapolated(1)
    assert p.time(16) == pytest.approx(5.0)      # from (4,2) and (8,3): slope 1/4
    assert p.time(1) == pytest.approx(0.5)       # from (2,1) and (4,2)
    assert p.extrapolations() == [1, 16]


def test_extrapolation_stays_positive():
    sup = ComputeProfile("v100", b=[4, 8], t=[1.0, 4.0], max_b=64)   # superlinear: line hits 0 at b=8/3
    assert sup.time(2) == pytest.approx(0.5)                          # floor t0 * b / b0
    dec = ComputeProfile("v100", b=[1, 2], t=[2.0, 1.0], max_b=64)    # noisy, decreasing
    assert dec.time(4) == pytest.approx(1.0)                          # never below the last measured time
    single = ComputeProfile("v100", b=[4], t=[2.0], max_b=64)
    assert single.time(8) == pytest.approx(4.0) and single.extrapolated(8)


def test_memory_cap():
    p = ComputeProfile("rtx2060", b=[8, 16], t=[0.1, 0.2], max_b=16)
    with pytest.raises(ConfigError) as e:
        p.time(32)
    msg = one_line(e)
    assert "b=32" in msg and "memory cap" in msg and "rtx2060" in msg and "16" in msg
    assert ComputeProfile("v100", b=[8, 16], t=[0.1, 0.2]).max_b == 16   # default: largest measured


@pytest.mark.parametrize("kw, needle", [
    (dict(gpu="k80", b=[1], t=[1.0]), "k80"),
    (dict(gpu="v100", b=[1, 2], t=[1.0]), "times"),
    (dict(gpu="v100", b=[2, 2], t=[1.0, 1.0]), "twice"),
    (dict(gpu="v100", b=[1, 2], t=[1.0, -1.0]), "time t"),
    (dict(gpu="v100", b=[0, 2], t=[1.0, 1.0]), "b=0"),
    (dict(gpu="v100", b=[], t=[]), "no measured point"),
    (dict(gpu="v100", b=[1], t=[1.0], max_b=0), "max_b"),
    (dict(gpu="v100", b=[1], t=[1.0], update_s=-1), "update_s"),
])
def test_profile_validation(kw, needle):
    with pytest.raises(ConfigError) as e:
        ComputeProfile(**kw)
    assert needle in one_line(e)


@settings(deadline=None, max_examples=60)
@given(st.lists(st.floats(0.01, 10.0), min_size=2, max_size=6),
       st.lists(st.integers(1, 6), min_size=2, max_size=6), st.integers(1, 80))
def test_time_is_bracketed_and_flagged(ts, gaps, b):
    n = min(len(ts), len(gaps))
    bs = list(np.cumsum(gaps[:n]))
    ts = sorted(ts[:n])
    p = ComputeProfile("p100", b=[int(x) for x in bs], t=ts, max_b=1000)
    v = p.time(b)
    assert v > 0
    assert p.extrapolated(b) == (b < bs[0] or b > bs[-1])
    if not p.extrapolated(b):
        assert min(ts) - 1e-12 <= v <= max(ts) + 1e-12
        assert b not in p.extrapolations()
    else:
        assert b in p.extrapolations()


# -- allreduce ----------------------------------------------------------------------------------

def test_allreduce_ideal_and_time():
    ar = AllreduceModel(a=2.0, c=0.01, bandwidth=1e9)
    assert ar.ideal(1e9, 1) == 0.0
    assert ar.time(1e9, 1) == pytest.approx(0.01)
    assert ar.ideal(1e9, 4) == pytest.approx(2 * 3 / 4 * 1.0)
    assert ar.time(1e9, 4) == pytest.approx(2.0 * 1.5 + 0.01)


def test_allreduce_fit_recovers_parameters():
    bw = 5e9
    truth = AllreduceModel(a=1.7, c=0.003, bandwidth=bw)
    samples = [(nb, n, truth.time(nb, n)) for nb in (1e6, 1e7, 1e8, 4e8) for n in (1, 2, 4, 8, 16)]
    fit = AllreduceModel.fit(samples, bandwidth=bw)
    assert fit.a == pytest.approx(1.7, rel=1e-9) and fit.c == pytest.approx(0.003, rel=1e-6)
    rng = np.random.default_rng(0)
    noisy = [(nb, n, s * (1 + 0.02 * rng.standard_normal())) for nb, n, s in samples]
    fit2 = AllreduceModel.fit(noisy, bandwidth=bw)
    assert fit2.a == pytest.approx(1.7, rel=0.05) and fit2.c == pytest.approx(0.003, abs=0.002)


def test_allreduce_fit_is_non_negative_and_needs_two_sizes():
    # times that fall with size would give a < 0 unconstrained; NNLS clamps to a = 0
    fit = AllreduceModel.fit([(1e8, 2, 0.5), (1e9, 2, 0.4), (1e10, 2, 0.3)], bandwidth=1e9)
    assert fit.a == 0.0 and fit.c == pytest.approx(0.4)
    with pytest.raises(ConfigError) as e:
        AllreduceModel.fit([(1e8, 2, 0.5), (1e8, 2, 0.6)])
    assert "2 different" in one_line(e)
    with pytest.raises(ConfigError):
        AllreduceModel(a=-1.0)


# -- iteration time -----------------------------------------------------------------------------

def small_model(overlap: float = 0.0) -> PerfModel:
    return PerfModel({"v100": ComputeProfile("v100", b=[1, 4], t=[1.0, 2.5], update_s=0.25, max_b=8),
                      "p100": ComputeProfile("p100", b=[1, 4], t=[2.0, 5.0], update_s=0.5, max_b=2)},
                     AllreduceModel(a=1.0, c=0.1, bandwidth=1.0), grad_bytes=2.0, overlap=overlap)


def test_iteration_time_formula():
    m = small_model()
    plan = Plan(2, (3, 1))
    t_v, t_p = m.t_micro("v100", 2), m.t_micro("p100", 2)
    assert t_v == pytest.approx(1.5) and t_p == pytest.approx(3.0)
    compute = max(3 * t_v + 0.25, 1 * t_p + 0.5)
    tail = 1.0 * (2 * 1 / 2 * 2.0 / 1.0) + 0.1
    assert m.iteration_time(plan, ["v100", "p100"]) == pytest.approx(compute + tail)
    assert m.throughput(plan, ["v100", "p100"]) == pytest.approx(8 / (compute + tail))
    assert m.t_micro("v100", 2, speed_factor=2.0) == pytest.approx(0.75)
    sf = m.iteration_time(plan, ["v100", "p100"], speed_factors=[1.0, 2.0])
    assert sf == pytest.approx(max(3 * t_v + 0.25, t_p / 2 + 0.5) + tail)
    m2 = small_model(overlap=0.25)
    assert m2.iteration_time(plan, ["v100", "p100"]) == pytest.approx(compute + 0.75 * tail)


def test_dropped_rank_ignores_its_cap_and_the_allreduce_shrinks():
    m = small_model()
    plan = Plan(4, (2, 0))          # p100's cap is 2 < 4, but it runs nothing
    assert m.iteration_time(plan, ["v100", "p100"]) == pytest.approx(2 * 2.5 + 0.25 + 0.1)
    with pytest.raises(ConfigError) as e:
        m.iteration_time(Plan(4, (1, 1)), ["v100", "p100"])
    assert "p100" in one_line(e)
    with pytest.raises(ConfigError):
        m.iteration_time(plan, ["v100"])           # one GPU type per rank
    with pytest.raises(ConfigError):
        m.iteration_time(plan, ["v100", "a100"])   # no profile


def test_model_validation():
    with pytest.raises(ConfigError):
        PerfModel({})
    with pytest.raises(ConfigError):
        small_model(overlap=1.5)
    p = ComputeProfile("v100", b=[1], t=[1.0])
    with pytest.raises(ConfigError) as e:
        PerfModel({"p100": p})
    assert "v100" in one_line(e)


# -- emulated model -----------------------------------------------------------------------------

def test_emulated_formula_speeds_and_caps():
    m = PerfModel.emulated(["v100", "rtx2060", "p100"], b_list=[8, 16, 32], base_s=0.01, per_sample_s=0.002)
    for g in ("v100", "rtx2060", "p100"):
        p = m.profile(g)
        speed = gpus.get(g).relative_speed
        assert p.emulated
        for b in (1, 8, 12, 32, 64):
            assert p.time(b) == (0.01 + 0.002 * b) / speed == emulated_time(b, 0.01, 0.002, speed)
            assert not p.extrapolated(b)
        assert p.max_b == int(gpus.get(g).memory_gb * EMU_MEM_SAMPLES_PER_GB)
    assert m.profile("rtx2060").max_b < m.profile("v100").max_b
    m2 = PerfModel.emulated(["v100", "p100"], [8], 0.0, 0.001, speeds={"P100": 0.5}, mem_samples_per_gb=2.0)
    assert m2.profile("p100").time(8) == pytest.approx(0.016)
    assert m2.profile("v100").max_b == 64 and m2.profile("p100").max_b == 32
    with pytest.raises(ConfigError):
        PerfModel.emulated(["k80"])
    with pytest.raises(ConfigError):
        PerfModel.emulated(["v100"], b_list=[])


# -- JSON ---------------------------------------------------------------------------------------

def test_json_round_trip(tmp_path):
    m = small_model(overlap=0.3)
    m.profiles["v100"].source = "measured on node7"
    d = m.to_dict()
    assert d["version"] == 1
    again = PerfModel.from_dict(json.loads(json.dumps(d)))
    assert again == m
    em = PerfModel.emulated(["v100", "titan-v"])
    assert PerfModel.from_dict(json.loads(json.dumps(em.to_dict()))) == em

    written = m.save(tmp_path / "prof")
    assert sorted(os.path.basename(p) for p in written) == ["allreduce.json", "p100.json", "v100.json"]
    loaded = PerfModel.load(tmp_path / "prof")
    assert loaded == m
    plan = Plan(1, (2, 1))
    assert loaded.iteration_time(plan, ["v100", "p100"]) == m.iteration_time(plan, ["v100", "p100"])


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError) as e:
        PerfModel.load(tmp_path / "nope")
    assert "does not exist" in one_line(e)
    d = tmp_path / "prof"
    small_model().save(d)
    os.remove(d / "allreduce.json")
    with pytest.raises(ConfigError) as e:
        PerfModel.load(d)
    assert "allreduce.json" in one_line(e)

    small_model().save(d)
    doc = json.loads((d / "v100.json").read_text())
    doc["version"] = 2
    (d / "v100.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        PerfModel.load(d)
    assert "version 2" in one_line(e) and "v100.json" in str(e.value)

    small_model().save(d)
    (d / "p100.json").write_text("{not json")
    with pytest.raises(ConfigError) as e:
        PerfModel.load(d)
    assert "not valid JSON" in one_line(e)

    small_model().save(d)
    os.rename(d / "p100.json", d / "a100.json")
    with pytest.raises(ConfigError) as e:
        PerfModel.load(d)
    assert "rename" in one_line(e)

    with pytest.raises(ConfigError) as e:
        PerfModel.from_dict({"version": 1, "profiles": {}})
    assert "allreduce" in one_line(e)
    with pytest.raises(ConfigError):
        PerfModel.from_dict({"profiles": {}})


def test_perfmodel_is_pure():
    import hpc_jabas.core.perf.perfmodel as pm
    import hpc_jabas.core.planning.identical as pl
    import hpc_jabas.core.planning.slots as ps
    for mod in (pm, pl, ps):
        src = open(mod.__file__).read()
        for bad in ("import torch", "import horovod", "subprocess", "import time", "from time"):
            assert bad not in src, (mod.__name__, bad)
    assert math.isfinite(small_model().iteration_time(Plan(1, (1, 1)), ["v100", "p100"]))
