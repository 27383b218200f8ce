"""The write side's fault cases of bench/faults.py, each a user's script run as a process
(tests/workers/ckpt_user.py: the public API, no run_main), as a user would run it:

* prune: a resume falls back past a torn or corrupt newer checkpoint (a stale copy without its record, a
  flipped byte, a truncation), keep_checkpoints 1-3: kept good when the resumed run's checkpoints stay, every
  kept one verifies, the bad one is set aside as ``.bad`` and the next start resumes and finishes;
* disk: a file size limit while checkpointing (EFBIG) on 1 and 2 ranks, and a 4 MB tmpfs left with 200 KB
  (refused by the free-space check): clear when one error line, no traceback, the checkpoint directory
  byte-identical, and the next run (limit lifted) resumes and finishes;
* format: an unknown sidecar format, a payload without one of the keys a resume restores, SGD -> Adam, one
  -> two parameter groups, and an earlier version's checkpoint (no optimizer class) -> Adam: checked when one
  line (exit 2) names the difference and nothing in the directory changed.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

from hpc_jabas.runtime.persist import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]
USER = ROOT / "tests" / "workers" / "ckpt_user.py"
PY = str(ROOT / ".venv" / "bin" / "python")


def run_user(run_dir: Path, epochs: int, keep: int = 1, opt: str = "sgd", fsize_kb: int | None = None,
             np_: int = 1, backend: str = "auto") -> subprocess.CompletedProcess:
    args = [str(USER), str(run_dir), str(epochs), str(keep), opt, backend]
    cmd = [PY, *args] if np_ == 1 else ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), PY, *args]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               HPC_JABAS_ERROR_GRACE_S="1", PYTHONPATH=str(ROOT))
    if fsize_kb is not None:
        env["HJ_TEST_FSIZE_KB"] = str(fsize_kb)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=str(ROOT))


def error_lines(p: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if "error:" in ln]


def snapshot(d: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(d.iterdir())} if d.is_dir() else {}


def _spoil(p: Path, kind: str) -> None:
    if kind == "torn":
        ckpt.sidecar(p).unlink()
    elif kind == "corrupt":
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 1
        p.write_bytes(bytes(data))
    else:                                           # truncated
        p.write_bytes(p.read_bytes()[:-100])


def prune_cases(work: Path, rng: random.Random, n: int, out: dict) -> None:
    rows = out.setdefault("prune", [])
    for k in range(n):
        keep, epochs, kind = rng.randint(1, 3), rng.randint(1, 3), rng.choice(["torn", "corrupt", "truncated"])
        d = work / f"prune-{k}"
        shutil.rmtree(d, ignore_errors=True)
        ok, why = run_user(d, epochs, keep).returncode == 0, ""
        cdir = d / "checkpoints"
        newest = ckpt.list_checkpoints(cdir)[-1]
        stale = cdir / ckpt.name_for(90 + k, 999)
        shutil.copy(newest, stale)
        shutil.copy(ckpt.sidecar(newest), ckpt.sidecar(stale))
        _spoil(stale, kind)
        p = run_user(d, epochs + 1, keep)
        kept = ckpt.list_checkpoints(cdir)
        written = cdir / ckpt.name_for(epochs + 1, 4 * (epochs + 1))
        ok = ok and p.returncode == 0 and written in kept and all(ckpt.verify(c) is None for c in kept) \
            and (cdir / (stale.name + ckpt.BAD_SUFFIX)).exists() and len(kept) == min(keep, epochs + 1)
        why = "" if ok else f"after the fallback: {[c.name for c in kept]} rc={p.returncode}"
        q = run_user(d, epochs + 2, keep)
        ok = ok and q.returncode == 0 and f"iterations={4 * (epochs + 2)}" in q.stdout
        rows.append({"case": f"keep={keep} epochs={epochs} {kind}", "ok": ok, "why": why or q.stderr[-300:] * (not ok)})
        print(f"prune keep={keep} epochs={epochs} {kind:9s} ok={ok} {why}", flush=True)
        shutil.rmtree(d, ignore_errors=True)


def _disk_case(d: Path, name: str, rows: list, fill=None, fsize: bool = False, np_: int = 1) -> None:
    backend = "horovod" if np_ > 1 else "auto"
    ok0 = run_user(d, 1, np_=np_, backend=backend).returncode == 0
    cdir = d / "checkpoints"
    before = snapshot(cdir)
    size = ckpt.list_checkpoints(cdir)[0].stat().st_size
    undo = fill() if fill else None
    p = run_user(d, 2, fsize_kb=size // 1024 - 4 if fsize else None, np_=np_, backend=backend)
    lines = error_lines(p)
    clear = p.returncode != 0 and len(lines) == 1 and "cannot write a checkpoint" in lines[0] and \
        "Traceback" not in p.stderr and snapshot(cdir) == before
    if undo:
        undo()
    q = run_user(d, 2, np_=np_, backend=backend)
    ok = ok0 and clear and q.returncode == 0 and "iterations=8" in q.stdout
    rows.append({"case": name, "ok": ok, "line": lines[0] if lines else p.stderr[-300:]})
    print(f"disk {name:22s} ok={ok} {lines[0] if lines else p.stderr[-200:]!r}", flush=True)


def disk_cases(work: Path, out: dict) -> None:
    rows = out.setdefault("disk", [])
    for name, np_ in (("file_size_limit", 1), ("file_size_limit_2_ranks", 2)):
        d = work / f"disk-{name}"
        shutil.rmtree(d, ignore_errors=True)
        _disk_case(d, name, rows, fsize=True, np_=np_)
        shutil.rmtree(d, ignore_errors=True)
    mnt = work / "disk-tmpfs"
    mnt.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        print("disk full_file_system: skipped (mounting a tmpfs needs root)", flush=True)
        return
    try:
        def fill():
            f = mnt / "filler"
            f.write_bytes(b"\0" * (shutil.disk_usage(mnt).free - 200_000))
            return f.unlink
        _disk_case(mnt / "run", "full_file_system", rows, fill=fill)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def format_cases(work: Path, out: dict) -> None:
    rows = out.setdefault("format", [])

    def edit(key):
        def f(last: Path) -> None:
            st = ckpt.load(last)
            del st[key]
            ckpt.save(last, st)
        return f

    def future(last: Path) -> None:
        side = ckpt.sidecar(last)
        side.write_text(json.dumps(dict(json.loads(side.read_text()), format="hpc-jabas-checkpoint/9")) + "\n")

    cases = [("unknown_format", future, "sgd", "does not read"),
             *[(f"missing_{k}", edit(k), "sgd", f"lacks {k!r}") for k in ("model", "optimizer", "sampler", "rng")],
             ("sgd_to_adam", None, "adam", "SGD there, Adam here"),
             ("one_to_two_groups", None, "sgd2", "1 parameter group(s) there, 2 here"),
             ("earlier_version_to_adam", edit("optimizer_class"), "adam", "settings differ")]
    for name, change, opt, says in cases:
        d = work / f"format-{name}"
        shutil.rmtree(d, ignore_errors=True)
        ok0 = run_user(d, 1, keep=3).returncode == 0
        cdir = d / "checkpoints"
        if change is not None:
            change(ckpt.list_checkpoints(cdir)[-1])
        before = snapshot(cdir)
        p = run_user(d, 2, keep=3, opt=opt)
        lines = error_lines(p)
        ok = ok0 and p.returncode == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in p.stderr \
            and snapshot(cdir) == before
        rows.append({"case": name, "ok": ok, "line": lines[0] if lines else p.stderr[-300:]})
        print(f"format {name:24s} ok={ok} {lines[0] if lines else p.stderr[-200:]!r}", flush=True)
        shutil.rmtree(d, ignore_errors=True)


def write_trust_cases(work: Path, out: dict) -> None:
    """A run directory another user could have prepared: it is theirs (uid 12345), its parent is writable by
    every user (not sticky), or it holds a link (to a file outside) where hpc-jabas writes its lock, metrics or
    progress, or a file named ``checkpoints``. Refused when one error line (exit 2) and the outside file, or the
    planted one, kept its bytes."""
    rows = out.setdefault("write_trust", [])
    for case in ("other_owner", "open_parent", "link_lock", "link_metrics", "link_progress", "checkpoints_file"):
        base = work / f"trust-{case}"
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        os.chmod(base, 0o755)
        victim = base / "victim"
        victim.write_bytes(b"precious\n")
        run = base / "run"
        run.mkdir()
        watched = victim
        if case == "other_owner":
            os.chown(run, 12345, 12345)
        elif case == "open_parent":
            os.chmod(base, 0o777)
        elif case.startswith("link_"):
            name = {"link_lock": ".hpc-jabas.lock", "link_metrics": "metrics.jsonl", "link_progress": "progress.json"}
            (run / name[case]).symlink_to(victim)
        else:
            watched = run / "checkpoints"
            watched.write_bytes(b"mine\n")
        before = watched.read_bytes()
        p = run_user(run, 1)
        lines = error_lines(p)
        ok = p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr and watched.read_bytes() == before
        rows.append({"case": case, "ok": ok, "line": lines[0] if lines else p.stderr[-300:]})
        print(f"write_trust {case:18s} ok={ok} {lines[0] if lines else p.stderr[-200:]!r}", flush=True)
        os.chmod(base, 0o755)
        shutil.rmtree(base, ignore_errors=True)
