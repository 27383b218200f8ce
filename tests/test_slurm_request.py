"""JobSpec's Slurm options are a typed field (``JobSpec.slurm``, a SlurmRequest), not an untyped dict: the older
``extra={...}`` keyword and a JSON spec written with an ``extra`` table read into it, an unknown option is one
line, and the spec's JSON and pickle round trips keep it (no Slurm needed)."""
from __future__ import annotations

import dataclasses
import pickle

import pytest

from hpc_jabas import JobSpec, SlurmRequest
from hpc_jabas.core.config.sections import section_fields
from hpc_jabas.errors import ConfigError
from hpc_jabas.slurm.components import SlurmOptions


def _spec(tmp_path, **kw) -> JobSpec:
    return JobSpec(task="m:build", config={"slurm": {"time_min": 30}}, chain_dir=str(tmp_path), mix={"v100": 1},
                   **kw)


def test_extra_reads_into_the_typed_field_and_round_trips(tmp_path):
    old = _spec(tmp_path, extra={"account": "proj-1", "max_failures": "5", "sbatch_args": ["--exclusive"]})
    new = _spec(tmp_path, slurm=SlurmRequest(account="proj-1", max_failures="5", sbatch_args=["--exclusive"]))
    assert old == new and old.slurm.account == "proj-1" and old.slurm.qos is None
    assert SlurmOptions.of(new) == SlurmOptions(30, 60, 3, 5, 512, "hpc-jabas", "proj-1", None, ("--exclusive",))
    f = new.save(tmp_path / "jobs" / "1.json")
    assert JobSpec.load(f) == new and pickle.loads(pickle.dumps(new)) == new
    # a spec written before the field existed (its options in an "extra" table) reads the same
    d = {k: v for k, v in new.to_dict().items() if k != "slurm"}
    assert JobSpec.from_dict({**d, "extra": {"account": "proj-1", "max_failures": "5",
                                             "sbatch_args": ["--exclusive"]}}) == new
    # replace() on the field, and extra= over what the field holds
    assert dataclasses.replace(new, slurm=dataclasses.replace(new.slurm, qos="low")).slurm.qos == "low"
    assert _spec(tmp_path, slurm={"qos": "low"}, extra={"qos": "high"}).slurm == SlurmRequest(qos="high")


def test_an_unknown_option_is_one_line_and_every_slurm_key_is_a_field(tmp_path):
    with pytest.raises(ConfigError) as e:
        _spec(tmp_path, extra={"acount": "proj-1"})
    assert str(e.value).startswith("unknown Slurm option 'acount'; valid: time_min, signal_lead_s") \
        and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="^extra=5 must be a table of Slurm option -> value"):
        _spec(tmp_path, extra=5)
    names = {f.name for f in dataclasses.fields(SlurmRequest)}
    assert {f.name for f in section_fields("slurm")} <= names
    assert names - {f.name for f in dataclasses.fields(SlurmOptions)} == set()
