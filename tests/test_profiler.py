"""Profiler (`hpc-jabas profile`): CPU measurement, emulated profiles, JSON round trip, misuse,
and the allreduce fit over 2 MPI ranks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mpi_util import ROOT, mpi_env

from hpc_jabas.cli.main import main as cli_main
from hpc_jabas.core.config import gpus
from hpc_jabas.core.config.loader import load_callable
from hpc_jabas.core.perf.perfmodel import (
    ALLREDUCE_FILE,
    EMU_BASE_S,
    EMU_PER_SAMPLE_S,
    FORMAT_VERSION,
    AllreduceModel,
    PerfModel,
    emulated_time,
)
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.profiling.allreduce import fit_allreduce
from hpc_jabas.runtime.profiling.compute import ComputeMeasurement, measure_compute, measured_profile
from hpc_jabas.runtime.profiling.defaults import DEFAULT_B_LIMIT, DEFAULT_B_LIST
from hpc_jabas.runtime.profiling.emulated import EmulationOverhead, emulated_profile, measure_emulation_overhead
from hpc_jabas.runtime.profiling.load import load_model
from hpc_jabas.runtime.profiling.memory import search_max_b

MODEL = "examples.models:digits_mlp"
MLP_PARAMS = 64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)          # examples.models is importable from the repository root
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cpu_meas():
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        torch.set_num_threads(1)
        yield measure_compute(load_model(MODEL), [1, 16, 128, 512], warmup=2, repeats=7)
    finally:
        os.chdir(here)


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


# -- measurement on the CPU ---------------------------------------------------------------------

def test_cpu_measurement_is_sane(cpu_meas):
    m = cpu_meas
    assert m.b == [1, 16, 128, 512] and m.device == "cpu"
    assert all(t > 0 for t in m.t) and m.update_s > 0
    assert all(len(r) == 7 for r in m.repeats)
    # monotone-ish: a micro-batch of 512 costs more than one of 1, and no size is much cheaper
    # than a smaller one. The machine is shared, so this looks at the fastest of the 7 repeats
    # (least disturbed by other processes) with a 50 % margin.
    best = [min(r) for r in m.repeats]
    assert best[-1] > best[0], best
    for a, b in zip(best, best[1:]):
        assert b >= 0.5 * a, best
    assert all(min(r) <= t <= max(r) for r, t in zip(m.repeats, m.t))     # t is the median
    assert m.grad_bytes == MLP_PARAMS * 4
    assert m.bytes_per_sample > 64 * 4          # at least the input row
    assert m.max_b is None                      # CPU without memory_gb: the catalog decides later


def test_cpu_memory_cap_from_declared_memory(cpu_meas):
    per, fixed = cpu_meas.bytes_per_sample, cpu_meas.fixed_bytes
    p = measured_profile("v100", cpu_meas, memory_gb=0.001)
    assert p.max_b == int((0.001 * 2**30 - fixed) // per) and 1 <= p.max_b < 4096
    assert p.b == [b for b in [1, 16, 128, 512] if b <= p.max_b]
    assert "declared memory 0.001 GiB" in p.source and not p.emulated
    cat = measured_profile("rtx2060", cpu_meas)           # catalog: 6 GiB -> the b_limit cap
    assert cat.max_b == DEFAULT_B_LIMIT and "catalog memory 6 GiB" in cat.source
    with pytest.raises(ConfigError) as e:
        measured_profile("v100", cpu_meas, memory_gb=1e-7)
    assert "holds no sample" in one_line(e)


def test_max_b_search_doubling_then_bisection():
    calls = []

    def fits(b):
        calls.append(b)
        return b <= 300
    assert search_max_b(fits, 4096) == (300, False)
    assert calls[:10] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert search_max_b(lambda b: True, 1000) == (1000, True)
    with pytest.raises(ConfigError):
        search_max_b(lambda b: False, 64)


# -- emulated profiles --------------------------------------------------------------------------

def test_emulated_profile_equals_the_formula(cpu_meas):
    base, per = 0.002, 0.0002
    for g in ("v100", "p100", "rtx2060"):
        p = emulated_profile(g, cpu_meas, base_s=base, per_sample_s=per)
        speed = gpus.get(g).relative_speed
        assert p.emulated and p.formula == {"base_s": base, "per_sample_s": per, "speed": speed}
        for b in (1, 3, 16, 100, 512, 1000):
            assert p.time(b) == emulated_time(b, base, per, speed)
        assert p.t == [emulated_time(b, base, per, speed) for b in p.b]
        assert f"emulated {g}" in p.source and "catalog FP32 speed" in p.source
        assert p.update_s == cpu_meas.update_s
    dflt = emulated_profile("rtx2060", speed=0.5)          # the emulator's defaults
    assert dflt.time(8) == emulated_time(8, EMU_BASE_S, EMU_PER_SAMPLE_S, 0.5)


def test_emulated_profile_overrun_and_overhead(cpu_meas):
    slow = ComputeMeasurement(**{**cpu_meas.to_dict(), "t": [1.0] * len(cpu_meas.b)})
    p = emulated_profile("v100", slow)
    assert p.formula is None and p.t == [1.0] * len(p.b) and "overruns" in p.source
    ov = EmulationOverhead("p100", 0.0007, {8: 0.0007}, 1)
    q = emulated_profile("p100", cpu_meas, overhead=ov)
    s = gpus.get("p100").relative_speed
    assert q.time(8) == pytest.approx(emulated_time(8, EMU_BASE_S, EMU_PER_SAMPLE_S, s) + 0.0007, rel=1e-12)
    assert "measured emulation overhead of 0.7 ms" in q.source
    with pytest.raises(ConfigError):
        emulated_profile("v100", cpu_meas, overhead=ov)


def test_emulation_overhead_is_measured():
    ov = measure_emulation_overhead(load_model(MODEL), "v100", base_s=0.001, per_sample_s=0.0,
                                             b_list=(1, 2), warmup=1, repeats=3)
    assert ov.gpu == "v100" and set(ov.per_b) == {1, 2} and 0.0 <= ov.overhead_s < 0.05


# -- the CLI, files -----------------------------------------------------------------------------

def test_cli_profile_writes_versioned_json_that_loads(tmp_path, capsys):
    out = tmp_path / "prof"
    rc = cli_main(["profile", "--model", MODEL, "--gpu-type", "p100", "--b-list", "1,8,64", "--warmup", "1",
                   "--repeats", "3", "--memory-gb", "0.002", "--out", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "p100: measured" in text and "allreduce not measured" in text
    assert sorted(os.listdir(out)) == [ALLREDUCE_FILE, "p100.json"]
    raw = json.loads((out / "p100.json").read_text())
    assert raw["version"] == FORMAT_VERSION and raw["emulated"] is False and raw["b"] == [1, 8, 64]
    model = PerfModel.load(out)
    assert model.grad_bytes == MLP_PARAMS * 4
    p = model.profile("p100")
    assert p.to_dict() == raw and p.max_b > 64 and "measured on cpu" in p.source
    # emulated types join the same directory; the measured one is kept
    rc = cli_main(["profile", "--model", MODEL, "--emulate", "--gpu-type", "v100,rtx2060", "--b-list", "1,8",
                   "--repeats", "2", "--warmup", "0", "--out", str(out), "--quiet"])
    assert rc == 0
    model2 = PerfModel.load(out)
    assert sorted(model2.profiles) == ["p100", "rtx2060", "v100"]
    assert model2.profile("p100").to_dict() == raw
    r = model2.profile("rtx2060")
    speed = gpus.get("rtx2060").relative_speed
    assert r.emulated and r.time(8) == emulated_time(8, EMU_BASE_S, EMU_PER_SAMPLE_S, speed)
    assert "allreduce not measured (1 rank); kept" in capsys.readouterr().out


@pytest.mark.parametrize("spec,msg", [
    ("digits_mlp", "must be MODULE:CALLABLE"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("examples.models:nope", "has no attribute 'nope'"),
    ("examples.models:digits_data", "it must return (model, loss_fn, sample_batch)"),
    ("examples.models:torch", "not a callable"),
    ("os:getcwd", "returned a str"),
])
def test_bad_model_callable_is_one_config_error(spec, msg):
    with pytest.raises(ConfigError) as e:
        load_model(spec)
    assert msg in one_line(e)


def test_cli_misuse_is_one_line_exit_2(tmp_path, capsys):
    for argv in (["--model", "examples.models:nope", "--gpu-type", "v100"],
                 ["--model", MODEL],                                        # CPU, no --gpu-type
                 ["--model", MODEL, "--gpu-type", "k80"],
                 ["--model", MODEL, "--gpu-type", "v100", "--b-list", "0,4"]):
        assert cli_main(["profile", *argv, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("hpc-jabas: error:") and "\n" not in err, err
    assert not (tmp_path / "x").exists()


def test_cli_module_stays_light():
    from hpc_jabas.cli import profile as cli_profile
    from hpc_jabas.runtime.profiling import defaults
    assert cli_profile.DEFAULT_B_LIST is defaults.DEFAULT_B_LIST is DEFAULT_B_LIST
    assert cli_profile.OPTIMIZERS is defaults.OPTIMIZERS
    code = "import sys, hpc_jabas.cli.profile; print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, env=mpi_env())
    assert p.stdout.strip() == "False", p.stderr       # `hpc-jabas plan` does not pay for torch


def test_fit_allreduce_reports_effective_bandwidth():
    truth = AllreduceModel(1.0, 0.001, 2e9)
    samples = [(nb, 3, truth.time(nb, 3)) for nb in (4096, 1 << 16, 1 << 20, 1 << 23)]
    fit = fit_allreduce(samples)
    assert fit.a == 1.0 and fit.c == pytest.approx(0.001) and fit.bandwidth == pytest.approx(2e9, rel=1e-6)


# -- under mpirun: the allreduce fit ------------------------------------------------------------

def test_profile_under_mpirun_fits_the_allreduce(tmp_path):
    out = tmp_path / "prof"
    exe = Path(sys.executable).parent / "hpc-jabas"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "hpc_jabas.cli"]
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", *cmd, "profile", "--model", MODEL,
           "--emulate", "--gpu-type", "v100", "--b-list", "1,8", "--warmup", "1", "--repeats", "3",
           "--allreduce-sizes", "4K,1M,16M", "--allreduce-repeats", "5", "--out", str(out)]
    p = subprocess.run(cmd, env=mpi_env(), cwd=str(ROOT), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "allreduce fitted from 4 sizes over 2 ranks" in p.stdout
    assert p.stdout.count("wrote ") == 1                      # rank 0 only
    meta = json.loads((out / ALLREDUCE_FILE).read_text())
    assert meta["version"] == FORMAT_VERSION
    model = PerfModel.load(out)
    ar = model.allreduce
    assert ar.a == 1.0 and ar.bandwidth != 10e9 and ar.c >= 0   # a fitted model, not the default
    assert 1e5 < ar.bandwidth < 1e12
    t_small, t_big = ar.time(4096, 2), ar.time(2 << 20, 2)
    assert 0 < t_small <= t_big < 5.0
    assert model.profile("v100").emulated and model.grad_bytes == MLP_PARAMS * 4


# -- the shared micro-batch step and the one loader ----------------------------------------------

class _Recorder:
    """Stands for the HeterogeneousOptimizer: the weighted backward only."""

    def __init__(self):
        self.counts = []

    def backward(self, loss, count):
        self.counts.append(count)
        (loss * float(count)).backward()


def test_micro_step_accumulates_a_detached_device_loss_and_weighted_grads():
    from hpc_jabas.runtime.step import default_forward, micro_step
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    fwd = default_forward(torch.nn.functional.cross_entropy)
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    opt = _Recorder()
    acc = None
    for lo, hi in ((0, 4), (4, 10)):
        acc = micro_step(model, fwd, opt, (x[lo:hi], y[lo:hi]), hi - lo, "cpu", acc)
    assert isinstance(acc, torch.Tensor) and not acc.requires_grad and acc.device.type == "cpu"
    assert opt.counts == [4, 6]
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    full = torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
    full.backward()                                   # the sum of per-sample losses, one batch
    assert float(acc) == pytest.approx(float(full.detach()), rel=1e-6)
    for g, p in zip(grads, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6)


def test_to_device_handles_containers_and_objects():
    from collections import namedtuple

    from hpc_jabas.runtime.step import to_device

    class Moved:
        def __init__(self):
            self.where = None

        def to(self, device):
            self.where = str(device)
            return self

    Pair = namedtuple("Pair", "x y")
    t = torch.ones(2)
    out = to_device({"a": (t, [t, 3]), "b": Pair(t, "label"), "c": Moved()}, torch.device("cpu"))
    assert isinstance(out["a"], tuple) and isinstance(out["a"][1], list) and out["a"][1][1] == 3
    assert isinstance(out["b"], Pair) and out["b"].y == "label" and torch.equal(out["b"].x, t)
    assert out["c"].where == "cpu"


def test_profiler_runner_runs_the_trainer_step():
    from hpc_jabas.runtime.profiling.timing import Runner
    bundle = load_model(MODEL)
    runner = Runner(bundle, torch.device("cpu"), "sgd")
    batch = runner.batch(8)
    loss = runner.micro(batch)
    assert not loss.requires_grad
    grads = [p.grad.clone() for p in runner.model.parameters()]
    runner.opt.zero_grad()
    (bundle.loss_fn(runner.model(batch[0]), batch[1]) * 8).backward()
    assert all(torch.allclose(g, p.grad) for g, p in zip(grads, runner.model.parameters()))
    with torch.no_grad():
        again = float(bundle.loss_fn(runner.model(batch[0]), batch[1]))
    assert float(loss) == pytest.approx(8 * again, rel=1e-6)
    runner.close()
    assert runner.opt.reducer is None            # one process: no reducer, no gradient hooks were installed


def test_one_loader_for_tasks_and_models():
    fn = load_callable("examples.train_digits:build", "task")
    from examples.train_digits import build
    assert fn is build
    with pytest.raises(ConfigError) as e:
        load_callable("examples.train_digits", "task")
    assert one_line(e).startswith("task 'examples.train_digits' must be MODULE:CALLABLE")
    with pytest.raises(ConfigError) as e:
        load_callable("examples.train_digits:nope", "task")
    assert "task 'examples.train_digits:nope': module 'examples.train_digits' has no attribute 'nope'" == one_line(e)


def test_a_batchnorm_model_that_cannot_train_on_one_sample_is_profiled_from_b2(tmp_path):
    """ResNet-18's last stage is 1 x 1 on 24-32 pixel images, where BatchNorm refuses a single sample: the
    profile skips b = 1 with a line saying why (and times the update after b = 2) instead of failing; a model
    without that limit keeps b = 1; a list of only b = 1 is refused in one line."""
    from hpc_jabas.runtime.profiling.load import ModelBundle
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                              torch.nn.Linear(4, 2))            # a 3 x 3 input -> 1 x 1 at the BatchNorm
    bundle = ModelBundle(net, torch.nn.CrossEntropyLoss(), (torch.randn(8, 3, 3, 3), torch.randint(0, 2, (8,))))
    said: list[str] = []
    m = measure_compute(bundle, [1, 2, 4], warmup=1, repeats=2, log=said.append)
    assert m.b == [2, 4] and len(m.t) == 2 and m.update_s > 0
    assert sum("skipping b=1" in s and "BatchNorm" in s for s in said) == 1, said
    wide = ModelBundle(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                           torch.nn.Linear(36, 2)), torch.nn.CrossEntropyLoss(), bundle.sample)
    assert measure_compute(wide, [1, 2], warmup=1, repeats=2).b == [1, 2]   # 3 x 3 values per channel at b=1
    with pytest.raises(ConfigError, match="cannot train on b=1"):
        measure_compute(bundle, [1], warmup=1, repeats=2)


def test_allreduce_note_says_when_no_bandwidth_was_measured(tmp_path):
    """Sizes that took no longer as they grew (a loaded host, Horovod's cycle time): the fit keeps only the
    constant, and the line says so instead of printing the unused default bandwidth as if it were measured."""
    from hpc_jabas.runtime.profiling.run import _write
    prof = PerfModel.emulated(["v100"]).profiles["v100"].to_dict()
    flat = [(4096, 2, 0.0050), (1 << 20, 2, 0.0049), (16 << 20, 2, 0.0048)]
    res = _write(str(tmp_path / "flat"), [prof], flat, 2, 68904, None)
    assert res.model.allreduce.a == 0.0 and res.model.allreduce.c == pytest.approx(0.0049)
    line = next(n for n in res.notes if n.startswith("allreduce fitted"))
    assert "no bandwidth measured" in line and "GB/s" not in line, line
    # 1 ms + 16 MiB ideal (2 (N-1)/N x 16 MiB over 2 ranks) at 2 GB/s: the line gives that bandwidth
    grows = [(n, 2, 0.001 + n / 2e9) for n in (4096, 1 << 20, 16 << 20)]
    res = _write(str(tmp_path / "grows"), [prof], grows, 2, 68904, None)
    line = next(n for n in res.notes if n.startswith("allreduce fitted"))
    assert res.model.allreduce.a == 1.0 and "2.000 GB/s effective" in line, line
