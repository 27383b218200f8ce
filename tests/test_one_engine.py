"""One planner object, one config engine, typed safe points (issue 35): the parts' contracts, each checked against
something the code under test does not compute itself."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from hpc_jabas.core.autoscale import scaler as autoscale
from hpc_jabas.core.config import defaults
from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.core.perf.perfmodel import PerfModel
from hpc_jabas.core.planning import PlanSpec, job_batch_space, make_planner, plan_batch
from hpc_jabas.core.sim.simconfig import job_from_dict
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime import safepoint as sp

GPUS = ["v100", "p100", "rtx2060"]
MODEL = PerfModel.emulated(sorted(set(GPUS)), [1, 2, 4, 8, 16, 32, 64, 128], 0.002, 0.0002)


# ---- one planner object ---------------------------------------------------------------------------------------

def test_the_spec_is_read_once_and_every_planner_of_it_plans_alike():
    cfg = JobConfig(batch=96, batch_min=48, batch_max=192, micro_batch=8).validate()
    spec = PlanSpec.from_config(cfg)
    assert (spec.kind, spec.micro_batch, spec.identical, spec.speeds) == ("optimal", 8, "auto", None)
    assert PlanSpec.from_config(spec) is spec and hash(spec) == hash(PlanSpec.from_config(cfg))
    planner = make_planner(spec, GPUS, MODEL)
    # the exact planner itself is the reference: b pinned to 8 on every rank
    assert planner.plan(96) == plan_batch(96, GPUS, MODEL, b_candidates=[8])
    # the controller's batch space is the planner's own: every B in it is planned exactly, at its time
    space = planner.batch_space(cfg.B_min, cfg.B_max)
    Bs = [B for B in range(48, 193) if space.is_realisable(B)]
    assert Bs and all(B % 8 == 0 for B in Bs)
    for B in Bs[:5]:
        assert space.iter_time(B) == pytest.approx(MODEL.iteration_time(plan_batch(B, GPUS, MODEL, b_candidates=[8]),
                                                                        GPUS))
    assert space.table() == job_batch_space(cfg, GPUS, MODEL).table()


def test_the_kind_is_chosen_in_one_place_and_a_bad_kind_is_one_line():
    with pytest.raises(ConfigError) as e:
        PlanSpec(kind="greedy")
    assert "greedy" in str(e.value) and "optimal" in str(e.value) and "\n" not in str(e.value)
    fixed = PlanSpec(kind="fixed", plan="b=4 n=1,2,3")
    assert not fixed.changes_B and PlanSpec().changes_B and PlanSpec().every_rank_runs
    assert not PlanSpec(kind="lbbsp").every_rank_runs
    p = make_planner(fixed, GPUS, MODEL)
    assert p.plan(999).n == (1, 2, 3) and p.plan(24).B == 24
    with pytest.raises(ConfigError, match="cannot change the batch size"):
        p.batch_space(8, 64)


def test_the_auto_scaler_prices_with_the_jobs_spec_as_with_its_old_keywords():
    types = {"a": "v100", "b": "p100"}
    fc, period, N = [40.0, 56.0, 72.0], 5, 1200
    for spec, old in ((PlanSpec(micro_batch=8), {"cands": [8]}),
                      (PlanSpec(kind="lbbsp", micro_batch=4, speeds=(1.0, 0.5)),
                       {"cands": [4], "planner": "lbbsp", "speeds": [1.0, 0.5]})):
        new_fn = autoscale.epoch_time_fn(MODEL, types, fc, period, N, B_min=16, B_max=128, spec=spec)
        old_fn = autoscale.epoch_time_fn(MODEL, types, fc, period, N, old.pop("cands"), B_min=16, B_max=128, **old)
        for mix in ({"a": 1, "b": 1}, {"a": 2}, {"b": 2}):
            assert new_fn(mix) == old_fn(mix) and new_fn(mix) > 0


# ---- one config engine ----------------------------------------------------------------------------------------

def _job(**tables):
    return job_from_dict({"samples": 1000, "epochs": 2, "batch": 64, "batch_min": 32, "batch_max": 256,
                          "gradstats": {"curve": "mccandlish"}, **tables}, "job file 'j.toml'")


def test_the_job_files_policy_and_autoscale_defaults_are_the_trainers():
    j = _job()
    assert (j.policy.gamma, j.policy.alpha) == (defaults.DEFAULT_GAMMA, defaults.DEFAULT_ALPHA)
    assert tuple(j.policy.ramp_at) == defaults.DEFAULT_RAMP_AT and j.policy.ramp_factor == defaults.DEFAULT_RAMP_FACTOR
    assert j.autoscale.margin == defaults.DEFAULT_MARGIN and j.autoscale.restart_prior_s == defaults.RESTART_PRIOR_S
    assert _job(policy={"gamma": 0.3}).policy.gamma == 0.3


@pytest.mark.parametrize("tables, text", [
    ({"policy": {"gamma": 2.0}}, "[policy]: gamma=2.0 must be in (-1, 1)"),
    ({"policy": {"alpha": "big"}}, "[policy]: alpha='big' must be a finite number"),
    ({"policy": {"gama": 0.2}}, "unknown key(s) gama (did you mean 'gamma'?)"),
    ({"autoscale": {"margin": 1.5}}, "[autoscale]: margin=1.5 must be in [0, 1)"),
    ({"autoscale": {"max_gpus": 0}}, "[autoscale]: max_gpus=0 must be an integer >= 1"),
    ({"model": {"bandwidth_gbs": 0}}, "[model]: bandwidth_gbs=0 must be > 0"),
    ({"epochs": 1.5}, "epochs=1.5 must be an integer >= 1"),
])
def test_every_table_of_the_job_file_is_checked_in_one_line(tables, text):
    with pytest.raises(ConfigError) as e:
        _job(**tables)
    assert text in str(e.value) and str(e.value).startswith("job file 'j.toml'") and "\n" not in str(e.value)


def test_the_slurm_options_are_typed_and_the_submit_flags_come_from_the_fields(tmp_path: Path):
    from hpc_jabas.cli import submit
    from hpc_jabas.slurm.components import SlurmOptions
    spec = JobSpec(task="m:build", config={"slurm": {"time_min": 30}}, chain_dir=str(tmp_path), mix={"v100": 1},
                   extra={"account": "proj-1", "sbatch_args": "--exclusive", "max_timeouts": "4"})
    o = SlurmOptions.of(spec)
    assert (o.time_min, o.max_timeouts, o.account, o.qos, o.sbatch_args) == (30, 4, "proj-1", None, ("--exclusive",))
    p = argparse.ArgumentParser()
    submit.add_parser(p.add_subparsers())
    args = p.parse_args(["submit", "j.toml", "--max-failures", "5", "--time-min", "90"])
    assert submit._slurm_extra(args) == {"time_min": 90, "max_failures": 5}
    with pytest.raises(ConfigError, match="^--signal-lead-s 0 must be >= 1$"):
        submit._slurm_extra(p.parse_args(["submit", "j.toml", "--signal-lead-s", "0"]))


# ---- the safe point writes nothing into the trainer -------------------------------------------------------------

class _Host:
    """One rank's side of a safe point; no stop_reason attribute to write into."""

    def __init__(self):
        self.safe_points = sp.SafePoints(mode="blocking", allreduce=lambda t, name: t)
        self.iteration, self.rank, self.world, self.stop_requested, self.nonfinite_loss = 7, 0, 1, True, False
        self.plan = type("P", (), {"B": 4})()
        self.sampler = type("S", (), {"epoch": 2, "epoch_done": lambda self, B: False})()
        self.metrics = type("M", (), {"write": lambda self, r: None})()
        self.saved: list[int] = []

    def save_checkpoint(self):
        self.saved.append(self.iteration)
        return "ckpt-7"


def test_a_stop_comes_back_as_the_reason_and_nothing_is_written_into_the_trainer():
    h = _Host()
    before = set(vars(h))
    reason = sp.boundary(h, sp.PeriodicCheckpoint(every=None, minutes=None))
    assert reason is not None and reason["signal"] == "request" and reason["iteration"] == 7
    assert reason["epoch"] == 2 and reason["checkpoint"] == "ckpt-7" and h.saved == [7]
    assert set(vars(h)) == before                      # no attribute added (stop_reason is the caller's to keep)
    h.stop_requested = False
    assert sp.boundary(h, sp.PeriodicCheckpoint(every=None, minutes=None)) is None and h.saved == [7]
    assert torch.equal(sp.local_vector(0, True, False, 0), torch.tensor([0, 0, 0, 1, 0, 0, 1, 0], dtype=torch.float64))
