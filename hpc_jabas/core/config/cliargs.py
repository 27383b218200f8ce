"""The command line of a training script: :class:`ArgumentParser` (one-line errors), :func:`add_arguments` (one
flag per config key, generated from the fields in core/config/sections.py, and the script's own flags and positionals
that mean a key: epochs, the batch per rank or global, the seed, the checkpoint directory and cadence) and
:func:`from_args` (the validated JobConfig of the parsed arguments, with the lines about the script's flags it
does not read and how the script spells every key: ``JobConfig.notes``, ``JobConfig.flag_name``)."""
from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from typing import Any

from hpc_jabas.core.config.schema import default_text, split_optional
from hpc_jabas.core.config.sections import JobConfig, all_fields, flatten, read_toml
from hpc_jabas.errors import ConfigError


def flag_of(section: str, name: str) -> str:
    return "--" + ("autoscale-" if section == "autoscale" else "") + name.replace("_", "-")


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr and exit code 2, as in ``hpc-jabas``
    itself (``hpc-jabas: error: ... (--help for usage)``), instead of the usage block plus the error."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"hpc-jabas: error: {message} (--help for usage)\n")


#: namespace attributes add_arguments leaves for from_args: the flag prefix, the keys read from the script's
#: own flags ({our dest: [its dest, its default, how it is spelt]}), the --config dest, the lines about the
#: script's flags it does not read, and how the command line spells every key
_PREFIX_ATTR, _SHARED_ATTR, _CONFIG_ATTR = "_hpc_jabas_prefix", "_hpc_jabas_shared", "_hpc_jabas_config"
_NOTES_ATTR, _FLAGS_ATTR, _SKIP_ATTR = "_hpc_jabas_notes", "_hpc_jabas_flags", "_hpc_jabas_skipped"

#: what the names of a script's own flags and positionals mean (lower case, dashes as underscores)
_EPOCH_NAMES = frozenset({"epochs", "total_epochs", "num_epochs", "n_epochs", "max_epochs", "nepochs",
                          "train_epochs", "num_train_epochs"})
_SEED_NAMES = frozenset({"seed", "random_seed", "manual_seed", "rng_seed"})
_BATCH_NAMES = frozenset({"batch_size", "batchsize", "bs", "train_batch_size", "per_device_train_batch_size",
                          "per_device_batch_size", "per_gpu_batch_size", "batch_size_per_gpu", "local_batch_size",
                          "per_rank_batch_size", "global_batch_size", "total_batch_size", "effective_batch_size"})
_LR_NAMES = frozenset({"lr", "learning_rate", "base_lr"})
_DIR_NAMES = frozenset({"checkpoint_dir", "ckpt_dir", "save_dir", "output_dir", "out_dir", "model_dir",
                        "checkpoint_folder", "snapshot_dir"})
_FILE_NAMES = frozenset({"checkpoint", "ckpt", "checkpoint_path", "ckpt_path", "snapshot_path", "save_path",
                         "resume", "checkpoint_file", "snapshot"})
_CADENCE_NAMES = frozenset({"save_every", "save_freq", "save_frequency", "save_interval", "ckpt_every",
                            "checkpoint_freq", "checkpoint_interval", "snapshot_every"})
_PER_RANK = re.compile(r"\b(each|per|every|one|a single|this)[\s-]+(device|gpu|rank|process|worker|replica|card|"
                       r"accelerator)|\bper[-_ ]?(device|gpu|rank|worker|replica)|\blocal\b", re.I)
_GLOBAL = re.compile(r"\b(global|total|effective)\b|\ball\s+(the\s+)?(ranks|gpus|devices|processes|workers)|"
                     r"\bacross\b", re.I)
_ITERATIONS = re.compile(r"\b(iter|iters|iteration|iterations|step|steps|batches|updates)\b", re.I)


def _script_flag_meanings(actions: list[argparse.Action], exact: set[str], pre: str,
                          shared: dict[str, list[Any]], flags: dict[str, str]) -> list[str]:
    """The script's own flags and positionals (``actions``; ``exact``: those of our names, read already) whose
    names mean a key: added to ``shared`` (read as the key) and ``flags`` (how the key is spelt) when the meaning
    is clear; returns one line for each that is not read, saying what to use."""
    notes: list[str] = []
    for act in actions:
        if act.nargs == 0 or isinstance(act, argparse._HelpAction) or act.default == argparse.SUPPRESS:
            continue
        longs = [o for o in act.option_strings if o.startswith("--")]
        if act.option_strings and not longs or set(act.option_strings) & exact:
            continue                                # short flags only, or a flag of ours (read as ours already)
        names = {act.dest.lower().replace("-", "_")} | {o[2:].lower().replace("-", "_") for o in longs}
        spelt = longs[0] if longs else act.dest
        text = f"{act.help or ''} {act.dest}"
        key = _meaning(names, text)
        if key is None:
            if names & _BATCH_NAMES:
                notes.append(f"{spelt}: hpc-jabas cannot tell whether it is each rank's batch or the global one "
                             "(neither its name nor its help says), so it does not read it; give --"
                             f"{pre}batch-per-rank N (each rank's) or --{pre}batch B (all ranks together)")
            elif names & _FILE_NAMES:
                notes.append(f"{spelt}: the script's own checkpoint file, which hpc-jabas does not read; its "
                             f"checkpoints go to --{pre}run-dir DIR (run_dir), and a rerun resumes from there")
            elif names & _LR_NAMES:
                notes.append(f"{spelt}: the script's own lr (its optimizer's), not read by hpc-jabas; it is the lr "
                             f"of the global batch (batch_ref, default --{pre}batch), not multiplied by the ranks; "
                             "the lr_rule scales it when B changes")
            continue
        if key in shared:
            notes.append(f"{spelt}: also means {key}, which {flags[key]} gives; not read")
            continue
        shared[key] = [act.dest, act.default, spelt]
        flags[key] = spelt
    return notes


def _meaning(names: set[str], text: str) -> str | None:
    """The key a script's flag or positional stands for (its names, its help), or None."""
    if names & _EPOCH_NAMES:
        return "epochs"
    if names & _SEED_NAMES:
        return "seed"
    if names & _DIR_NAMES:
        return "run_dir"
    if names & _CADENCE_NAMES:
        return "checkpoint_every" if _ITERATIONS.search(text) else "checkpoint_every_epochs"
    if names & _BATCH_NAMES:
        joined = " ".join(names).replace("_", " ")
        if _GLOBAL.search(joined) or _GLOBAL.search(text):
            return "batch"
        if _PER_RANK.search(joined) or _PER_RANK.search(text):
            return "batch_per_rank"
    return None


def add_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> Any:
    """``--config`` plus one flag per key, with its help, in a group per section, and ``-q/--quiet``,
    ``-v/--verbose`` (``hpc_jabas.config_from_args`` applies them); returns the first group ("hpc-jabas",
    holding --config). Flags default to None (unset): they override the TOML file given by --config, which
    overrides the defaults.

    A flag the script already has (its own ``--epochs``, ``--seed``) is kept, not added again: its value is read
    as the key's; its default counts as a default (below --config), a value given on the command line as a
    flag. So are the script's flags and positionals whose names mean a key (``total_epochs``, ``--batch_size``
    "on each device": ``batch_per_rank``, ``save_every``: ``checkpoint_every_epochs``, ``--output-dir``:
    ``run_dir``); one it cannot read (a batch that may be per rank or global, its own checkpoint file, its lr) is
    one line of the config's ``notes``, which the Trainer logs. ``prefix="hj-"`` names every flag ``--hj-KEY``
    instead (``--hj-config``), leaving the script's own flags alone. A script that has its own ``--config`` gets
    ours as ``--<prefix>jabas-config``. For one-line errors build the parser as :class:`ArgumentParser`
    (``hpc_jabas.ArgumentParser``)."""
    pre = prefix.lstrip("-")
    taken = getattr(parser, "_option_string_actions", {})
    shared: dict[str, list[Any]] = {}
    flags: dict[str, str] = {}
    for s, f, tp in all_fields():                   # the script's flags of our names: read as ours
        flag = "--" + pre + flag_of(s, f.name)[2:]
        neg = f"--no-{flag[2:]}" if split_optional(tp)[0] is bool else ""
        for fl in (flag, neg):
            if fl and fl in taken and (neg == "" or taken[fl].nargs == 0 or "--no-" in fl):
                # the script's own --batch whose help says it is each rank's is the per-rank batch
                name = "batch_per_rank" if f.name == "batch" and _PER_RANK.search(taken[fl].help or "") else f.name
                shared[_dest(s, name)] = [taken[fl].dest, taken[fl].default, fl]
                flags[name] = fl
                break
    exact = {v[2] for v in shared.values()}
    notes = [] if pre else _script_flag_meanings(list(parser._actions), exact, pre, shared, flags)
    skipped: list[str] = []
    top = parser.add_argument_group("hpc-jabas")
    cfg_flag = f"--{pre}config" if f"--{pre}config" not in taken else f"--{pre}jabas-config"
    cfg_dest = cfg_flag[2:].replace("-", "_")
    top.add_argument(cfg_flag, dest=cfg_dest, metavar="TOML", help="TOML job configuration")
    if not {"-q", "--quiet", "-v", "--verbose"} & set(taken):
        g = top.add_mutually_exclusive_group()
        g.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
        g.add_argument("-v", "--verbose", action="store_true", help="debug output from every rank")
    groups: dict[str, Any] = {}
    for s, f, tp in all_fields():
        flag = "--" + pre + flag_of(s, f.name)[2:]
        dest = _dest(s, f.name)
        if dest in shared or flag in taken:         # the script's own flag or positional: read as ours, or
            skipped.append(dest)                    # its own flag of our name but another kind (not read)
            continue
        flags.setdefault(f.name, flag)
        g = groups.get(s) or groups.setdefault(s, parser.add_argument_group(f"hpc-jabas [{s}]"))
        g.add_argument(flag, **_flag_kw(f, tp, pre + dest))
    parser.set_defaults(**{_PREFIX_ATTR: pre.replace("-", "_"), _SHARED_ATTR: shared, _CONFIG_ATTR: cfg_dest,
                           _NOTES_ATTR: notes, _FLAGS_ATTR: flags, _SKIP_ATTR: skipped})
    return top


def _flag_kw(f: dataclasses.Field[Any], tp: Any, dest: str) -> dict[str, Any]:
    """argparse's keywords of key ``f``'s flag (default None: unset)."""
    m = f.metadata
    base, _ = split_optional(tp)
    shown = default_text(f)
    helptext = f"{m['help']} (default: {shown[1:-1] if isinstance(f.default, str) else shown})"
    kw: dict[str, Any] = {"dest": dest.replace("-", "_"), "default": None, "help": helptext}
    if base is bool:
        kw["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(base) is dict:
        kw.update(action="append", metavar=m["metavar"])
    elif typing.get_origin(base) is list:
        kw["metavar"] = m["metavar"]
    else:
        kw["type"] = base
        if m["choices"]:
            kw["choices"] = m["choices"]
            if m.get("canon") is not None:      # an alias (--policy goodput) is read as its canonical name
                canon = m["canon"]
                kw["type"] = lambda v, _c=canon, _t=base: _c(_t(v))
        else:
            kw["metavar"] = m["metavar"] or f.name.upper()
    return kw


def _dest(section: str, name: str) -> str:
    return f"autoscale_{name}" if section == "autoscale" else name


def from_args(args: argparse.Namespace) -> JobConfig:
    """The config of --config (if any) with the flags that were given on top; validated. The script's own
    flags that add_arguments kept count as the keys' flags (their defaults below --config)."""
    pre = getattr(args, _PREFIX_ATTR, "") or ""
    shared: dict[str, list[Any]] = getattr(args, _SHARED_ATTR, None) or {}
    skipped = set(getattr(args, _SKIP_ATTR, None) or ())
    flat: dict[str, Any] = {}
    auto: dict[str, Any] = {}
    toml = getattr(args, getattr(args, _CONFIG_ATTR, "config"), None)
    if toml:
        flat, auto = flatten(read_toml(toml))
    given = {**flat, **{f"autoscale_{k}": v for k, v in auto.items()}}
    for s, f, _ in all_fields():
        dest = _dest(s, f.name)
        if dest in shared:
            their_dest, their_default = shared[dest][:2]
            v = getattr(args, their_dest, None)
            if v is not None and v == their_default and dest in given:
                v = None                            # the script's default yields to --config
        else:                                       # ours, unless the script's flag of that name is another kind
            v = None if dest in skipped else getattr(args, pre + dest, None)
        if v is not None:
            (auto if s == "autoscale" else flat)[f.name] = v
    if "plan" not in shared and getattr(args, pre + "plan", None) and not getattr(args, pre + "planner", None):
        flat["planner"] = "fixed"
    _one_batch(args, shared, flat)
    return JobConfig.from_dict({**flat, "autoscale": auto}).with_cli(getattr(args, _NOTES_ATTR, None) or (),
                                                                     getattr(args, _FLAGS_ATTR, None) or {})


def _one_batch(args: argparse.Namespace, shared: dict[str, list[Any]], flat: dict[str, Any]) -> None:
    """A per-rank batch (the script's own flag, read as batch_per_rank) and a global one (--batch, or --config's
    batch): the script's default per-rank batch yields to a given global one; both given is one ConfigError."""
    if "batch_per_rank" not in flat or "batch" not in flat:
        return
    if "batch_per_rank" in shared:
        dest, default, spelt = shared["batch_per_rank"]
        if getattr(args, dest, None) == default:
            del flat["batch_per_rank"]
            return
    else:
        spelt = "batch_per_rank"
    raise ConfigError(f"{spelt} {flat['batch_per_rank']} (each rank's batch) and --batch {flat['batch']} (the "
                      "global batch) both given; give one of them")
