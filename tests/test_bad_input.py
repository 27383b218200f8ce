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
    """The rows refused before anything asks Slurm, run without the cluster (the full table needs it)."""
    picked = [c for c in CASES if c.id in NO_SLURM]
    assert len(picked) == len(NO_SLURM)
    rows = run_table(tmp_path / "bad", picked)
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
        from hpc_jabas.core.jobspec import JobSpec
        def spec(config):
            return JobSpec(task="m:f", config=config, chain_dir=str(tmp_path), mix={"a100": 1})
        _trust_group(spec({"output": {"trust_group": True}}))
        assert trust_group()
        _trust_group(spec({"trust_group": False}))
        assert not trust_group()
    finally:
        set_trust_group(False)
