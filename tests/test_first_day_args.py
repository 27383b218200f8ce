"""Issue 36, finding 7: add_arguments fits a real script. Flags the script has (Horovod's pytorch_mnist.py has
--epochs and --seed) are kept and read as the keys' (their defaults below --config), or every flag of ours is
prefixed; -q/--quiet and -v/--verbose come with it."""
from __future__ import annotations

import argparse
import logging

import pytest

import hpc_jabas as hj


def horovod_style_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--emulate", action="store_true")
    return p


def test_the_scripts_own_flags_are_read_as_ours(tmp_path):
    p = horovod_style_parser()
    hj.add_arguments(p)
    cfg = hj.config_from_args(p.parse_args([]))
    assert (cfg.epochs, cfg.seed, cfg.emulate) == (10, 42, False)        # the script's defaults
    args = p.parse_args(["--epochs", "3", "--seed", "7", "--batch", "96", "--batch-size", "8", "--emulate"])
    cfg = hj.config_from_args(args)
    assert (cfg.epochs, cfg.seed, cfg.batch, cfg.emulate, args.batch_size, args.lr) == (3, 7, 96, True, 8, 0.01)
    toml = tmp_path / "job.toml"
    toml.write_text("epochs = 5\nseed = 1\n")
    assert hj.config_from_args(p.parse_args(["--config", str(toml)])).epochs == 5      # --config beats a default
    cfg = hj.config_from_args(p.parse_args(["--config", str(toml), "--epochs", "2"]))
    assert (cfg.epochs, cfg.seed) == (2, 1)                                            # a given flag beats --config


def test_prefixed_flags_leave_the_script_alone(tmp_path):
    p = horovod_style_parser()
    p.add_argument("--config", help="the script's own YAML")
    hj.add_arguments(p, prefix="hj-")
    toml = tmp_path / "job.toml"
    toml.write_text("batch = 48\n")
    args = p.parse_args(["--epochs", "3", "--hj-epochs", "4", "--hj-config", str(toml), "--config", "mine.yaml"])
    cfg = hj.config_from_args(args)
    assert (cfg.epochs, cfg.seed, cfg.batch, args.epochs, args.config) == (4, 0, 48, 3, "mine.yaml")
    q = horovod_style_parser()
    q.add_argument("--config")
    hj.add_arguments(q)                                   # unprefixed: ours becomes --jabas-config
    assert hj.config_from_args(q.parse_args(["--jabas-config", str(toml)])).batch == 48


@pytest.mark.parametrize("before", [True, False])
def test_the_verbosity_flags_come_with_it(before):
    p = horovod_style_parser()
    if before:
        hj.add_verbosity_flags(p)
    hj.add_arguments(p)
    if not before:
        hj.add_verbosity_flags(p)                         # after: nothing added twice
    root = logging.getLogger("hpc_jabas")
    try:
        hj.config_from_args(p.parse_args(["-q"]))
        assert root.level == logging.WARNING
        hj.config_from_args(p.parse_args(["--verbose"]))
        assert root.level == logging.DEBUG
    finally:
        hj.configure_logging("info")
