"""Progress bar (tqdm, rank 0) under a pseudo-terminal and not without one; a finished run refuses to
"resume" (stdout message, exit 2); log lines leave in one write each."""
from __future__ import annotations

import fcntl
import json
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from mpi_util import run_script

from hpc_jabas import log as hjlog

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")
DIGITS = [PY, str(ROOT / "examples" / "train_digits.py"), "--emulate", "--batch", "256"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPC_JABAS_PROGRESS", "OMPI_COMM"))}
    env["PYTHONPATH"] = str(ROOT)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run_pty(args: list[str]) -> tuple[int, str]:
    """Run with stdout on a pseudo-terminal of 30 x 120 (stderr a pipe); returns (exit code, terminal output)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    p = subprocess.Popen(args, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=_env(), cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:          # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    p.stderr.read()
    return p.wait(timeout=120), b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_only_and_a_finished_run_refuses(tmp_path):
    rc, out = _run_pty(DIGITS + ["--epochs", "2", "--run-dir", str(tmp_path / "tty")])
    assert rc == 0, out
    frames = [f for f in out.split("\r") if "sample/s" in f]
    assert len(frames) >= 3, out                                  # redrawn in place, one frame per update
    assert "epoch 2/2" in out and "B=256" in out and "it=" in out
    assert "2.69k/2.69k" in out                                   # 2 epochs x 1347 training samples, done
    prog = json.loads((tmp_path / "tty" / "progress.json").read_text())
    assert (prog["epoch"], prog["epochs"], prog["samples_done"], prog["samples_total"]) == (2, 2, 2694, 2694)

    run = tmp_path / "pipe"         # the two runs into a pipe: forked from a warm interpreter (tests/mpi_util.py)
    r = run_script(DIGITS[1:] + ["--epochs", "1", "--run-dir", str(run)], env=_env(), cwd=str(ROOT), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "sample/s" not in r.stdout + r.stderr and "\r" not in r.stdout   # no bar without a terminal
    assert r.stdout.splitlines()[0].startswith("rank 0 gpu=v100")

    again = run_script(DIGITS[1:] + ["--epochs", "1", "--run-dir", str(run)], env=_env(), cwd=str(ROOT), timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    first = again.stdout.splitlines()[0]
    assert first == f"hpc-jabas: run_dir {str(run)!r} already finished at epoch 1 of 1; --epochs 2 (or more) to go on"
    assert (again.stdout + again.stderr).count("already finished") == 1, again.stdout + again.stderr
    assert "samples=0 " in again.stdout                           # it trained nothing


def test_bar_wanted_rules(monkeypatch):
    from hpc_jabas.runtime.progress import bar_wanted

    class TTY:
        def isatty(self):
            return True

    class Pipe:
        def isatty(self):
            return False
    hjlog.configure("info")
    assert bar_wanted(TTY(), env={}) is True
    assert bar_wanted(Pipe(), env={}) is False
    assert bar_wanted(TTY(), env={"SLURM_JOB_ID": "7"}) is False                      # a batch job
    assert bar_wanted(TTY(), env={"SLURM_JOB_ID": "7", "SLURM_PTY_PORT": "1"}) is True   # srun --pty
    assert bar_wanted(TTY(), env={"HPC_JABAS_PROGRESS": "0"}) is False
    hjlog.configure("warning")                                                         # --quiet
    try:
        assert bar_wanted(TTY(), env={}) is False
    finally:
        hjlog.configure("info")


def test_log_record_is_one_write_with_prefixed_lines(monkeypatch):
    r, w = os.pipe()
    calls: list[bytes] = []
    real = os.write

    def spy(fd, data):
        if fd == w:
            calls.append(bytes(data))
        return real(fd, data)
    stream = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(os, "write", spy)
    hjlog.configure("info")
    hjlog.set_rank(2)
    try:
        lg = hjlog.get_logger("hpc_jabas.test")
        lg.warning("first line\nsecond line of the same record")
        lg.warning("x" * 3000)
    finally:
        hjlog.set_rank(0)
        monkeypatch.undo()
        hjlog.configure("info")
        stream.close()
    text = os.read(r, 1 << 16).decode()
    os.close(r)
    assert len(calls) == 2, calls                                  # one system call per record
    assert calls[0] == b"hpc-jabas[2] WARNING: first line\nhpc-jabas[2]   second line of the same record\n"
    assert calls[1].endswith(b"x\n") and len(calls[1]) == len("hpc-jabas[2] WARNING: ") + 3001
    assert text.count("\n") == 3


def test_console_writer_takes_the_lines_while_a_bar_is_up():
    got: list[str] = []
    hjlog.configure("info")
    hjlog.set_console_writer(got.append)
    try:
        hjlog.get_logger("hpc_jabas.test").log(logging.INFO, "above the bar")
    finally:
        hjlog.set_console_writer(None)
    assert got == ["hpc-jabas[0] INFO: above the bar"]


def test_iterate_draws_a_bar_only_on_a_terminal():
    import io

    from hpc_jabas.runtime.progress import iterate

    class TTY(io.StringIO):
        def isatty(self):
            return True
    hjlog.configure("info")
    tty, pipe = TTY(), io.StringIO()
    assert list(iterate([1, 2, 4], "profile", "size", file=tty)) == [1, 2, 4]
    assert list(iterate([1, 2, 4], "profile", "size", file=pipe)) == [1, 2, 4]
    assert list(iterate([1, 2, 4], "profile", "size", rank=1, file=tty)) == [1, 2, 4]
    assert "profile: 100%" in tty.getvalue() and "3/3" in tty.getvalue()
    assert pipe.getvalue() == ""


@pytest.mark.mpi
def test_no_bar_under_mpirun_into_a_pipe(tmp_path):
    """Open MPI gives every rank a pseudo-terminal for stdout even when mpirun's own stdout is a pipe:
    the bar follows mpirun's stdout (here a pipe: no bar)."""
    env = dict(_env(), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # one record per rank, delimited, in one write: the two ranks' output may arrive interleaved, even mid-line
    probe = ("import sys, os; from hpc_jabas.runtime.progress import bar_wanted, launcher_stdout_is_tty; "
             "sys.stdout.write(f\"<R{os.environ['OMPI_COMM_WORLD_RANK']} {sys.stdout.isatty()} "
             "{launcher_stdout_is_tty(dict(os.environ))} {bar_wanted()}>\\n\"); sys.stdout.flush()")
    r = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", PY, "-c", probe], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = sorted(m.split() for m in re.findall(r"<R([^<>]*)>", r.stdout))
    assert [row[0] for row in rows] == ["0", "1"], r.stdout
    assert all(row[2:] == ["False", "False"] for row in rows), r.stdout
