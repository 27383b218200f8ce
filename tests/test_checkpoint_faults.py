"""Checkpoints that survive their own pruning, a full disk, and a format or optimizer that differs.

Each case runs a user's script (tests/workers/ckpt_user.py: the public API, no run_main) as a process, as a user
would, and asserts on what is left on disk and on the one line the user reads:
- pruning keeps checkpoints by validity: after a resume fell back past a torn newer checkpoint, the checkpoints
  the resumed run writes are kept and the torn one is set aside (``.bad``), so the next start resumes;
- a file size limit (``ulimit -f``, EFBIG while writing) and a full file system (a small tmpfs, refused by the
  free-space check before writing) are one line, no temporary file is left, the earlier checkpoints stay and the
  next run resumes from them;
- a format this version does not read, a payload missing a key, another optimizer class and another number of
  parameter groups are each one line naming the difference (exit 2), and nothing is deleted."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi_util import PY, ROOT, WORKERS, mpi_env

from hpc_jabas.runtime.persist import checkpoint as ckpt

USER = str(WORKERS / "ckpt_user.py")


def _run(run_dir, epochs, keep=1, opt="sgd", ulimit_kb: int | None = None, np_: int = 1,
         backend: str = "auto") -> subprocess.CompletedProcess:
    args = [USER, str(run_dir), str(epochs), str(keep), opt, backend]
    cmd = [PY, *args] if np_ == 1 else ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), PY, *args]
    env = mpi_env()
    env["HPC_JABAS_ERROR_GRACE_S"] = "1"
    if ulimit_kb is not None:               # ulimit -f, set by the script once its ranks have started
        env["HJ_TEST_FSIZE_KB"] = str(ulimit_kb)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=str(ROOT))


def _error_lines(p: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if "error:" in ln]


def _names(d: Path) -> list[str]:
    return sorted(f.name for f in d.iterdir()) if d.is_dir() else []


def test_pruning_after_a_fallback_keeps_the_good_checkpoints_and_sets_the_torn_one_aside(tmp_path):
    run = tmp_path / "run"
    assert _run(run, 1).returncode == 0
    cdir = run / "checkpoints"
    (first,) = ckpt.list_checkpoints(cdir)
    torn = cdir / ckpt.name_for(9, 99)                   # a stale copy without its record: sorts newest
    shutil.copy(first, torn)
    p = _run(run, 2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "skipping bad checkpoint" in p.stderr and "set aside checkpoint" in p.stderr
    kept = ckpt.list_checkpoints(cdir)
    assert [k.name for k in kept] == [ckpt.name_for(2, 8)], _names(cdir)
    assert (cdir / (torn.name + ckpt.BAD_SUFFIX)).exists()
    assert ckpt.verify(kept[0]) is None
    p = _run(run, 3)                                     # keep = 1: the run goes on from epoch 2
    assert p.returncode == 0, p.stderr[-3000:]
    assert "fit: iterations=12" in p.stdout and ckpt.name_for(2, 8) in p.stderr


def _prune_reference(kinds: list[str], new_at: int, keep: int) -> tuple[list[int], list[int]]:
    """An independent statement of the rule: (indices left in place besides the new one, indices set aside).
    File i is iteration 2 i + 1; the new one is iteration 2 new_at (between files new_at - 1 and new_at)."""
    stay = [i for i in range(new_at, len(kinds)) if kinds[i] == "good"]     # newer than the new one: kept
    aside = [i for i in range(new_at, len(kinds)) if kinds[i] != "good"]
    room = keep - 1
    for i in reversed(range(new_at)):                                      # older: newest first, until keep
        if room <= 0:
            break
        if kinds[i] == "good":
            stay.append(i)
            room -= 1
        else:
            aside.append(i)
    return sorted(stay), sorted(aside)


@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(st.sampled_from(["good", "torn", "corrupt"]), min_size=0, max_size=6),
       where=st.floats(0, 1), keep=st.integers(1, 4))
def test_prune_keeps_the_newest_verified_and_never_the_new_one_out(tmp_path_factory, kinds, where, keep):
    d = tmp_path_factory.mktemp("prune")
    for i, kind in enumerate(kinds):
        p = ckpt.save(d / ckpt.name_for(1, 2 * i + 1), {"i": i})
        if kind == "torn":
            ckpt.sidecar(p).unlink()
        elif kind == "corrupt":
            data = bytearray(p.read_bytes())
            data[-5] ^= 1
            p.write_bytes(bytes(data))
    new_at = round(where * len(kinds))
    new = ckpt.save(d / ckpt.name_for(1, 2 * new_at), {"i": -1})
    kept = ckpt.prune(d, keep, newest=new, log=lambda m: None)
    stay, aside = _prune_reference(kinds, new_at, keep)
    left = sorted([ckpt.name_for(1, 2 * new_at)] + [ckpt.name_for(1, 2 * i + 1) for i in stay])
    assert sorted(p.name for p in ckpt.list_checkpoints(d)) == left
    assert kept[0] == new and all(ckpt.verify(p) is None for p in ckpt.list_checkpoints(d))
    assert len(kept) == min(keep, 1 + len([i for i in range(new_at) if kinds[i] == "good"]))
    assert sorted(f.name for f in d.iterdir() if f.name.endswith(".pt" + ckpt.BAD_SUFFIX)) == \
        sorted(ckpt.name_for(1, 2 * i + 1) + ckpt.BAD_SUFFIX for i in aside)


def test_a_file_size_limit_while_checkpointing_is_one_line_and_loses_nothing(tmp_path):
    run = tmp_path / "run"
    assert _run(run, 1).returncode == 0
    cdir = run / "checkpoints"
    before = {n: (cdir / n).read_bytes() for n in _names(cdir)}
    size = ckpt.list_checkpoints(cdir)[0].stat().st_size
    p = _run(run, 2, ulimit_kb=size // 1024 - 4)         # the checkpoint write fails with EFBIG
    lines = _error_lines(p)
    assert p.returncode == 2, p.stderr[-3000:]
    assert len(lines) == 1 and "cannot write a checkpoint in" in lines[0] and "File too large" in lines[0], lines
    assert "Traceback" not in p.stderr
    assert {n: (cdir / n).read_bytes() for n in _names(cdir)} == before    # no temporary file, nothing lost
    rec = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("type") == "checkpoint_failed" for r in rec)
    p = _run(run, 2)
    assert p.returncode == 0 and "fit: iterations=8" in p.stdout, p.stderr[-3000:]


@pytest.mark.parametrize("backend", ["horovod", "torch"])
def test_a_file_size_limit_is_one_line_on_two_ranks(tmp_path, backend):
    run = tmp_path / "run"
    assert _run(run, 1, np_=2, backend=backend).returncode == 0
    size = ckpt.list_checkpoints(run / "checkpoints")[0].stat().st_size
    p = _run(run, 2, np_=2, backend=backend, ulimit_kb=size // 1024 - 4)
    assert p.returncode != 0
    lines = _error_lines(p)
    assert len(lines) == 1 and "cannot write a checkpoint in" in lines[0], p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert len(ckpt.list_checkpoints(run / "checkpoints")) == 1


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        if os.environ.get("CI"):            # CI runs as root: a skip there would be a missing set-up step
            pytest.fail("mounting a small tmpfs failed in CI (it needs root and mount)")
        pytest.skip("mounting a small tmpfs needs root")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_file_system_is_refused_before_writing_in_one_line(small_fs):
    run = small_fs / "run"
    assert _run(run, 1).returncode == 0
    cdir = run / "checkpoints"
    before = {n: (cdir / n).read_bytes() for n in _names(cdir)}
    free = shutil.disk_usage(small_fs).free
    filler = small_fs / "filler"
    filler.write_bytes(b"\0" * (free - 200_000))         # 200 KB left: less than a checkpoint and its margin
    p = _run(run, 2)
    lines = _error_lines(p)
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert "there is not enough free space" in lines[0] and "KiB free" in lines[0] and str(cdir) in lines[0]
    assert {n: (cdir / n).read_bytes() for n in _names(cdir)} == before
    filler.unlink()
    p = _run(run, 2)
    assert p.returncode == 0 and "fit: iterations=8" in p.stdout, p.stderr[-3000:]


def _one_epoch(tmp_path, opt="sgd") -> tuple[Path, Path]:
    run = tmp_path / "run"
    assert _run(run, 1, keep=3, opt=opt).returncode == 0
    return run, ckpt.list_checkpoints(run / "checkpoints")[-1]


def _refused(run, opt="sgd") -> str:
    cdir = run / "checkpoints"
    before = _names(cdir)
    p = _run(run, 2, keep=3, opt=opt)
    lines = _error_lines(p)
    assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert _names(cdir) == before                        # nothing deleted, nothing set aside
    return lines[0]


def test_an_unknown_checkpoint_format_is_refused_in_one_line(tmp_path):
    run, last = _one_epoch(tmp_path)
    side = ckpt.sidecar(last)
    rec = json.loads(side.read_text())
    side.write_text(json.dumps(dict(rec, format="hpc-jabas-checkpoint/9")) + "\n")
    line = _refused(run)
    assert "'hpc-jabas-checkpoint/9'" in line and "does not read" in line and last.name in line


def test_a_payload_missing_a_key_is_one_line_naming_it(tmp_path):
    run, last = _one_epoch(tmp_path)
    st = ckpt.load(last)
    del st["sampler"]
    ckpt.save(last, st)
    line = _refused(run)
    assert "lacks 'sampler'" in line


@pytest.mark.parametrize("first, then, says", [
    ("sgd", "adam", "SGD there, Adam here"),
    ("sgd", "sgd2", "1 parameter group(s) there, 2 here"),
])
def test_another_optimizer_is_one_line_naming_the_difference(tmp_path, first, then, says):
    run, _ = _one_epoch(tmp_path, first)
    assert says in _refused(run, then)


def test_a_checkpoint_without_the_optimizer_class_still_names_the_difference(tmp_path):
    run, last = _one_epoch(tmp_path)
    st = ckpt.load(last)
    del st["optimizer_class"]                            # written by an earlier version
    ckpt.save(last, st)
    line = _refused(run, "adam")
    assert "settings differ" in line and "momentum" in line


def test_a_planted_link_at_the_temporary_name_is_not_written_through(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    name = ckpt.name_for(0, 1)
    (d / f".{name}.tmp{os.getpid()}").symlink_to(target)
    p = ckpt.save(d / name, {"w": torch.zeros(3)})
    assert target.read_bytes() == b"precious" and ckpt.verify(p) is None
