"""Malformed inputs to `hpc-jabas submit`, `plan`, `status`, `profile`, `report` and the example's flags.

Each gives exit 2, exactly one line on stderr (no traceback), and modifies no existing file (every file of the
work directory and the repository's job files hashed before and after). The table (:data:`CASES`) runs
in-process (``main(argv)`` with stderr captured, SystemExit caught); a few run as real subprocesses to prove the
exit code and the absence of a traceback end to end. The table and :func:`run_table` live in
tests/support/bad_input.py: bench/faults.py counts the same rows for its ``bad_inputs_clear`` figure.

`submit` validates against the real local Slurm (GPU types, partitions, memory caps), so the table needs the
cluster (the ``slurm_cluster`` fixture starts it; never skipped).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.bad_input import CASES, NO_SLURM, PY, ROOT, digest, prepare, run_table, verdict, watched


@pytest.mark.slurm
def test_every_malformed_input_is_one_clear_line_and_exit_2(slurm_cluster, slurm_tmp):
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)
    rows = run_table(slurm_tmp / "bad")
    bad = [f"{r['id']}: {r['why']}: {r['stderr']}" for r in rows if not r["ok"]]
    assert not bad, "\n".join(bad)


@pytest.mark.slurm
def test_a_few_as_real_subprocesses(slurm_cluster, slurm_tmp):
    d = slurm_tmp / "bad"
    prepare(d)
    before = digest(watched(d))
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{d}")
    picks = ["submit-task-returns-none", "plan-batch-text", "status-file", "report-out-is-dir",
             "example-slowdown-bad-factor"]
    for c in (c for c in CASES if c.id in picks):
        argv = [a.replace("{d}", str(d)) for a in c.argv]
        cmd = [PY, str(ROOT / "examples" / "train_digits.py"), *argv] if c.example else \
            [PY, "-m", "hpc_jabas.cli.main", *argv]
        r = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True, timeout=120)
        assert verdict(r.returncode, r.stderr) == "", (c.id, r.returncode, r.stderr)
    assert digest(watched(d)) == before


def test_rows_that_need_no_slurm(tmp_path):
    """The rows refused before anything asks Slurm, run without the cluster (the full table needs it). In a
    process of its own: the rows run in-process (the CLI's main, the example's run_main), and a test process that
    earlier tests left with a backend running, or with a launcher's variables, is not where a user runs them (a
    pytest-xdist worker died in this test twice in the full suite, never alone)."""
    picked = [c for c in CASES if c.id in NO_SLURM]
    assert len(picked) == len(NO_SLURM)
    code = ("import json, sys; from pathlib import Path; from support.bad_input import CASES, NO_SLURM, run_table; "
            "rows = run_table(Path(sys.argv[1]), [c for c in CASES if c.id in NO_SLURM]); "
            "Path(sys.argv[2]).write_text(json.dumps(rows))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "TORCHELASTIC",
                                                                    "RANK", "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), str(ROOT)])
    out = tmp_path / "rows.json"
    p = subprocess.run([PY, "-c", code, str(tmp_path / "bad"), str(out)], env=env, cwd=str(ROOT),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and out.exists(), p.stdout[-2000:] + p.stderr[-4000:]
    rows = json.loads(out.read_text())
    bad = [f"{r['id']}: {r['why']}: {r['stderr']}" for r in rows if not r["ok"]]
    assert not bad, "\n".join(bad)


def test_wait_timeout_says_the_job_is_still_running(monkeypatch):
    from hpc_jabas.cli.submit import stopped_line
    from hpc_jabas.slurm import watch
    monkeypatch.setattr(watch, "sacct_states", lambda ids: {ids[0]: {"State": "RUNNING"}})
    line = stopped_line({"ok": False, "job_id": "42", "state": "timeout", "jobs": ["42"]}, 30.0, "/c")
    assert "--timeout 30 s reached: job 42 is still running" in line and "timeout without" not in line
    monkeypatch.setattr(watch, "sacct_states", lambda ids: {ids[0]: {"State": "PENDING"}})
    assert "still pending in the queue" in stopped_line({"job_id": "42", "state": "timeout"}, 5.0, "/c")
    ended = stopped_line({"job_id": "42", "state": "FAILED"}, None, "/c")
    assert "job 42 is FAILED without finishing the training" in ended


def test_probe_dir_checks_without_leaving_anything(tmp_path):
    from hpc_jabas.cli.paths import probe_dir
    from hpc_jabas.errors import ConfigError
    (tmp_path / "f").write_text("x")
    probe_dir(tmp_path, "out")
    probe_dir(tmp_path / "a" / "b" / "c", "out")
    assert sorted(os.listdir(tmp_path)) == ["f"]                   # made and removed again
    for bad, msg in ((tmp_path / "f", "is a file"), (tmp_path / "f" / "sub", "is a file"),
                     (Path("/proc/hj-probe/x"), "cannot be made")):
        with pytest.raises(ConfigError, match=msg):
            probe_dir(bad, "out")


def test_dry_run_checks_the_types_of_the_task_parts():
    """A task returning model="resnet" is refused by submit's dry run (not by every job of the chain)."""
    import torch

    from hpc_jabas import Task
    from hpc_jabas.errors import ConfigError
    m = torch.nn.Linear(2, 2)
    ok = {"model": m, "optimizer": torch.optim.SGD(m.parameters(), lr=0.1),
          "dataset": torch.utils.data.TensorDataset(torch.zeros(4, 2)), "loss_fn": torch.nn.MSELoss()}
    Task.from_parts(ok, "t:ok")
    Task.from_parts(dict(ok, dataset=torch.utils.data.DataLoader(ok["dataset"])), "t:ok")
    for key, value, say in (("model", "resnet", "model=builtins.str ('resnet'); it must be a torch.nn.Module"),
                            ("optimizer", m, "it must be a torch.optim.Optimizer"),
                            ("dataset", 5, "it must be a map-style Dataset"),
                            ("loss_fn", "mse", "loss_fn=builtins.str ('mse'); it must be callable")):
        with pytest.raises(ConfigError) as e:
            Task.from_parts(dict(ok, **{key: value}), "t:bad")
        assert say in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_status_and_submit_take_the_group_trust_setting(tmp_path):
    from hpc_jabas.cli.main import main
    from hpc_jabas.slurm import chain as chainlog
    from hpc_jabas.trust import set_trust_group, trust_group
    chainlog.append(tmp_path, "submit", job_id="1", mix={"a100": 1}, method="sbatch", by="user")
    os.chmod(chainlog.path(tmp_path), 0o664)
    try:
        assert main(["status", str(tmp_path), "--no-sacct"]) == 2          # refused: one line, exit 2
        assert main(["status", str(tmp_path), "--no-sacct", "--trust-group"]) == 0
        from hpc_jabas.cli.submit import _trust_group
        from hpc_jabas.core.config.jobspec import JobSpec
        def spec(config):
            return JobSpec(task="m:f", config=config, chain_dir=str(tmp_path), mix={"a100": 1})
        _trust_group(spec({"output": {"trust_group": True}}))
        assert trust_group()
        _trust_group(spec({"trust_group": False}))
        assert not trust_group()
    finally:
        set_trust_group(False)


# ---- every subcommand that reads a file: a binary file, a missing one, a directory -------------------------
BINARY = b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00garbage\xff\x80"
#: (id, argv with {x} the bad input, what {x} is for each kind). Kinds: "binary" (a binary file where a file, or
#: inside the directory, is read), "missing", "directory" (a directory where a file belongs; for an argument that
#: is a directory, a binary file in its place). {bin}/{dir}/{missing}: the shared inputs; {bdir:NAME}: a directory
#: whose NAME is the binary file.
UNREADABLE = [
    ("submit", ["submit", "{x}"], ("{bin}", "{missing}", "{dir}")),
    ("plan-calibration", ["plan", "--batch", "32", "--gpus", "v100:2", "--emulated", "--calibration", "{x}"],
     ("{bin}", "{missing}", "{dir}")),
    ("plan-profile", ["plan", "--batch", "32", "--gpus", "v100:2", "--profile", "{x}"],
     ("{bdir:allreduce.json}", "{missing}", "{bin}")),
    ("status", ["status", "{x}", "--no-sacct"], ("{bdir:chain.jsonl}", "{missing}", "{bin}")),
    ("report", ["report", "{x}"], ("{bdir:metrics.jsonl}", "{missing}", "{bin}")),
    ("export", ["export", "{x}", "{out}"], ("{bin}", "{missing}", "{dir}")),
    ("simulate-cluster", ["simulate", "{x}", str(ROOT / "examples" / "sim" / "job_gnmt.toml")],
     ("{bin}", "{missing}", "{dir}")),
    ("simulate-job", ["simulate", str(ROOT / "examples" / "sim" / "cluster_a.toml"), "{x}"],
     ("{bin}", "{missing}", "{dir}")),
]
KINDS = ("binary", "missing", "directory")


def _bad_input(d: Path, spec: str) -> Path:
    if spec.startswith("{bdir:"):
        sub = d / f"bdir-{spec[6:-1].replace('.', '-')}"
        sub.mkdir(exist_ok=True)
        (sub / spec[6:-1]).write_bytes(BINARY)
        return sub
    return {"{bin}": d / "binary.toml", "{missing}": d / "missing" / "nope.toml", "{dir}": d / "adir"}[spec]


def _main_lines(argv: list[str], capsys, env: dict | None = None) -> tuple[object, list[str], str]:
    from hpc_jabas.cli.main import main
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    err = capsys.readouterr().err
    return code, [ln for ln in err.splitlines() if ln.strip()], err


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("row", [r[0] for r in UNREADABLE])
def test_an_unreadable_input_is_one_line_naming_the_file_exit_2(tmp_path, capsys, row, kind):
    _, argv, inputs = next(r for r in UNREADABLE if r[0] == row)
    (tmp_path / "binary.toml").write_bytes(BINARY)
    (tmp_path / "adir").mkdir()
    x = _bad_input(tmp_path, inputs[KINDS.index(kind)])
    argv = [a.replace("{x}", str(x)).replace("{out}", str(tmp_path / "out.pt")) for a in argv]
    code, lines, err = _main_lines(argv, capsys)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    line = lines[0]
    assert line.startswith("hpc-jabas: error: ") and str(x) in line, line
    if inputs[KINDS.index(kind)].startswith("{bdir:") or (kind == "binary" and row != "export"):
        assert "not UTF-8" in line or "not valid UTF-8" in line, line
    if kind == "missing":
        assert "does not exist" in line, line
    assert not (tmp_path / "out.pt").exists()
    # --debug (after the subcommand, or before it) and HPC_JABAS_DEBUG=1 show the traceback, same line, same exit
    for dargv, env in (([*argv, "--debug"], None), (["--debug", *argv], None), (argv, {"HPC_JABAS_DEBUG": "1"})):
        code2, lines2, err2 = _main_lines(dargv, capsys, env)
        assert code2 == 2 and "Traceback (most recent call last)" in err2 and lines2[-1] == line, (dargv, err2)


def test_an_input_error_no_reader_caught_is_still_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    """The last net in cli/main.py: a raw UnicodeDecodeError, TOMLDecodeError or OSError from a reader that
    does not say it itself becomes one line naming the file (found from the error or its frames), exit 2."""
    from hpc_jabas.cli import status
    f = tmp_path / "raw.bin"
    f.write_bytes(BINARY)

    def read_raw(args):
        path = f                                   # noqa: F841  (a frame local: how the line finds the file)
        return f.read_text()
    monkeypatch.setattr(status, "run", read_raw)
    code, lines, err = _main_lines(["status", str(tmp_path)], capsys)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"file {str(f)!r} is not UTF-8 text (byte 0x89 at offset 0" in lines[0], lines[0]

    def toml_raw(args):
        import tomllib
        path = tmp_path / "adir"                   # noqa: F841  (not a file: not named)
        return tomllib.loads("x = [")
    monkeypatch.setattr(status, "run", toml_raw)
    code, lines, _ = _main_lines(["status", str(tmp_path)], capsys)
    assert code == 2 and len(lines) == 1 and "is not valid TOML" in lines[0] and "expected a TOML file" in lines[0]

    def os_raw(args):
        return open(tmp_path / "gone.json")
    monkeypatch.setattr(status, "run", os_raw)
    code, lines, _ = _main_lines(["status", str(tmp_path)], capsys)
    assert code == 2 and lines == [f"hpc-jabas: error: file {str(tmp_path / 'gone.json')!r} does not exist; "
                                   "expected a readable UTF-8 input file of this command"], lines
