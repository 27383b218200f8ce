"""One spelling per config key: every job key is declared once, as a field of JobConfig with its section as
metadata; the sections (TOML tables, --help groups, ``cfg.train`` views, the reference) all come from that
metadata; a TOML file, the checkpoint's JSON form and the flags round-trip a config unchanged (hypothesis)."""
from __future__ import annotations

import ast
import copy
import dataclasses
import json
import math
import tempfile
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpi_util import ROOT

import hpc_jabas as hj
from hpc_jabas.core.config import cliargs as A
from hpc_jabas.core.config import gpus
from hpc_jabas.core.config import sections as C
from hpc_jabas.core.config.schema import default_of, key_fields, split_optional
from hpc_jabas.errors import ConfigError

SECTIONS_PY = ROOT / "hpc_jabas" / "core" / "config" / "sections.py"


def _declared(cls_name: str) -> list[str]:
    """The names a class body of sections.py declares with an annotation, in order, repeats kept."""
    tree = ast.parse(SECTIONS_PY.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name).body
    return [n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def test_each_key_is_declared_once_with_its_section():
    declared = _declared("JobConfig")
    assert len(declared) == len(set(declared)), sorted({n for n in declared if declared.count(n) > 1})
    keys = [f.name for f in key_fields(C.JobConfig)]
    assert declared == [*keys, "autoscale"]                   # every declaration is a key, autoscale last
    # the fields are the union of the sections' keys, each in exactly one section
    by_section = {s: [k for k in keys if C.SECTION_OF[k] == s] for s in C.SECTIONS}
    union = [k for ks in by_section.values() for k in ks]
    assert sorted(union) == sorted(keys) and len(union) == len(set(union))
    assert set(C.SECTIONS) == {"train", "planning", "emulation", "adaptive", "balancing", "output", "slurm"}
    for f in key_fields(C.JobConfig):
        assert f.metadata["section"] in C.SECTIONS, f.name
    # a section's keys are declared together, so the reference and --help list them as the TOML groups them
    order = [C.SECTION_OF[k] for k in keys]
    assert [s for i, s in enumerate(order) if i == 0 or order[i - 1] != s] == list(C.SECTIONS)
    assert not set(keys) & {*C.SECTIONS, "autoscale"}          # no key is also a section's name
    # the autoscale table's keys: declared once in their own class
    auto = _declared("AutoscaleConfig")
    assert auto == C.AutoscaleConfig.keys() and len(auto) == len(set(auto))


def test_no_second_spelling_in_the_class():
    """No generated alias per key: a key's class attribute is the dataclass's default (none for a list or a
    table), never a descriptor, a method or a property that would stand for it."""
    for f in key_fields(C.JobConfig):
        attr = vars(C.JobConfig).get(f.name, dataclasses.MISSING)
        assert not hasattr(type(attr), "__get__"), f.name
        assert attr is (f.default if f.default_factory is dataclasses.MISSING else dataclasses.MISSING), f.name
    core = ROOT / "hpc_jabas" / "core"
    hits = [str(p) for p in core.rglob("*.py") if "_Flat" in p.read_text()]
    assert hits == []
    # the views are one per section: named after it, and listing its keys in order
    views = {n for n, v in vars(C.JobConfig).items() if type(v).__name__ == "SectionOf"}
    assert views == set(C.SECTIONS)
    cfg = C.JobConfig()
    for s in C.SECTIONS:
        assert getattr(cfg, s).keys() == [k for k, t in C.SECTION_OF.items() if t == s]
        assert [f.name for f in C.section_fields(s)] == getattr(cfg, s).keys()


def test_section_views_read_and_write_the_one_value():
    cfg = hj.JobConfig(batch=64, policy="goodput")
    assert cfg.train.batch == 64 and cfg.adaptive.policy == "noise-scale"       # normalised once, read twice
    cfg.planning.speeds, cfg.adaptive.policy, cfg.train.batch = "1,0.5", "JABAS", 128   # normalised when assigned
    assert (cfg.speeds, cfg.policy, cfg.batch) == ([1.0, 0.5], "similarity", 128)
    assert repr(cfg.slurm).startswith("[slurm] time_min=60, signal_lead_s=60")
    assert "batch" in dir(cfg.train)
    with pytest.raises(AttributeError, match=r"^\[train\] has no key 'policy'; its keys: epochs, batch"):
        _ = cfg.train.policy                                                   # a key of another section
    with pytest.raises(AttributeError, match=r"\[adaptive\] has no key 'polcy'"):
        cfg.adaptive.polcy = "ramp"
    with pytest.raises(AttributeError, match="train is a view"):
        cfg.train = {"batch": 1}
    frozen = cfg.frozen()
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.train.batch = 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.autoscale.max_gpus = 8
    assert frozen == cfg and copy.deepcopy(frozen).train.batch == 128
    changed = frozen.replace(batch=256)
    changed.train.epochs = 3
    assert (changed.batch, changed.epochs, frozen.batch, frozen.epochs) == (256, 3, 128, 1)


def test_the_constructor_takes_the_keys_and_names_an_unknown_one():
    with pytest.raises(ConfigError) as e:
        hj.JobConfig(bacth=64)
    assert str(e.value).startswith("unknown config key 'bacth' (did you mean 'batch'?); valid keys: epochs, batch")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="unknown autoscale key 'max_gpu'"):
        hj.JobConfig(autoscale={"max_gpu": 2})
    cfg = hj.JobConfig(autoscale={"max-gpus": 3}, seed=4)
    assert cfg.autoscale == C.AutoscaleConfig(max_gpus=3) and cfg.seed == 4
    assert hj.JobConfig(autoscale=None).autoscale == C.AutoscaleConfig()
    assert C.JobConfig.keys() == [*C.SECTION_OF, "autoscale"]


def test_help_groups_the_flags_by_section():
    ap = A.ArgumentParser(prog="p")
    A.add_arguments(ap)
    groups = {g.title: [a.dest for a in g._group_actions] for g in ap._action_groups}
    for s in C.SECTIONS:
        assert groups[f"hpc-jabas [{s}]"] == [k for k, t in C.SECTION_OF.items() if t == s]
    assert groups["hpc-jabas [autoscale]"] == [f"autoscale_{k}" for k in C.AutoscaleConfig.keys()]
    assert [t for t in groups if t.startswith("hpc-jabas [")] == [f"hpc-jabas [{s}]" for s in
                                                                  (*C.SECTIONS, "autoscale")]


# ---- round trips ------------------------------------------------------------------------------------

def _toml_value(v: typing.Any) -> str:
    """A TOML value (an independent writer: the package reads TOML, it writes none)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)                        # a JSON string is a TOML basic string for these texts
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def toml_of(cfg: C.JobConfig) -> str:
    """The TOML a user writes for ``cfg``: its non-default keys in their sections' tables, then [autoscale]."""
    lines: list[str] = []
    for s in (*C.SECTIONS, "autoscale"):
        fields = key_fields(C.AutoscaleConfig) if s == "autoscale" else C.section_fields(s)
        obj = cfg.autoscale if s == "autoscale" else cfg
        rows = [f"{f.name} = {_toml_value(getattr(obj, f.name))}" for f in fields
                if getattr(obj, f.name) is not None and getattr(obj, f.name) != default_of(f)]
        if rows:
            lines += [f"[{s}]", *rows, ""]
    return "\n".join(lines)


def _strategy(f: dataclasses.Field, tp: typing.Any) -> st.SearchStrategy:
    """Valid values of one key, from its type and metadata."""
    m = f.metadata
    base, _ = split_optional(tp)
    origin, args = typing.get_origin(base), typing.get_args(base)
    special = {"gpu_types": st.lists(st.sampled_from(sorted(gpus.known())), min_size=1, max_size=3),
               "allowed": st.lists(st.sampled_from(["a100", "v100", "gpu"]), min_size=1, max_size=3),
               "slowdown": st.dictionaries(st.integers(0, 7), st.builds(
                   lambda fa, s0: f"factor={fa},start={s0}", st.sampled_from([1.5, 2, 3]), st.integers(0, 99)),
                   max_size=2),
               "partition_types": st.dictionaries(st.sampled_from(["gpu", "big"]), st.sampled_from(["v100", "p100"]),
                                                  min_size=1, max_size=2),
               "objective": st.sampled_from(["time", "cost"]), "plan": st.none(),
               "planner": st.sampled_from(["optimal", "lbbsp"]),
               "static_graph": st.just(False), "broadcast_buffers": st.just(False)}
    if f.name in special:
        return special[f.name]
    if m["choices"]:
        return st.sampled_from(list(m["choices"]))

    def scalar(t: typing.Any) -> st.SearchStrategy:
        if t is bool:
            return st.booleans()
        if t is int:
            lo = 0 if m["lo"] is None else math.ceil(m["lo"]) + (1 if m["lo_open"] else 0)
            return st.integers(lo, lo + 10_000)
        if t is float:
            lo, hi = (0.0 if m["lo"] is None else m["lo"]), (1e6 if m["hi"] is None else m["hi"])
            return st.floats(lo, hi, exclude_min=m["lo_open"], exclude_max=m["hi_open"], allow_nan=False,
                             allow_infinity=False)
        return st.text("abcdefghij_/.", min_size=1, max_size=12)      # no leading dash: a flag's value
    if origin is list:
        return st.lists(scalar(args[0]), min_size=1, max_size=4)
    return scalar(base)


def _valid(d: dict) -> dict:
    """``d`` with the cross-key rules of JobConfig.validate met (the per-key ones the strategies meet)."""
    lo, mid, hi = sorted((d.pop("batch_min", 1), d.pop("batch", 256), d.pop("batch_max", 10_000)))
    d.update(batch_min=lo, batch=mid, batch_max=hi)
    d.pop("batch_per_rank", None)
    if d.get("backend") == "horovod":
        d.pop("bucket_cap_mb", None)
        d.pop("find_unused_parameters", None)
    if d.get("identical_micro_batch") == "false":
        d.pop("micro_batch", None)
    if d.get("policy") not in ("similarity", "noise-scale"):
        d.pop("batch_start", None)
    a = d["autoscale"]
    a["min_gpus"], a["max_gpus"] = sorted((a.pop("min_gpus", 1), a.pop("max_gpus", 8)))
    return d


@st.composite
def configs(draw: st.DrawFn) -> C.JobConfig:
    """A valid JobConfig whose keys are each set (or left at the default) at random."""
    d: dict = {"autoscale": {}}
    for s, f, tp in C.all_fields():
        if draw(st.booleans()):
            (d["autoscale"] if s == "autoscale" else d)[f.name] = draw(_strategy(f, tp))
    return C.JobConfig.from_dict(_valid(d))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_toml_json_and_flags_round_trip_a_config_unchanged(cfg):
    text = toml_of(cfg)
    path = Path(tempfile.mkdtemp(prefix="hj-keys-")) / "job.toml"
    path.write_text(text)
    back = C.JobConfig.from_toml(path)
    assert back == cfg and toml_of(back) == text                          # TOML: the same config, the same text
    # the same keys at top level (a table's name only groups them) read the same
    flat = "\n".join(ln for ln in text.splitlines() if not ln.startswith("[") or ln == "[autoscale]")
    top, _, auto = flat.partition("[autoscale]")
    path.write_text(top + ("[autoscale]" + auto if auto else ""))
    assert C.JobConfig.from_toml(path) == cfg
    # the checkpoint's and the job spec's JSON form
    assert C.JobConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    # the flags (--KEY, --autoscale-KEY) give the same config
    ap = A.ArgumentParser(prog="p")
    A.add_arguments(ap)
    assert A.from_args(ap.parse_args(_flags_of(cfg))) == cfg
    path.unlink()
    path.parent.rmdir()


def _flags_of(cfg: C.JobConfig) -> list[str]:
    out: list[str] = []
    for s, f, _tp in C.all_fields():
        v = getattr(cfg.autoscale if s == "autoscale" else cfg, f.name)
        if v is None or v == default_of(f):
            continue
        flag = A.flag_of(s, f.name)
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + flag[2:])
        elif isinstance(v, list):
            out.append(f"{flag}={','.join(map(str, v))}")     # --KEY=VALUE: argparse takes -1e-05 for a flag
        elif isinstance(v, dict):
            out += [f"{flag}={k}:{x}" for k, x in v.items()]
        else:
            out.append(f"{flag}={v}")
    return out


def test_a_section_name_given_a_value_is_one_line():
    for d, needle in (({"train": 5}, "train=5 must be a table of keys ([train] is a section, e.g. [train] epochs"),
                      ({"slurm": [{"time_min": 5}]}, "[[slurm]] is an array of 1 table(s) where one [slurm] table "
                                                     "belongs; write its keys under a single [slurm] header (e.g. "
                                                     "[slurm] time_min = ...)")):
        with pytest.raises(ConfigError) as e:
            C.JobConfig.from_dict(d)
        assert str(e.value).startswith(needle) and "\n" not in str(e.value)
