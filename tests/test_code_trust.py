"""Everything that names the code a job runs is trust-checked before it is read or imported (hpc_jabas/trust.py,
docs/trust.md): a job file (``hpc-jabas submit JOB.toml`` on the login node, ``python -m hpc_jabas.runtime.job.launch
JOB.toml`` on the node), a ``--config`` TOML, the ``pythonpath`` directories and the file the ``task``'s module
resolves to; and submitit's result pickle is checked on the open file it is unpickled from, after it has
appeared (``trust.open_trusted``), not by name before it exists."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.trust import Payload

from hpc_jabas import trust
from hpc_jabas.trust import UntrustedFileError

ROOT = Path(__file__).resolve().parents[1]
OTHER_UID = 12345


@pytest.fixture(autouse=True)
def _no_group_trust(monkeypatch):
    monkeypatch.delenv(trust.TRUST_GROUP_ENV, raising=False)
    trust.set_trust_group(False)
    yield
    trust.set_trust_group(False)


def _one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# ---- a job file whose task is a module another user planted -------------------------------------------------
def _job(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A job file whose task is ``planted_task:build`` in ``code/`` (its pythonpath): importing the module
    writes ``marker``. Returns (job file, code dir, module file, marker)."""
    code = tmp_path / "code"
    code.mkdir(mode=0o755)
    marker = tmp_path / "marker"
    mod = code / "planted_task.py"
    mod.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")   # no build: stops there
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\ntask = "planted_task:build"\nchain_dir = "{tmp_path / "chain"}"\n'
                   f'pythonpath = ["{code}"]\nmix = {{ v100 = 1 }}\n\n[train]\nepochs = 1\n')
    for f in (job, mod):
        os.chmod(f, 0o644)
    return job, code, mod, marker


def _make_unsafe(case: str, job: Path, code: Path, mod: Path) -> str:
    """Make one thing the job names unsafe; the start of the refusal expected."""
    if case == "world-writable job file":
        os.chmod(job, 0o666)
        return f"refusing to read job file {str(job)!r}: it is writable by every user (mode 0666)"
    if case == "job file of another user":
        os.chown(job, OTHER_UID, -1)
        return f"refusing to read job file {str(job)!r}: it is owned by uid {OTHER_UID}"
    if case == "world-writable pythonpath":
        os.chmod(code, 0o777)
        return f"refusing to use pythonpath directory {str(code)!r}: it is writable by every user (mode 0777)"
    if case == "task module of another user":
        os.chown(mod, OTHER_UID, -1)
        return (f"refusing to read task module 'planted_task' of task 'planted_task:build', file {str(mod)!r}: "
                f"it is owned by uid {OTHER_UID}")
    raise AssertionError(case)


UNSAFE = ["world-writable job file", "job file of another user", "world-writable pythonpath",
          "task module of another user"]


def _launch(job: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The node side of a job run by hand: ``python -m hpc_jabas.runtime.job.launch JOB.toml``, outside Slurm."""
    return subprocess.run([sys.executable, "-m", "hpc_jabas.runtime.job.launch", str(job)], capture_output=True,
                          text=True, timeout=300, cwd=str(cwd),
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(cwd)})


def test_the_launcher_imports_the_task_of_a_job_file_it_trusts(tmp_path):
    """The control: with every file private, the launcher does import the module (so the marker's absence
    below is the refusal's doing); it then stops in one line on the missing builder."""
    job, _, _, marker = _job(tmp_path)
    r = _launch(job, tmp_path)
    line = _one_line(r.stderr)
    assert r.returncode == 2 and marker.read_text() == "ran", r.stderr
    assert "module 'planted_task' has no attribute 'build'" in line, line


@pytest.mark.parametrize("case", UNSAFE)
def test_the_launcher_refuses_a_job_file_whose_code_others_could_write(tmp_path, case):
    job, code, mod, marker = _job(tmp_path)
    say = _make_unsafe(case, job, code, mod)
    r = _launch(job, tmp_path)
    line = _one_line(r.stderr)
    assert r.returncode == 2 and say in line, line
    assert not marker.exists(), "the planted module ran"


@pytest.fixture
def no_slurm(monkeypatch):
    """Nothing may reach Slurm (a refusal comes first)."""
    from hpc_jabas.slurm import components, executor

    def never(*a, **k):
        raise AssertionError("reached Slurm")
    monkeypatch.setattr(executor, "run_sbatch", never)
    monkeypatch.setattr(executor, "submit", never)
    monkeypatch.setattr(components, "partition_view", never)


@pytest.mark.parametrize("case", UNSAFE)
def test_submit_refuses_a_job_file_whose_code_others_could_write_before_slurm(tmp_path, case, no_slurm, capsys,
                                                                              monkeypatch):
    from hpc_jabas.cli.main import main
    job, code, mod, marker = _job(tmp_path)
    monkeypatch.chdir(tmp_path)
    say = _make_unsafe(case, job, code, mod)
    rc = main(["submit", str(job)])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and line.startswith(f"hpc-jabas: error: {say}"), line
    assert not marker.exists() and not (tmp_path / "chain").exists()
    assert "planted_task" not in sys.modules


def test_a_group_writable_job_file_needs_group_trust_from_the_environment(tmp_path, monkeypatch):
    """The file's own trust_group key cannot vouch for it (it is read after the check): the refusal names the
    environment variable, which a trust_group job's scripts export."""
    from hpc_jabas.runtime.job.launch import spec_from_file
    job, _, _, _ = _job(tmp_path)
    os.chmod(job, 0o664)
    with pytest.raises(UntrustedFileError) as e:
        spec_from_file(str(job))
    msg = str(e.value)
    assert "\n" not in msg and "writable by its group (mode 0664)" in msg, msg
    assert f"export {trust.TRUST_GROUP_ENV}=1" in msg and "trust_group = true in the job's config" not in msg, msg
    monkeypatch.setenv(trust.TRUST_GROUP_ENV, "1")
    assert spec_from_file(str(job)).task == "planted_task:build"


def test_the_launcher_checks_the_code_of_a_json_job_spec_too(tmp_path):
    """A job spec written by submit (checked as a file already) names a pythonpath: the node checks it again,
    before anything is imported (the directory could have been opened to others since)."""
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.runtime.job.launch import run_job
    _, code, _, marker = _job(tmp_path)
    spec = JobSpec(task="planted_task:build", config={"epochs": 1}, chain_dir=str(tmp_path / "chain"),
                   mix={"v100": 1}, method="sbatch", pythonpath=[str(code)])
    os.chmod(code, 0o777)
    with pytest.raises(UntrustedFileError, match=f"pythonpath directory {str(code)!r}: it is writable by every"):
        run_job(spec)
    assert not marker.exists() and "planted_task" not in sys.modules


# ---- a --config file ------------------------------------------------------------------------------------
def _config(tmp_path: Path) -> Path:
    f = tmp_path / "cfg.toml"
    f.write_text("[train]\nepochs = 3\n")
    os.chmod(f, 0o644)
    return f


def test_a_config_file_others_can_write_is_refused_before_it_is_read(tmp_path):
    import hpc_jabas
    from hpc_jabas.core.config.sections import JobConfig
    f = _config(tmp_path)
    ap = hpc_jabas.ArgumentParser()
    hpc_jabas.add_arguments(ap)
    assert hpc_jabas.config_from_args(ap.parse_args(["--config", str(f)])).epochs == 3
    assert JobConfig.from_toml(f).epochs == 3
    for fix, say in ((lambda: os.chmod(f, 0o666), "it is writable by every user (mode 0666)"),
                     (lambda: (os.chmod(f, 0o644), os.chown(f, OTHER_UID, -1)), f"it is owned by uid {OTHER_UID}"),
                     (lambda: (os.chown(f, 0, 0), os.chmod(tmp_path, 0o777)),
                      f"its directory {str(tmp_path)!r} is writable by every user")):
        fix()
        for read in (lambda: hpc_jabas.config_from_args(ap.parse_args(["--config", str(f)])),
                     lambda: JobConfig.from_toml(f)):
            with pytest.raises(UntrustedFileError) as e:
                read()
            msg = str(e.value)
            assert "\n" not in msg and msg.startswith(f"refusing to read config file {str(f)!r}: ") and say in msg, msg
    os.chmod(tmp_path, 0o700)


def test_a_script_given_a_config_file_others_can_write_says_one_line_and_exits_2(tmp_path):
    f = _config(tmp_path)
    os.chmod(f, 0o666)
    script = tmp_path / "train.py"
    script.write_text("import hpc_jabas\n\n\ndef main(argv=None):\n    ap = hpc_jabas.ArgumentParser()\n"
                      "    hpc_jabas.add_arguments(ap)\n    cfg = hpc_jabas.config_from_args(ap.parse_args(argv))\n"
                      f"    open({str(tmp_path / 'trained')!r}, 'w').write(str(cfg.epochs))\n\n\n"
                      "hpc_jabas.run_main(main)\n")
    r = subprocess.run([sys.executable, str(script), "--config", str(f)], capture_output=True, text=True,
                       timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    line = _one_line(r.stderr)
    assert r.returncode == 2 and f"refusing to read config file {str(f)!r}: it is writable by every user" in line, line
    assert not (tmp_path / "trained").exists()
    os.chmod(f, 0o644)                                # the control: the same script with a private config trains
    r = subprocess.run([sys.executable, str(script), "--config", str(f)], capture_output=True, text=True,
                       timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    assert r.returncode == 0 and (tmp_path / "trained").read_text() == "3", r.stderr[-2000:]


# ---- submitit's result pickle: checked on the open file, after it has appeared ------------------------------
def _result_job(folder: Path):
    from hpc_jabas.slurm.executor import JabasSlurmJob
    job = JabasSlurmJob(folder=folder, job_id="77", tasks=[0])
    job._results_timeout_s = 30                   # submitit waits this long for the file (the test: far less)
    return job


def _appears_later(path: Path, data: bytes, uid: int | None = None, after_s: float = 1.5) -> threading.Thread:
    """The pickle is moved into place ``after_s`` after the reader started waiting (as submitit's job does: a
    rename), owned by ``uid`` when given."""
    def put():
        time.sleep(after_s)
        tmp = path.with_name(".planting")
        tmp.write_bytes(data)
        if uid is not None:
            os.chown(tmp, uid, -1)
        os.rename(tmp, path)
    t = threading.Thread(target=put)
    t.start()
    return t


def test_a_result_pickle_that_appears_after_the_check_in_a_folder_others_can_write_is_refused(tmp_path):
    folder = tmp_path / "submitit"
    folder.mkdir()
    os.chmod(folder, 0o777)                       # e.g. made under a umask of 000: anyone can put a file there
    job, marker = _result_job(folder), tmp_path / "marker"
    t = _appears_later(job.paths.result_pickle, pickle.dumps(("success", Payload(str(marker)))))
    with pytest.raises(UntrustedFileError) as e:
        job._get_outcome_and_result()
    t.join()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"refusing to read submitit result {str(job.paths.result_pickle)!r}: "
                                              f"its directory {str(folder)!r} is writable by every user"), msg
    assert job.paths.result_pickle.exists() and not marker.exists()


def test_a_result_pickle_of_another_user_that_appears_late_is_refused_and_ours_is_read(tmp_path):
    folder = tmp_path / "submitit"
    folder.mkdir(mode=0o755)
    job, marker = _result_job(folder), tmp_path / "marker"
    rp = job.paths.result_pickle
    t = _appears_later(rp, pickle.dumps(("success", Payload(str(marker)))), uid=OTHER_UID)
    with pytest.raises(UntrustedFileError, match=f"submitit result .*owned by uid {OTHER_UID}"):
        job._get_outcome_and_result()
    t.join()
    assert not marker.exists()
    rp.unlink()                                   # the control: our own result, appearing late, is waited for
    t = _appears_later(rp, pickle.dumps(("success", {"job_id": "77", "iteration": 12})))
    assert job._get_outcome_and_result() == ("success", {"job_id": "77", "iteration": 12})
    t.join()


def test_open_trusted_reads_the_file_it_checked_and_refuses_what_is_not_one(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    f = d / "r.pkl"
    f.write_bytes(b"ours")
    os.chmod(f, 0o644)
    with trust.open_trusted(f, "submitit result") as fh:
        os.unlink(f)                              # swapped by name after the open: what was checked is read
        f.write_bytes(b"theirs")
        assert fh.read() == b"ours"
    missing = d / "missing.pkl"
    trust.check_file(missing, "submitit result")  # check_file passes a missing file (the reader reports it) ...
    with pytest.raises(FileNotFoundError):        # ... open_trusted never passes anything unchecked
        trust.open_trusted(missing, "submitit result")
    link = d / "link.pkl"
    link.symlink_to(f)
    with pytest.raises(UntrustedFileError, match=f"submitit result {str(link)!r}: it is a symbolic link"):
        trust.open_trusted(link, "submitit result")
    fifo = d / "fifo.pkl"
    os.mkfifo(fifo, 0o600)                        # a FIFO would block an open for reading: refused at once
    with pytest.raises(UntrustedFileError, match=r"fifo.pkl': it is not a regular file \(mode p"):
        trust.open_trusted(fifo, "submitit result")


# ---- the one test on the local Slurm cluster: real submitit jobs' results ---------------------------------------
def opens_its_folder_then_returns_a_payload(folder: str, marker: str) -> Payload:
    """A submitted function (run on a node): after the node entry's check of the submitted pickle, the job's
    folder becomes world-writable (as if opened to others), and the result it writes there would create
    ``marker`` when unpickled: a result pickle that appears after the reader's check, in a folder others can
    write."""
    os.chmod(folder, 0o777)
    return Payload(marker)


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_real_submitit_results_are_read_from_the_checked_file_once_they_appear(slurm_cluster, slurm_tmp):
    import operator

    from hpc_jabas.slurm.executor import JabasSlurmExecutor

    def executor(folder: Path) -> JabasSlurmExecutor:
        ex = JabasSlurmExecutor(folder, num_tasks=1, python=slurm_cluster.python)
        ex.update_parameters(partition="v100", mem="256M", nodes=1, ntasks_per_node=1, time=5,
                             job_name="hj-codetrust", setup=[f"export PYTHONPATH={ROOT}:{ROOT / 'tests'}"],
                             additional_parameters={"chdir": str(slurm_tmp)})
        return ex
    # the control: our own job's result comes back (node_entry checked the submitted pickle on the node)
    job = executor(slurm_tmp / "ok" / "submitit").submit(operator.mul, 6, 7)
    assert job.result() == 42
    assert job.paths.result_pickle.stat().st_mode & 0o022 == 0      # node_entry's umask: ours to trust
    # read as submitit does once sacct says the job ended, before the file is there (a slow file system)
    folder, marker = slurm_tmp / "opened" / "submitit", slurm_tmp / "marker"
    job = executor(folder).submit(opens_its_folder_then_returns_a_payload, str(folder), str(marker))
    job._results_timeout_s = 120
    with pytest.raises(UntrustedFileError) as e:
        job._get_outcome_and_result()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"refusing to read submitit result {str(job.paths.result_pickle)!r}: "
                                              f"its directory {str(folder)!r} is writable by every user"), msg
    assert job.paths.result_pickle.exists() and not marker.exists(), "the result's payload ran"
    os.chmod(folder, 0o755)
