"""The write side of trust (hpc_jabas/trust.py, docs/trust.md): before the first write, a run directory (and a
chain directory) must be this user's and not writable by others, with the same ancestors rule as the read
side, and nothing but our own regular files where the project's files go; every file is opened without
following a link. A planted link is refused in one line and its target keeps its bytes. metrics.jsonl is
written in whole lines: a torn last line is set aside, never glued onto, and readers say what they leave out.
An empty run_dir and a file named ``checkpoints`` are one line before training."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpc_jabas import trust
from hpc_jabas.cli.report import load_metrics
from hpc_jabas.core.config.sections import JobConfig
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.comm.world import World
from hpc_jabas.runtime.hooks import Callback
from hpc_jabas.runtime.metrics import MetricsWriter
from hpc_jabas.runtime.persist.dirlock import DirLock
from hpc_jabas.runtime.trainer import Trainer
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.trust import UntrustedFileError

OTHER_UID = 12345
PRECIOUS = b"precious bytes of a file outside the run directory\n"


@pytest.fixture(autouse=True)
def _no_group_trust():
    trust.set_trust_group(False)
    yield
    trust.set_trust_group(False)


class _Steps(Callback):
    """Counts the training steps a run took (none, when it was refused before training)."""

    def __init__(self) -> None:
        self.n = 0

    def on_step_end(self, trainer, rec) -> None:
        self.n += 1


def _data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())


def _trainer(steps: _Steps | None = None, **kw) -> Trainer:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    cfg = JobConfig(**{"batch": 32, "epochs": 1, **kw})
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _data(), torch.nn.CrossEntropyLoss(),
                   config=cfg, world=World(rank=0, size=1, gpu_types=("v100",)),
                   callbacks=[steps] if steps is not None else ())


def _refused(run_dir: Path, **kw) -> str:
    """A real one-process run in ``run_dir`` that must be refused before training: its one line."""
    steps = _Steps()
    with pytest.raises(ConfigError) as e:
        _trainer(steps, run_dir=str(run_dir), **kw).fit()
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert steps.n == 0, f"refused after {steps.n} training steps"
    return msg


def _tree(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*")) if d.exists() else []


def test_a_run_dir_another_user_owns_is_refused_and_nothing_is_written_into_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    os.chown(run, OTHER_UID, -1)
    msg = _refused(run)
    assert f"refusing to use run directory {str(run)!r}" in msg and f"owned by uid {OTHER_UID}" in msg, msg
    assert _tree(run) == []
    os.chown(run, os.geteuid(), -1)                    # the control: once it is ours, the same run trains
    steps = _Steps()
    _trainer(steps, run_dir=str(run)).fit()
    assert steps.n == 2 and (run / "metrics.jsonl").is_file() and (run / "checkpoints").is_dir()


@pytest.mark.parametrize("name", [".hpc-jabas.lock", "metrics.jsonl", "progress.json", "calibration.json"])
@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_a_link_planted_where_our_file_goes_is_refused_and_its_target_keeps_its_bytes(tmp_path, name, dangling):
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir(mode=0o755)
    outside.mkdir()
    target = outside / "target"
    if not dangling:
        target.write_bytes(PRECIOUS)
    (run / name).symlink_to(target)
    msg = _refused(run)
    assert f"{str(run / name)!r}: it is a symbolic link" in msg and "never through a link" in msg, msg
    if dangling:
        assert not target.exists()                    # O_CREAT through the link would have made it
    else:
        assert target.read_bytes() == PRECIOUS
    assert (run / name).is_symlink() and _tree(run) == [name]


def _open_metrics(p: Path) -> None:
    MetricsWriter(p).write({"type": "x"})


def _lock(p: Path) -> None:
    DirLock(p.parent).acquire().release()


def _chain(p: Path) -> None:
    chainlog.append(p.parent, "submit", job_id="1")


def _replace(p: Path) -> None:
    trust.write_atomic_nofollow(p, b"{}", "progress record")


@pytest.mark.parametrize("write,name", [(_open_metrics, "metrics.jsonl"), (_lock, ".hpc-jabas.lock"),
                                        (_chain, "chain.jsonl"), (_replace, "progress.json"),
                                        (_replace, "progress.json.tmp")])
def test_every_writer_refuses_a_link_by_itself(tmp_path, write, name):
    """Each writer opens with O_NOFOLLOW (or renames into place) and refuses a link, whether or not the run
    directory's check ran first (a link planted between that check and the write)."""
    d, target = tmp_path / "d", tmp_path / "target"
    d.mkdir(mode=0o755)
    target.write_bytes(PRECIOUS)
    (d / name).symlink_to(target)
    with pytest.raises(UntrustedFileError) as e:
        write(d / name.removesuffix(".tmp"))
    assert "symbolic link" in str(e.value) and "\n" not in str(e.value), e.value
    assert target.read_bytes() == PRECIOUS and (d / name).is_symlink()


def test_a_named_pipe_where_the_metrics_go_is_one_line_not_a_hang(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    os.mkfifo(run / "metrics.jsonl")
    msg = _refused(run)
    assert f"metrics record {str(run / 'metrics.jsonl')!r} is a named pipe" in msg, msg


def test_a_file_of_another_user_where_our_file_goes_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    planted = run / "metrics.jsonl"
    planted.write_bytes(PRECIOUS)
    os.chown(planted, OTHER_UID, -1)
    msg = _refused(run)
    assert f"refusing to write metrics record {str(planted)!r}: it is owned by uid {OTHER_UID}" in msg, msg
    assert planted.read_bytes() == PRECIOUS


def test_a_world_writable_parent_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    run = shared / "run"
    msg = _refused(run)
    assert f"the directory {str(shared)!r} it would be made in is writable by every user (mode 0777)" in msg, msg
    assert not run.exists()
    run.mkdir(mode=0o755)                               # an existing run dir below it: refused the same way
    msg = _refused(run)
    assert f"the directory {str(shared)!r} above it is writable by every user" in msg, msg
    assert _tree(run) == []
    os.chmod(shared, 0o1777)                            # sticky, as /tmp: others cannot swap what is ours
    steps = _Steps()
    _trainer(steps, run_dir=str(run)).fit()
    assert steps.n == 2 and (run / "metrics.jsonl").is_file()


def test_a_group_writable_run_dir_only_with_trust_group(tmp_path):
    team = tmp_path / "team"
    team.mkdir()
    os.chmod(team, 0o775)
    run = team / "run"
    msg = _refused(run)
    assert "is writable by its group (mode 0775)" in msg and "trust_group = true" in msg, msg
    assert not run.exists()
    steps = _Steps()
    _trainer(steps, run_dir=str(run), trust_group=True).fit()
    assert steps.n == 2 and (run / "checkpoints").is_dir()
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["type"] for r in recs].count("iteration") == 2


def test_a_torn_metrics_line_is_set_aside_and_the_next_records_are_whole(tmp_path, capfd):
    run = tmp_path / "run"
    _trainer(run_dir=str(run)).fit()
    log = run / "metrics.jsonl"
    before = log.read_bytes()
    torn = b'{"type": "iteration", "it": 7, "epoch": 0, "B": 32, "lo'      # a write cut short: no line end
    with open(log, "ab") as f:
        f.write(torn)
    capfd.readouterr()
    _trainer(run_dir=str(run), epochs=2).fit()             # resumes, appends its records
    aside = run / "metrics.jsonl.torn-1"
    assert aside.read_bytes() == torn
    err = capfd.readouterr().err
    assert f"ended in a torn line ({len(torn)} bytes" in err and f"set aside in {aside}" in err, err
    after = log.read_bytes()
    assert after.startswith(before) and after.endswith(b"\n")
    recs = [json.loads(ln) for ln in after[len(before):].splitlines()]        # every new line is a record
    assert {"start", "resume"} <= {r["type"] for r in recs}, recs[:2]
    assert [r["it"] for r in recs if r["type"] == "iteration"] == [2, 3]
    assert len(load_metrics(run)) == len(before.splitlines()) + len(recs)


def test_readers_keep_a_record_glued_onto_a_torn_line_and_say_so(tmp_path, capfd):
    """A log torn before this fix (or by a kill while it is read): the record glued after the torn bytes is
    read, and the reader says what it left out."""
    log = tmp_path / "metrics.jsonl"
    glued = {"type": "start", "it": 5, "world": 1}
    torn = '{"type": "iteration", "it": 5, "stats": {"a": 1}, "lo'
    log.write_text(json.dumps({"type": "iteration", "it": 4}) + "\n" + torn + json.dumps(glued) + "\n"
                   + '{"type": "iteration", "it"')
    recs = load_metrics(tmp_path)
    assert recs == [{"type": "iteration", "it": 4}, glued]
    err = capfd.readouterr().err
    assert f"{log} line 2: {len(torn)} torn bytes" in err and "the record kept" in err, err
    assert f"{log} line 3: a torn last line" in err, err


def test_a_full_disk_never_leaves_a_torn_line_of_ours(tmp_path):
    """``ulimit -f`` in a child process: the write that crosses the limit is cut short, then EFBIG; the log is
    taken back to its last whole line, and the error is one line naming the file (a ConfigError: exit 2)."""
    log = tmp_path / "metrics.jsonl"
    code = f"""
import resource, signal, sys
from pathlib import Path
from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.metrics import MetricsWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (5000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
w = MetricsWriter(Path({str(log)!r}))
n = 0
try:
    while True:
        w.write({{"type": "iteration", "it": n, "pad": "x" * 333}})
        n += 1
except ConfigError as e:
    print(n, 27 if "File too large" in str(e) and str({str(log)!r}) in str(e) and "\\n" not in str(e) else -1)
"""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    n, err = map(int, r.stdout.split())
    data = log.read_bytes()
    assert err == 27 and n >= 10 and data.endswith(b"\n") and len(data) <= 5000   # EFBIG
    assert [json.loads(ln)["it"] for ln in data.splitlines()] == list(range(n))


def test_an_empty_run_dir_is_one_line_and_nothing_is_written_in_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        _trainer(run_dir="").fit()
    msg = str(e.value)
    assert msg.startswith("run_dir='' is empty") and "--run-dir" in msg and "\n" not in msg, msg
    with pytest.raises(ConfigError, match="run_dir='' is empty"):
        JobConfig.from_dict({"run_dir": ""})
    assert _tree(tmp_path) == []


def test_a_file_named_checkpoints_is_one_line_before_training(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_bytes(PRECIOUS)
    msg = _refused(run)
    assert f"checkpoint directory {str(run / 'checkpoints')!r} is a regular file" in msg and "move it" in msg, msg
    assert (run / "checkpoints").read_bytes() == PRECIOUS and _tree(run) == ["checkpoints"]


def test_a_chain_dir_another_user_owns_or_a_planted_chain_record_is_refused(tmp_path):
    chain = tmp_path / "chain"
    chain.mkdir(mode=0o755)
    os.chown(chain, OTHER_UID, -1)
    with pytest.raises(UntrustedFileError, match=f"refusing to use chain directory .* owned by uid {OTHER_UID}"):
        chainlog.append(chain, "submit", job_id="1")
    with pytest.raises(UntrustedFileError, match="refusing to use chain directory"):
        DirLock(chain, "chain directory").acquire()
    assert _tree(chain) == []
    os.chown(chain, os.geteuid(), -1)
    chainlog.append(chain, "submit", job_id="1")
    assert [e["job_id"] for e in chainlog.read(chain)] == ["1"]


@pytest.mark.mpi
def test_two_ranks_both_refuse_a_planted_link_in_one_line_before_training(tmp_path):
    """Rank 0 checks the run directory; every rank raises its one line at the first agreement (trainer
    ``_agree_run_dir``), before any iteration, and the link's target keeps its bytes."""
    from mpi_util import run_ranks
    run, target = tmp_path / "run", tmp_path / "target"
    run.mkdir(mode=0o755)
    target.write_bytes(PRECIOUS)
    (run / "metrics.jsonl").symlink_to(target)
    res = run_ranks("guard_worker.py", {"plan": "b=8 n=1,1", "n": 64, "optimizer": "adam", "lr": 0.01, "steps": 2,
                                        "run_dir": str(run)}, np_=2)
    assert len(res) == 2
    for r in res:
        cls, msg = r["error"]
        assert cls == "ConfigError" and "\n" not in msg, r["error"]
        assert f"refusing to write metrics record {str(run / 'metrics.jsonl')!r}: it is a symbolic link" in msg, msg
    assert res[0]["error"] == res[1]["error"]
    assert target.read_bytes() == PRECIOUS and _tree(run) == ["metrics.jsonl"]
