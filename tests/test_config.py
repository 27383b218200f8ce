"""Typed job configuration: TOML -> config -> flags round trip, generated flags and reference, one-line errors."""
from __future__ import annotations

import argparse
import copy
import importlib.util
import shlex
import tomllib

import pytest
from mpi_util import ROOT

from hpc_jabas.core.adaptive.policy import LR_RULES, POLICIES
from hpc_jabas.core.autoscale.scaler import OBJECTIVES
from hpc_jabas.core.config import cliargs as A
from hpc_jabas.core.config import sections as C
from hpc_jabas.core.config.schema import default_of
from hpc_jabas.core.perf.perfmodel import EMU_BASE_S, EMU_PER_SAMPLE_S
from hpc_jabas.core.planning.sampler import TAILS
from hpc_jabas.errors import ConfigError

TOML = """
epochs = 3
[train]
batch = 96
micro_batch = 8
gpu_types = ["v100", "p100", "rtx2060"]
speeds = [1.0, 0.5, 0.25]
emulate = true
slowdown = {2 = "factor=3,start=50"}
[adaptive]
policy = "similarity"
p = 7
batch_min = 32
batch_max = 512
lr_rule = "linear"
[autoscale]
objective = "time-under-budget"
budget = 12.5
allowed = ["a100", "v100"]
partition_types = {gpu = "v100"}
enabled = false
"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    A.add_arguments(ap)
    return ap


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


def flags_of(cfg: C.JobConfig) -> list[str]:
    """Command-line flags that reproduce every non-default value of cfg."""
    out: list[str] = []
    for section, f, _tp in C.all_fields():
        v = getattr(cfg.autoscale if section == "autoscale" else cfg, f.name)
        if v == default_of(f):
            continue
        flag = A.flag_of(section, f.name)
        if isinstance(v, bool):
            out.append(flag if v else flag.replace("--", "--no-", 1))
        elif isinstance(v, list):
            out += [flag, ",".join(map(str, v))]
        elif isinstance(v, dict):
            for k, x in v.items():
                out += [flag, f"{k}:{x}"]
        else:
            out += [flag, str(v)]
    return out


def test_toml_to_config_to_flags_round_trip(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(TOML)
    cfg = C.JobConfig.from_toml(path)
    assert (cfg.epochs, cfg.batch, cfg.micro_batch, cfg.p, cfg.policy) == (3, 96, 8, 7, "similarity")
    assert cfg.train.batch == 96 and cfg.adaptive.policy == "similarity"          # the sections
    assert cfg.speeds == [1.0, 0.5, 0.25] and cfg.slowdown == {2: "factor=3,start=50"}
    assert (cfg.B_min, cfg.B_max) == (32, 512)
    assert cfg.autoscale == C.AutoscaleConfig(objective="time-under-budget", budget=12.5, allowed=["a100", "v100"],
                                              partition_types={"gpu": "v100"}, enabled=False)
    # the same config from flags alone, and from to_dict
    argv = flags_of(cfg)
    assert A.from_args(parser().parse_args(argv)) == cfg, shlex.join(argv)
    assert C.JobConfig.from_dict(cfg.to_dict()) == cfg
    # flags override the file; --plan alone implies the fixed planner
    over = A.from_args(parser().parse_args(["--config", str(path), "--batch", "64", "--no-emulate",
                                            "--autoscale-budget", "3", "--plan", "b=8 n=4,2,2"]))
    assert (over.batch, over.emulate, over.autoscale.budget, over.planner) == (64, False, 3.0, "fixed")
    assert over.epochs == 3 and over.autoscale.objective == "time-under-budget"


def test_every_key_has_a_flag_with_help():
    ap = parser()
    actions = {a.dest: a for a in ap._actions}
    fields = C.all_fields()
    assert len(fields) == len(C.JobConfig.keys()) - 1 + len(C.AutoscaleConfig.keys())
    for section, f, _tp in fields:
        dest = f"autoscale_{f.name}" if section == "autoscale" else f.name
        a = actions[dest]
        assert A.flag_of(section, f.name) in a.option_strings
        assert a.default is None                      # unset flags do not override the TOML file
        assert a.help and f.metadata["help"] in a.help and "(default: " in a.help
        if f.metadata["choices"]:
            assert tuple(a.choices) == f.metadata["choices"]
    # every job key is a field of JobConfig that its section's view reads and writes
    cfg = C.JobConfig()
    for name, section in C.SECTION_OF.items():
        assert getattr(cfg, name) == getattr(getattr(cfg, section), name)
    cfg.p = 17
    assert cfg.adaptive.p == 17
    cfg.adaptive.p = 18
    assert cfg.p == 18


def test_choices_and_defaults_have_one_definition():
    f = {fl.name: fl for _s, fl, _t in C.all_fields()}
    assert f["policy"].metadata["choices"] == tuple(POLICIES)
    assert f["lr_rule"].metadata["choices"] == tuple(LR_RULES)
    assert f["tail"].metadata["choices"] == tuple(TAILS)
    assert f["objective"].metadata["choices"] == tuple(OBJECTIVES)
    cfg = C.JobConfig()
    assert (cfg.emulate_base_s, cfg.emulate_per_sample_s) == (EMU_BASE_S, EMU_PER_SAMPLE_S)
    from hpc_jabas.runtime import emulate
    e = emulate.Emulator("v100", log=lambda m: None)
    assert (e.base_s, e.per_sample_s) == (EMU_BASE_S, EMU_PER_SAMPLE_S)
    assert cfg.autoscale.restart_prior_s == C.RESTART_PRIOR_S
    # the implementation modules use the config's own definitions (core/config/defaults.py)
    from hpc_jabas.core.adaptive import policy
    from hpc_jabas.core.autoscale import scaler as autoscale
    from hpc_jabas.core.config import defaults
    from hpc_jabas.core.perf import perfmodel
    from hpc_jabas.core.planning import sampler
    assert (policy.POLICIES, policy.LR_RULES, policy.WD_RULES) == (defaults.POLICIES, defaults.LR_RULES,
                                                                   defaults.WD_RULES)
    assert policy.canonical_policy is defaults.canonical_policy and sampler.TAILS is defaults.TAILS
    assert (autoscale.OBJECTIVES, autoscale.RESTART_PRIOR_S) == (defaults.OBJECTIVES, defaults.RESTART_PRIOR_S)
    assert (perfmodel.EMU_BASE_S, perfmodel.EMU_PER_SAMPLE_S) == (defaults.EMU_BASE_S, defaults.EMU_PER_SAMPLE_S)
    assert (cfg.p, cfg.alpha, cfg.gamma) == (None, policy.DEFAULT_ALPHA, policy.DEFAULT_GAMMA)   # p: epoch/10


@pytest.mark.parametrize("d,needle", [
    ({"bacth": 64}, "unknown config key 'bacth' (did you mean 'batch'?); valid keys: epochs, batch,"),
    ({"train": {"polcy": "fixed"}}, "unknown config key 'polcy'"),
    ({"autoscale": {"objectiv": "time"}}, "unknown autoscale key 'objectiv'"),
    ({"epochs": 0}, "epochs=0 must be an integer >= 1"),
    ({"epochs": "3"}, "epochs='3' must be an integer >= 1"),
    ({"alpha": 1.5}, "alpha=1.5 must be in (0, 1)"),
    ({"policy": "greedy"}, f"policy='greedy' is unknown; valid: {', '.join(POLICIES)}"),
    ({"emulate": 1}, "emulate=1 must be true or false"),
    ({"speeds": [1, -1]}, "speeds[1]=-1 must be > 0"),
    ({"speeds": "1,x"}, "speeds='1,x' must be numbers separated by commas"),
    ({"gpu_types": ["v100", "k80"]}, "unknown GPU type 'k80'"),
    ({"slowdown": {"a": "factor=2"}}, "slowdown key 'a' must be a rank number"),
    ({"slowdown": {"1": "factor=2,start=x"}}, "slowdown 'factor=2,start=x': start='x' must be an integer"),
    ({"slowdown": {"1": "start=5"}}, "slowdown 'start=5' has no factor"),
    ({"planner": "fixed"}, "planner='fixed' needs plan="),
    ({"batch": 64, "batch_min": 128}, "batch_min=128 > batch_max=64"),
    ({"autoscale": {"margin": 1.0}}, "autoscale.margin=1.0 must be in [0, 1)"),
    ({"autoscale": {"min_gpus": 4, "max_gpus": 2}}, "autoscale.min_gpus=4 > autoscale.max_gpus=2"),
    ({"autoscale": {"objective": "cost-under-deadline"}}, "needs autoscale.deadline_s"),
    ({"autoscale": {"objective": "fastest"}}, "autoscale.objective='fastest' is unknown; valid: time, cost"),
    ({"autoscale": "cost"}, "autoscale='cost' must be a table"),
    ({"bucket_cap_mb": 0}, "bucket_cap_mb=0 must be"),
    ({"backend": "horovod", "bucket_cap_mb": 10}, "bucket_cap_mb=10 is the torch backend's DDP bucket size; on "
                                                   "backend='horovod' set HOROVOD_FUSION_THRESHOLD"),
])
def test_bad_config_is_one_line_naming_key_and_value(d, needle):
    with pytest.raises(ConfigError) as e:
        C.JobConfig.from_dict(d)
    assert needle in one_line(e)


def test_bad_flag_values_are_config_errors():
    for argv, needle in ((["--gpu-types", "v100,k80"], "'k80'"), (["--slowdown", "1factor=3"], "RANK:SPEC"),
                         (["--autoscale-partition-types", "gpu"], "PART:TYPE"), (["--batch", "0"], "batch=0")):
        with pytest.raises(ConfigError) as e:
            A.from_args(parser().parse_args(argv))
        assert needle in one_line(e), argv


def test_autoscale_config_alone():
    assert C.AutoscaleConfig.from_dict(None) == C.AutoscaleConfig()
    a = C.AutoscaleConfig.from_dict({"objective": "cost", "max-gpus": 3, "restart_prior_s": 0})
    assert (a.objective, a.max_gpus, a.restart_prior_s) == ("cost", 3, 0.0)
    assert isinstance(a.restart_prior_s, float)
    for bad, needle in (({"max_gpus": 0}, "autoscale.max_gpus=0 must be an integer >= 1"),
                        ({"budget": -1}, "autoscale.budget=-1 must be >= 0"),
                        ({"enabled": "yes"}, "autoscale.enabled='yes' must be true or false"),
                        ({"allowed": []}, "autoscale.allowed=[] must be a non-empty list")):
        with pytest.raises(ConfigError) as e:
            C.AutoscaleConfig.from_dict(bad)
        assert needle in one_line(e)


def test_repo_configs_still_load():
    raw = tomllib.loads((ROOT / "slurm" / "digits.toml").read_text())
    raw.pop("job")
    cfg = C.JobConfig.from_dict(raw)
    assert (cfg.epochs, cfg.batch, cfg.policy, cfg.p, cfg.emulate) == (2, 128, "similarity", 4, True)
    assert (cfg.autoscale.objective, cfg.autoscale.max_gpus, cfg.autoscale.restart_prior_s) == ("cost", 4, 20.0)
    # the flat constructor the benchmarks and workers use, then attribute writes, then validate
    cfg = C.JobConfig(planner="fixed", plan="b=4 n=1,1", batch=1)
    cfg.batch, cfg.batch_min, cfg.batch_max = 8, 1, 10**9
    assert cfg.validate().adaptive.batch_max == 10**9


def _gen_table():
    spec = importlib.util.spec_from_file_location("gen_config_table", ROOT / "scripts" / "gen_config_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_reference_is_the_generated_one():
    gen = _gen_table()
    text = (ROOT / "docs/config.md").read_text()
    assert gen.TARGET == ROOT / "docs/config.md" and gen.README_START in text and gen.README_END in text
    assert gen.replace_reference(text) == text, (
        "docs/config.md's configuration table is stale; regenerate it with: "
        ".venv/bin/python scripts/gen_config_table.py")
    table = text.split(gen.README_START)[1].split(gen.README_END)[0]
    assert table == "\n" + gen.config_reference()
    assert table.count("\n| `[") == len(C.all_fields())


def test_reference_notices_a_change(tmp_path, capsys):
    gen = _gen_table()
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{gen.README_START}\n| old |\n{gen.README_END}\nrest\n")
    assert gen.main([str(readme), "--check"]) == 1
    assert gen.main([str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("rest\n") and "| old |" not in text
    assert "| `[adaptive]` | `p` | int &#124; None | epoch/10 |" in text
    assert gen.main([str(readme), "--check"]) == 0
    with pytest.raises(ConfigError):
        gen.replace_reference("no markers")
    (tmp_path / "plain.txt").write_text("no markers\n")
    assert gen.main([str(tmp_path / "plain.txt")]) == 2
    assert "gen_config_table: error: README has no" in capsys.readouterr().err


def test_policy_aliases_are_canonical_when_assigned_and_validate_changes_nothing():
    cfg = C.JobConfig(policy="goodput", speeds="1,0.5", batch=64)
    assert cfg.policy == cfg.adaptive.policy == "noise-scale" and cfg.speeds == [1.0, 0.5]
    cfg.policy = " SimiGrad "
    assert cfg.adaptive.policy == "similarity"
    cfg.adaptive.policy = "batch-warmup"
    assert cfg.policy == "ramp"
    assert C.JobConfig(policy="pollux").adaptive.policy == "noise-scale"
    assert C.JobConfig.from_dict({"policy": "jabas"}).policy == "similarity"
    cfg.autoscale.restart_prior_s = 5
    assert isinstance(cfg.autoscale.restart_prior_s, float)
    before = copy.deepcopy(cfg)
    assert cfg.validate() is cfg and cfg == before and cfg.to_dict() == before.to_dict()
    # an invalid value is kept as given, and validate names it
    cfg.policy = "greedy"
    cfg.batch = "64"
    assert (cfg.policy, cfg.batch) == ("greedy", "64")
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    assert one_line(e) == "batch='64' must be an integer >= 1"
    cfg.batch = 64
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    assert one_line(e) == f"policy='greedy' is unknown; valid: {', '.join(POLICIES)}"
    assert cfg.policy == "greedy"


def test_add_arguments_leaves_the_users_parser_alone_and_ArgumentParser_gives_one_line(capsys):
    import argparse
    plain = argparse.ArgumentParser(prog="mine")
    before = plain.error
    group = A.add_arguments(plain)
    assert plain.error == before and group.title == "hpc-jabas"          # not patched; the group is returned
    with pytest.raises(SystemExit) as e:
        plain.parse_args(["--batch", "x"])
    assert e.value.code == 2 and "usage: mine" in capsys.readouterr().err  # argparse's own behaviour, kept
    ours = A.ArgumentParser(prog="mine")
    A.add_arguments(ours)
    with pytest.raises(SystemExit) as e:
        ours.parse_args(["--batch", "x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("hpc-jabas: error: argument --batch")
