"""Issue 36, finding 1: an adaptive policy named alone (``--policy X``, no batch_min/batch_max) gets a range it
can move in, says the range and its rule (the start record, one log line), and moves B; a policy that cannot
move measures nothing; the policy's aliases (goodput, pollux) are read wherever the policy is named."""
from __future__ import annotations

import json

import pytest
import torch

import hpc_jabas as hj
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.trainer import Trainer

N, B = 640, 32          # 20 iterations an epoch at B: p = 2


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return torch.utils.data.TensorDataset(x, y)


def _fit(argv: list[str], run_dir, caplog=None) -> tuple[Trainer, list[dict]]:
    parser = hj.ArgumentParser()
    hj.add_arguments(parser)
    cfg = hj.config_from_args(parser.parse_args([*argv, "--batch", str(B), "--epochs", "2", "--no-checkpoint",
                                                 "--run-dir", str(run_dir)]))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(), torch.nn.CrossEntropyLoss(),
                 config=cfg, world=World(rank=0, size=1, gpu_types=("v100",)))
    tr.fit()
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return tr, recs


@pytest.mark.parametrize("name", ["similarity", "goodput", "pollux", "ramp"])
def test_a_policy_named_alone_moves_B(name, tmp_path, capfd):
    tr, recs = _fit(["--policy", name], tmp_path / "run")
    start = next(r for r in recs if r["type"] == "start")
    rng = start["batch_range"]
    assert (rng["batch_min"], rng["batch_max"]) == (1, N)          # the smallest micro-batch .. one epoch
    assert start["config"]["batch_min"] == 1 and start["config"]["batch_max"] == rng["batch_max"]
    said = [ln for ln in capfd.readouterr().err.splitlines() if "moves B in" in ln]
    assert len(said) == 1 and "batch_max" in said[0] and "one epoch" in said[0]
    Bs = {h["B"] for h in tr.history}
    assert len(Bs) > 1, f"{name}: B never moved ({Bs})"
    moved = [r for r in recs if r["type"] == "decision" and r["B"] != B]
    assert moved and "could not" not in moved[0]["reason"]


def test_a_policy_that_cannot_move_measures_nothing_and_says_so(tmp_path, capfd):
    tr, recs = _fit(["--policy", "similarity", "--batch-min", str(B), "--batch-max", str(B)], tmp_path / "run")
    its = [r for r in recs if r["type"] == "iteration"]
    assert len(its) == 40 and not any(r.get("measure") or "stats" in r for r in its)
    assert not [r for r in recs if r["type"] == "decision"]
    assert "cannot move B" in capfd.readouterr().err


def test_p_that_rounds_to_one_is_warned(tmp_path, capfd):
    parser = hj.ArgumentParser()
    hj.add_arguments(parser)
    cfg = hj.config_from_args(parser.parse_args(["--policy", "gns", "--batch", "128", "--run-dir",
                                                 str(tmp_path / "run"), "--no-checkpoint"]))
    model = torch.nn.Linear(8, 2)
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(), torch.nn.CrossEntropyLoss(),
                 config=cfg, world=World(rank=0, size=1, gpu_types=("v100",)))
    tr.controller.attach(tr)
    assert tr.controller.p == 1
    err = capfd.readouterr().err
    assert "p=1" in err and "5 iterations" in err, err


def test_the_range_rule_keeps_what_is_set_and_fixed_gets_none():
    from hpc_jabas.core.adaptive.policy import default_batch_range
    assert default_batch_range("fixed", 64, None, None, samples_per_epoch=1000, min_micro_batch=8) is None
    assert default_batch_range("similarity", 64, 8, 128, samples_per_epoch=1000, min_micro_batch=8) is None
    r = default_batch_range("jabas", 64, None, None, samples_per_epoch=1000, min_micro_batch=8)
    assert (r.lo, r.hi) == (8, 1000)
    r = default_batch_range("ramp", 64, 48, None, samples_per_epoch=500, min_micro_batch=1)
    assert (r.lo, r.hi) == (48, 500) and "batch_min=48 (set)" in r.rule
    r = default_batch_range("goodput", 4096, None, None, samples_per_epoch=1000, min_micro_batch=16)
    assert (r.lo, r.hi) == (16, 4096)          # never above or below the batch given


def test_every_mix_gets_the_same_range(tmp_path):
    """The range depends on the data and the model, not on the ranks: a chain's jobs on other mixes keep it."""
    ranges = []
    for types in (("v100",), ("rtx2060",), ("a100", "v100", "p100")):
        model = torch.nn.Linear(8, 2)
        tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(), torch.nn.CrossEntropyLoss(),
                     config=hj.JobConfig(policy="similarity", batch=B, run_dir=str(tmp_path / "r")),
                     world=World(rank=0, size=len(types), gpu_types=types))
        ranges.append((tr.cfg.batch_min, tr.cfg.batch_max))
    assert ranges == [(1, N)] * 3


@pytest.mark.parametrize("alias,canon", [("goodput", "noise-scale"), ("pollux", "noise-scale"),
                                         ("JABAS", "similarity"), ("batch-warmup", "ramp")])
def test_the_aliases_are_read_by_the_flags_and_toml(alias, canon, tmp_path):
    parser = hj.ArgumentParser()
    hj.add_arguments(parser)
    assert parser.parse_args(["--policy", alias]).policy == canon
    toml = tmp_path / "j.toml"
    toml.write_text(f'policy = "{alias}"\n')
    assert hj.JobConfig.from_toml(toml).policy == canon


def test_the_simulator_prices_the_range_the_trainer_runs(tmp_path):
    from hpc_jabas.core.sim import simconfig
    model = torch.nn.Linear(8, 2)
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(), torch.nn.CrossEntropyLoss(),
                 config=hj.JobConfig(policy="noise-scale", batch=B, micro_batch=4, run_dir=str(tmp_path / "r")),
                 world=World(rank=0, size=1, gpu_types=("v100",)))
    job = simconfig.job_from_dict({"samples": N, "batch": B, "micro_batch": 4})
    assert (job.batch_min, job.batch_max) == (tr.cfg.batch_min, tr.cfg.batch_max) == (4, N)
    kept = simconfig.job_from_dict({"samples": N, "batch": B, "batch_min": B, "batch_max": B})
    assert (kept.batch_min, kept.batch_max) == (B, B)
