"""docs/porting.md, "Keep your loop": its two diffs are ``diff -u`` of the files in examples/porting/ (a torchrun DDP
script and a Horovod script, each against its port that keeps its loop with ``hpc_jabas.Jabas``), the counts it
states are theirs, and each port keeps its own initialisation and loop while the sampler and the wrap go
(tests/test_public_layer_loop.py runs such loops on 3 ranks, both backends)."""
from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAIRS = {"ddp": ("ddp_mnist.py", "ddp_loop.py"), "horovod": ("horovod_mnist.py", "horovod_loop.py")}


def _section() -> str:
    doc = (ROOT / "docs/porting.md").read_text()
    return doc[doc.index("## Keep your loop"):]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_each_diff_in_the_guide_is_the_files_diff_and_its_counts(name):
    plain_f, port_f = PAIRS[name]
    plain = (ROOT / "examples" / "porting" / plain_f).read_text()
    port = (ROOT / "examples" / "porting" / port_f).read_text()
    diff = list(difflib.unified_diff(plain.splitlines(), port.splitlines(), lineterm=""))[2:]
    sec = _section()
    head = f"diff -u examples/porting/{plain_f} examples/porting/{port_f}"
    part = sec[sec.index(head):]
    block = re.search(r"```udiff\n(.*?)```", part, re.S)
    assert block is not None
    assert [ln.rstrip() for ln in block.group(1).splitlines()] == [ln.rstrip() for ln in diff]
    added = sum(1 for ln in diff if ln.startswith("+"))
    removed = sum(1 for ln in diff if ln.startswith("-"))
    assert 10 <= added <= 40 and 10 <= removed <= 40
    assert f"{added} lines added and {removed} removed" in part[:400].replace("\n", " ")


def test_each_port_keeps_its_loop_and_its_init_and_drops_the_sampler_and_the_wrap():
    ddp = (ROOT / "examples" / "porting" / "ddp_loop.py").read_text()
    hvd = (ROOT / "examples" / "porting" / "horovod_loop.py").read_text()
    for port, init in ((ddp, "dist.init_process_group("), (hvd, "hvd.init()")):
        assert init in port and "hpc_jabas.Jabas(" in port and "jabas.backward(" in port
        assert "for step in loader:" in port and "optimizer.step()" in port
        assert "DistributedSampler" not in port and "DistributedOptimizer" not in port and "DDP(" not in port
