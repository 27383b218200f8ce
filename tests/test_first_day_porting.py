"""Issue 36, finding 8: docs/porting.md. Its two scripts are the files examples/porting/ holds (the README test runs
them on 2 ranks from the document's bash block), the diff size it states is the files' diff, it covers what the
issue asks (global B, lr via batch_ref, Adasum, fp16 compression, predivide, the Slurm task's config), and a task
callable that takes an argument gets the job's config."""
from __future__ import annotations

import difflib
import re
from pathlib import Path

from hpc_jabas.runtime.job.task import call_task

ROOT = Path(__file__).resolve().parents[1]


def test_the_guides_scripts_are_the_files_and_its_diff_size_is_theirs():
    doc = (ROOT / "docs/porting.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    hvd = (ROOT / "examples" / "porting" / "horovod_mnist.py").read_text()
    port = (ROOT / "examples" / "porting" / "jabas_mnist.py").read_text()
    assert blocks[0] == hvd and blocks[1] == port
    diff = list(difflib.unified_diff(hvd.splitlines(), port.splitlines(), lineterm=""))[2:]
    added = sum(1 for ln in diff if ln.startswith("+"))
    removed = sum(1 for ln in diff if ln.startswith("-"))
    assert f"{added} lines added and\n{removed} removed" in doc or f"{added} lines added and {removed} removed" in doc
    assert "hvd." not in port and "hvd.size()" in hvd and "DistributedOptimizer" in hvd
    for topic in ("global", "batch_ref", "Adasum", "Compression.fp16", "predivide", "def build(cfg"):
        assert topic in doc, topic
    assert re.search(r"mpirun .*-np 2 python examples/porting/jabas_mnist.py --batch 128", doc)


def test_a_task_callable_gets_the_jobs_config_when_it_takes_one():
    assert call_task(lambda: "plain", {"batch": 64}) == "plain"
    got = call_task(lambda cfg: (cfg.batch, cfg.epochs, cfg.run_dir), {"job": {"x": 1}, "train": {"batch": 64,
                                                                                                    "epochs": 3}},
                    run_dir="/chain/run")
    assert got == (64, 3, "/chain/run")
    # a callable whose arguments all have defaults (examples/train_digits.py's build(lr=0.05)) is called with none
    assert call_task(lambda lr=0.05: lr, {"train": {"batch": 64}}) == 0.05


def test_the_ddp_pair_in_the_guide_is_the_files_diff():
    """docs/porting.md's torch DDP section: its diff block is ``diff -u`` of the two files, its counts are the
    diff's, the DDP script is a standard torchrun one, and the port has no DDP wrap, sampler or own loop."""
    doc = (ROOT / "docs/porting.md").read_text()
    plain = (ROOT / "examples" / "porting" / "ddp_mnist.py").read_text()
    port = (ROOT / "examples" / "porting" / "ddp_jabas_mnist.py").read_text()
    block = re.findall(r"```diff\n(.*?)```", doc, re.S)
    diff = list(difflib.unified_diff(plain.splitlines(), port.splitlines(), lineterm=""))[2:]
    assert len(block) == 1 and [ln.rstrip() for ln in block[0].splitlines()] == [ln.rstrip() for ln in diff]
    added = sum(1 for ln in diff if ln.startswith("+"))
    removed = sum(1 for ln in diff if ln.startswith("-"))
    assert f"{added} lines added and {removed} removed" in doc.replace("\n", " ")
    for gone in ("DistributedDataParallel", "DistributedSampler", "set_epoch", "init_process_group", "torch.save"):
        assert gone in plain and gone not in port, gone
    assert "hpc_jabas.ArgumentParser" in port and "torchrun --standalone --nproc-per-node=2" in doc
