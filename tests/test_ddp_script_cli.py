"""Issue 58, finding 1: a DDP script's own CLI. ``add_arguments`` reads the flags and positionals of the script's
parser that mean epochs, the batch (per rank or global), the seed, the checkpoint directory and its cadence; a
flag whose meaning is not clear (or that hpc-jabas does not read) is named in one line with what to use. The
shape is pytorch/examples' DDP tutorial (multigpu_torchrun.py): positional ``total_epochs save_every`` and a
per-device ``--batch_size``; run as its user runs it (torchrun, 2 ranks) in tests/test_ddp_script_run.py."""
from __future__ import annotations

import argparse

import pytest

import hpc_jabas as hj
from hpc_jabas.errors import ConfigError


def tutorial_parser() -> argparse.ArgumentParser:
    """pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py's parser, as written there."""
    p = argparse.ArgumentParser(description="simple distributed training job")
    p.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    p.add_argument("save_every", type=int, help="How often to save a snapshot")
    p.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)")
    return p


def test_the_tutorials_positionals_and_per_device_batch_are_read():
    p = tutorial_parser()
    hj.add_arguments(p)
    cfg = hj.config_from_args(p.parse_args(["3", "2", "--batch_size", "48"]))
    assert (cfg.epochs, cfg.checkpoint_every_epochs, cfg.batch_per_rank) == (3, 2, 48)
    cfg = hj.config_from_args(p.parse_args(["5", "1"]))                  # the script's default per-device batch
    assert (cfg.epochs, cfg.checkpoint_every_epochs, cfg.batch_per_rank) == (5, 1, 32)
    cfg = hj.config_from_args(p.parse_args(["5", "1", "--batch", "96"]))  # our global --batch over its default
    assert (cfg.batch, cfg.batch_per_rank) == (96, None)
    with pytest.raises(ConfigError, match="--batch_size.*--batch"):        # both given: one of them
        hj.config_from_args(p.parse_args(["5", "1", "--batch", "96", "--batch_size", "8"]))
    assert "--epochs" not in p.format_help()               # the positional is the epochs: no second way to say it
    # error lines and the log name the key as the script spells it
    assert cfg.flag_name("epochs") == "total_epochs" and cfg.flag_name("batch") == "--batch"
    assert hj.JobConfig().flag_name("epochs") == "epochs (the config key)"


@pytest.mark.parametrize("help_text,key", [("global batch size (all GPUs)", "batch"),
                                           ("total batch size across ranks", "batch"),
                                           ("batch size per GPU", "batch_per_rank"),
                                           ("samples per rank and step", "batch_per_rank")])
def test_a_batch_flags_help_says_whether_it_is_global_or_per_rank(help_text, key):
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=64, help=help_text)
    hj.add_arguments(p)
    cfg = hj.config_from_args(p.parse_args(["--batch-size", "80"]))
    assert getattr(cfg, key) == 80
    assert cfg.notes == () or all("--batch-size" not in n or "not read" not in n for n in cfg.notes)


def test_argparse_positionals_and_unclear_flags():
    p = argparse.ArgumentParser()
    p.add_argument("epochs", type=int)
    p.add_argument("seed", type=int)
    p.add_argument("--bs", type=int, default=16)                       # per rank or global? the help does not say
    p.add_argument("--checkpoint", default="model.pt")                  # the script's own checkpoint file
    p.add_argument("--output-dir", default="out")                       # a directory: the run directory
    p.add_argument("--lr", type=float, default=0.1)
    hj.add_arguments(p)
    cfg = hj.config_from_args(p.parse_args(["4", "7", "--bs", "64", "--output-dir", "runs/x"]))
    assert (cfg.epochs, cfg.seed, cfg.run_dir, cfg.batch, cfg.batch_per_rank) == (4, 7, "runs/x", 256, None)
    notes = "\n".join(cfg.notes)
    # each flag hpc-jabas does not read is one line naming it and what to use
    assert sum("--bs" in n for n in cfg.notes) == 1 and "--batch" in notes and "--batch-per-rank" in notes
    assert sum("--checkpoint " in n or "--checkpoint:" in n for n in cfg.notes) == 1 and "--run-dir" in notes
    assert sum("--lr" in n for n in cfg.notes) == 1 and "not multiplied" in notes
    assert all("\n" not in n for n in cfg.notes)


def test_a_scripts_own_batch_flag_that_is_per_rank():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=32, help="batch size per GPU")
    hj.add_arguments(p)
    cfg = hj.config_from_args(p.parse_args(["--batch", "24"]))
    assert (cfg.batch, cfg.batch_per_rank, cfg.flag_name("batch_per_rank")) == (256, 24, "--batch")


def test_a_save_every_in_iterations_is_the_iteration_cadence():
    p = argparse.ArgumentParser()
    p.add_argument("--save-every", type=int, default=500, help="save a checkpoint every N iterations")
    hj.add_arguments(p)
    cfg = hj.config_from_args(p.parse_args([]))
    assert (cfg.checkpoint_every, cfg.checkpoint_every_epochs) == (500, 1)


def test_batch_per_rank_is_the_global_batch_times_the_ranks():
    """One rank here: B = batch_per_rank x 1; the 2-rank case runs in test_ddp_script_run.py."""
    import torch
    from torch import nn
    model = nn.Linear(4, 1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        t = hj.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data, nn.MSELoss(),
                       config=hj.JobConfig(batch_per_rank=16, run_dir=td),
                       world=hj.World(rank=0, size=1, gpu_types=("v100",)))
        assert (t.cfg.batch, t.B, t.cfg.batch_per_rank) == (16, 16, None)
    with pytest.raises(ConfigError, match="batch_per_rank=100 x 1 rank = a global batch of 100"):
        hj.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data, nn.MSELoss(),
                   config=hj.JobConfig(batch_per_rank=100),
                   world=hj.World(rank=0, size=1, gpu_types=("v100",)))


def test_checkpoint_every_epochs_is_the_epoch_cadence(tmp_path):
    """The tutorial's save_every: checkpoints at every 2nd epoch end and the last one (epochs 2, 4, 5 of 5)."""
    import torch
    from torch import nn
    model = nn.Linear(4, 1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    t = hj.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data, nn.MSELoss(),
                   config=hj.JobConfig(batch=16, epochs=5, checkpoint_every_epochs=2, keep_checkpoints=5,
                                       run_dir=str(tmp_path / "run")),
                   world=hj.World(rank=0, size=1, gpu_types=("v100",)))
    t.fit()
    names = sorted(p.name.split("-")[1] for p in (tmp_path / "run" / "checkpoints").glob("ckpt-*.pt"))
    assert [int(n) for n in names] == [2, 4, 5]


_PER_RANK_HELPS = ["input batch size on each device", "samples per rank and step", "batch size per GPU",
                   "the batch of each process", "per-device train batch size", "local batch size"]
_GLOBAL_HELPS = ["global batch size", "total batch size of all ranks", "effective batch size",
                 "batch size across all GPUs", "samples per step over all the devices"]
_UNCLEAR_HELPS = ["", "input batch size for training", "batch size (default: 64)", "how many samples per step",
                  "mini-batch size"]


def test_the_batch_flag_rule_over_names_and_helps():
    """The rule as a table: every batch-flag name with a per-rank help is batch_per_rank, with a global help batch,
    with neither one line and not read; the flag's value never lands elsewhere."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    names = st.sampled_from(["--batch-size", "--batch_size", "--bs", "--train-batch-size", "--batchsize"])

    @settings(max_examples=60, deadline=None)
    @given(names, st.sampled_from(["per", "global", "unclear"]), st.data(), st.integers(1, 512))
    def check(name, kind, data, value):
        helps = {"per": _PER_RANK_HELPS, "global": _GLOBAL_HELPS, "unclear": _UNCLEAR_HELPS}[kind]
        p = argparse.ArgumentParser()
        p.add_argument(name, type=int, default=64, help=data.draw(st.sampled_from(helps)))
        hj.add_arguments(p)
        cfg = hj.config_from_args(p.parse_args([name, str(value)]))
        want = {"per": (256, value, 0), "global": (value, None, 0), "unclear": (256, None, 1)}[kind]
        assert (cfg.batch, cfg.batch_per_rank, sum(name in n and "not read" in n for n in cfg.notes)) == want

    check()
