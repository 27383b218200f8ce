"""Files others can write are not trusted (hpc_jabas/trust.py): checkpoints, their sidecars, chain records, job
specs, calibration.json, progress.json, metrics.jsonl read back and submitit result pickles are refused before
they are read when another user owns them or others may write them; a checkpoint is never code (weights_only
loading); new run and chain directories have no world write."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi_util import ROOT, WORKERS, run_script
from support.trust import Payload
from support.trust import plant as _plant

from hpc_jabas import trust
from hpc_jabas.errors import CheckpointError, ConfigError
from hpc_jabas.runtime.persist import checkpoint as ckpt
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.trust import UntrustedFileError

OTHER_UID = 12345


@pytest.fixture(autouse=True)
def _no_group_trust():
    trust.set_trust_group(False)
    yield
    trust.set_trust_group(False)


def _one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg, msg
    return msg


def _saved(tmp_path: Path) -> Path:
    return ckpt.save_in(tmp_path, {"x": torch.arange(3), "it": 1}, epoch=0, iteration=1)


def test_world_writable_checkpoint_or_sidecar_is_refused_naming_the_file_and_the_fix(tmp_path):
    p = _saved(tmp_path)
    assert ckpt.load(p)["it"] == 1
    for f in (p, ckpt.sidecar(p)):
        os.chmod(f, 0o666)
        with pytest.raises(UntrustedFileError) as e:
            ckpt.load(p)
        msg = _one_line(e.value)
        assert str(f) in msg and "writable by every user" in msg and f"chmod o-w {f}" in msg, msg
        with pytest.raises(UntrustedFileError):          # not skipped for an older one: the directory is suspect
            ckpt.load_latest(tmp_path)
        os.chmod(f, 0o644)
    assert ckpt.load(p)["it"] == 1


def test_checkpoint_owned_by_another_user_is_refused(tmp_path):
    p = _saved(tmp_path)
    os.chown(p, OTHER_UID, -1)
    with pytest.raises(UntrustedFileError) as e:
        ckpt.load(p)
    msg = _one_line(e.value)
    assert str(p) in msg and f"owned by uid {OTHER_UID}" in msg and "chown" in msg, msg


def test_group_writable_only_with_trust_group(tmp_path):
    p = _saved(tmp_path)
    os.chmod(p, 0o664)
    with pytest.raises(UntrustedFileError, match="writable by its group .*trust_group = true"):
        ckpt.load(p)
    trust.set_trust_group(True)
    assert ckpt.load(p)["it"] == 1
    os.chmod(p, 0o666)                                   # world write: never, whatever the group setting
    with pytest.raises(UntrustedFileError, match="every user"):
        ckpt.load(p)


def test_a_directory_others_can_write_is_refused_unless_sticky(tmp_path):
    d = tmp_path / "ck"
    p = _saved(d)
    os.chmod(d, 0o777)
    with pytest.raises(UntrustedFileError) as e:
        ckpt.load(p)
    msg = _one_line(e.value)
    assert f"its directory '{d}'" in msg and f"chmod o-w {d}" in msg, msg
    os.chmod(d, 0o1777)                                  # like /tmp: others cannot replace our file
    assert ckpt.load(p)["it"] == 1


def test_a_pickle_payload_does_not_run_on_load(tmp_path):
    marker = tmp_path / "marker"
    good = ckpt.save_in(tmp_path, {"it": 1}, epoch=0, iteration=1)
    evil = tmp_path / ckpt.name_for(0, 2)
    _plant(evil, {"model": Payload(str(marker))})
    assert not marker.exists()
    with pytest.raises(CheckpointError) as e:
        ckpt.load(evil)
    assert "weights_only" in _one_line(e.value) and str(evil) in str(e.value)
    assert not marker.exists()
    msgs: list[str] = []
    st, path = ckpt.load_latest(tmp_path, log=msgs.append)       # skipped with a line, the good one used
    assert path == good and st == {"it": 1} and len(msgs) == 1 and evil.name in msgs[0]
    assert not marker.exists()
    # torch's own loader, as a user would call it on our files: refused too (the format needs no pickle)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(evil, weights_only=True)
    assert not marker.exists()


def test_trainer_state_is_plain_containers_that_weights_only_reads(tmp_path):
    from collections import OrderedDict, deque
    st = {"model": OrderedDict(w=torch.ones(2)),
          "rng": {"numpy": np.random.get_state(), "torch": torch.get_rng_state()},
          "n": np.int64(3), "f": np.float32(0.5), "hist": deque([1, 2], maxlen=5), "t": (1, "a", None),
          "arr": np.arange(6, dtype=np.int32).reshape(2, 3)}
    p = ckpt.save(tmp_path / "s.pt", st)
    plain = torch.load(p, weights_only=True)                       # no hpc-jabas code, no pickle
    assert isinstance(plain["model"], OrderedDict) and plain["n"] == 3 and plain["hist"] == [1, 2]
    back = ckpt.load(p)
    assert back["rng"]["numpy"][0] == "MT19937" and np.array_equal(back["rng"]["numpy"][1], st["rng"]["numpy"][1])
    assert back["arr"].dtype == np.int32 and back["arr"].shape == (2, 3) and back["t"] == (1, "a", None)
    np.random.set_state(back["rng"]["numpy"])
    with pytest.raises(CheckpointError, match=r"cannot checkpoint state\['bad'\]: a .*Payload"):
        ckpt.save(tmp_path / "bad.pt", {"bad": Payload("x")})


def test_chain_record_checked_and_invalid_utf8_is_one_line(tmp_path):
    chainlog.append(tmp_path, "submit", job_id="1")
    assert [e["event"] for e in chainlog.read(tmp_path)] == ["submit"]
    p = chainlog.path(tmp_path)
    os.chmod(p, 0o666)
    with pytest.raises(UntrustedFileError, match="chain record .*chain.jsonl"):
        chainlog.read(tmp_path)
    os.chmod(p, 0o644)
    with open(p, "ab") as f:
        f.write(b'{"event": "end", "x": "\xff\xfe"}\n')
    with pytest.raises(ConfigError) as e:
        chainlog.read(tmp_path)
    assert "line 2 is not valid UTF-8" in _one_line(e.value)


def test_a_umask_of_002_does_not_make_our_own_files_untrusted(tmp_path):
    old = os.umask(0o002)
    try:
        chainlog.append(tmp_path / "chain", "submit", job_id="1")
        p = ckpt.save_in(tmp_path / "run" / "checkpoints", {"it": 0}, epoch=0, iteration=0)
    finally:
        os.umask(old)
    for f in (p, ckpt.sidecar(p), chainlog.path(tmp_path / "chain"), tmp_path / "run", tmp_path / "chain"):
        assert not f.stat().st_mode & 0o022, f
    assert ckpt.load(p)["it"] == 0 and chainlog.read(tmp_path / "chain")[0]["job_id"] == "1"


def test_new_run_and_chain_directories_have_no_world_write(tmp_path):
    old = os.umask(0)
    try:
        chainlog.append(tmp_path / "chain" / "deep", "submit", job_id="1")
        ckpt.save_in(tmp_path / "run" / "checkpoints", {"it": 0}, epoch=0, iteration=0)
        from hpc_jabas.runtime.persist.dirlock import DirLock
        with DirLock(tmp_path / "locked" / "run"):
            pass
    finally:
        os.umask(old)
    for d in ("chain", "chain/deep", "run", "run/checkpoints", "locked", "locked/run"):
        assert not (tmp_path / d).stat().st_mode & 0o002, d


def test_submitit_result_pickle_is_checked_before_it_is_unpickled(tmp_path):
    from hpc_jabas.slurm.executor import JabasSlurmJob
    job = JabasSlurmJob(folder=tmp_path, job_id="77", tasks=[0])
    rp = job.paths.result_pickle
    rp.parent.mkdir(parents=True, exist_ok=True)
    marker = tmp_path / "marker"
    rp.write_bytes(pickle.dumps(("success", Payload(str(marker)))))
    os.chown(rp, OTHER_UID, -1)
    with pytest.raises(UntrustedFileError, match="submitit result .*owned by uid 12345"):
        job._get_outcome_and_result()
    assert not marker.exists()


# ---- every other file of a run or chain directory that is read back ----------------------------------------
def _spec(tmp_path: Path, **config):
    from hpc_jabas.core.config.jobspec import JobSpec
    return JobSpec(task="preempt_task:build", config=dict(config), chain_dir=str(tmp_path / "chain"),
                   mix={"v100": 2}, method="sbatch")


def _job_spec_by_launch(tmp_path: Path):
    from hpc_jabas.runtime.job.launch import spec_from_file
    f = _spec(tmp_path).save(tmp_path / "chain" / "jobs" / "1.json")
    return f, lambda: spec_from_file(str(f)).mix == {"v100": 2}


def _job_spec_by_replan(tmp_path: Path):
    from hpc_jabas.slurm.replan import _spec_of
    f = _spec(tmp_path).save(tmp_path / "chain" / "jobs" / "submitit" / "spec-1.json")
    ev = [{"event": "submit", "job_id": "5", "spec": str(f)}]
    return f, lambda: _spec_of(tmp_path / "chain", "5", ev).mix == {"v100": 2}


def _calibration(tmp_path: Path):
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.perf.calibration import CALIBRATION_FILE, Calibration
    from hpc_jabas.runtime.calibrate import check_calibration
    (tmp_path / "run").mkdir()
    f = Path(Calibration.fresh(["v100"]).save(tmp_path / "run" / CALIBRATION_FILE))
    cfg = JobConfig(run_dir=str(tmp_path / "run"), calibrate=True)

    def read():
        check_calibration(cfg)
        return Calibration.load(f).ranks[0].gpu == "v100"
    return f, read


def _plan_calibration(tmp_path: Path):
    import argparse

    from hpc_jabas.cli.plan import _model
    from hpc_jabas.core.perf.calibration import Calibration
    f = Path(Calibration.fresh(["v100"]).save(tmp_path / "calibration.json"))
    args = argparse.Namespace(profile=None, emulated=True, grad_mb=None, calibration=str(f))
    return f, lambda: "calibrated by" in _model(args, ["v100"])[1]


def _progress(tmp_path: Path):
    from hpc_jabas.runtime import progress
    (tmp_path / "run").mkdir()
    f = tmp_path / "run" / progress.PROGRESS_FILE
    f.write_text(json.dumps({"job_id": "5", "time": 1.0}))
    return f, lambda: progress.read(tmp_path / "run")["job_id"] == "5"


def _metrics_file(tmp_path: Path) -> Path:
    (tmp_path / "chain" / "run").mkdir(parents=True)
    f = tmp_path / "chain" / "run" / "metrics.jsonl"
    recs = [{"type": "iteration", "it": 0},
            {"type": "autoscale", "table": [{"mix": "v100:2"}], "choice": {"v100": 2}}]
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f


def _metrics_by_launch(tmp_path: Path):
    from hpc_jabas.runtime.job.launch import _metrics
    f = _metrics_file(tmp_path)
    return f, lambda: len(_metrics(_spec(tmp_path))) == 2


def _metrics_by_replan(tmp_path: Path):
    from hpc_jabas.slurm.replan import _last_table
    f = _metrics_file(tmp_path)
    return f, lambda: _last_table(_spec(tmp_path), {"v100": 2}) == [{"mix": "v100:2"}]


def _metrics_by_report(tmp_path: Path):
    from hpc_jabas.cli.report import load_metrics
    f = _metrics_file(tmp_path)
    return f, lambda: len(load_metrics(f.parent)) == 2


READ_BACK = {"job spec (launcher)": (_job_spec_by_launch, "job spec"),
             "job spec (re-plan)": (_job_spec_by_replan, "job spec"),
             "calibration.json (perf model)": (_calibration, "calibration"),
             "calibration (plan --calibration)": (_plan_calibration, "calibration"),
             "progress.json (status)": (_progress, "progress record"),
             "metrics.jsonl (lost iterations)": (_metrics_by_launch, "metrics record"),
             "metrics.jsonl (next mix)": (_metrics_by_replan, "metrics record"),
             "metrics.jsonl (report)": (_metrics_by_report, "metrics record")}


@pytest.mark.parametrize("row", list(READ_BACK))
def test_files_read_back_are_refused_when_others_can_write_them(tmp_path, row, capsys):
    make, what = READ_BACK[row]
    f, read = make(tmp_path)
    os.chmod(f, 0o644)
    assert read() is True                                          # a normal one still loads
    os.chmod(f, 0o666)
    with pytest.raises(UntrustedFileError) as e:
        read()
    msg = _one_line(e.value)
    assert msg.startswith(f"refusing to read {what} {str(f)!r}") and f"chmod o-w {f}" in msg, msg
    os.chmod(f, 0o644)
    os.chown(f, OTHER_UID, -1)
    with pytest.raises(UntrustedFileError, match=f"{what} .*owned by uid {OTHER_UID}"):
        read()
    os.chown(f, os.geteuid(), -1)
    os.chmod(f, 0o664)                                             # group-writable: only with group trust
    with pytest.raises(UntrustedFileError, match="writable by its group"):
        read()
    trust.set_trust_group(True)
    assert read() is True


def test_a_trust_group_job_tells_its_launcher_through_the_job_script(tmp_path, monkeypatch):
    """The launcher reads the job spec before the job's config: a trust_group job's script exports
    HPC_JABAS_TRUST_GROUP=1 (Slurm keeps its own copy of the script)."""
    from hpc_jabas.slurm.sbatch import setup_lines
    assert f"export {trust.TRUST_GROUP_ENV}=1" in setup_lines(_spec(tmp_path, trust_group=True))
    assert not any(trust.TRUST_GROUP_ENV in ln for ln in setup_lines(_spec(tmp_path)))
    f = tmp_path / "f.json"
    f.write_text("{}")
    os.chmod(f, 0o664)
    with pytest.raises(UntrustedFileError):
        trust.check_file(f)
    monkeypatch.setenv(trust.TRUST_GROUP_ENV, "1")
    trust.check_file(f)


def test_our_own_read_back_files_are_trusted_under_a_umask_of_002(tmp_path):
    from hpc_jabas.runtime.metrics import MetricsWriter
    old = os.umask(0o002)
    try:
        w = MetricsWriter(tmp_path / "run" / "metrics.jsonl")
        w.write({"type": "iteration", "it": 0})
        w.close()
        jobs = trust.private_dir(tmp_path / "jobs")                 # as the executor writes a job spec
        spec = trust.make_private(_spec(tmp_path).save(jobs / "1.json"))
    finally:
        os.umask(old)
    for f in (tmp_path / "run" / "metrics.jsonl", spec):
        assert not f.stat().st_mode & 0o022, f
        trust.check_file(f)


def _run(spec: dict, tmp_path: Path) -> dict:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    sp = out / "spec.json"
    sp.write_text(json.dumps(dict(spec, out_dir=str(out))))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    r = run_script([str(WORKERS / "guard_worker.py"), str(sp)], env=env, cwd=str(ROOT), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "rank0.json").read_text())


def test_trainer_refuses_a_planted_checkpoint_and_still_resumes_a_normal_one(tmp_path):
    spec = {"plan": "b=8 n=2", "steps": 4, "n": 64, "optimizer": "adam", "lr": 0.01,
            "run_dir": str(tmp_path / "run"), "checkpoint_every": 2}
    first = _run(spec, tmp_path)
    assert first["error"] is None and first["iterations"] == 4
    newest = ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    os.chown(newest, OTHER_UID, -1)
    bad = _run(dict(spec, steps=6, resume=True), tmp_path)
    assert bad["error"][0] == "UntrustedFileError" and str(newest) in bad["error"][1]
    os.chown(newest, os.geteuid(), -1)
    ok = _run(dict(spec, steps=6, resume=True), tmp_path)
    ref = _run(dict(spec, steps=6, run_dir=str(tmp_path / "ref")), tmp_path)
    assert ok["error"] is None and ok["resumed_from"] == str(newest) and ok["iterations"] == 6
    for k, v in ref["params"].items():
        assert np.array_equal(np.array(ok["params"][k]), np.array(v)), k


def test_checkpoints_of_the_previous_format_with_numpy_state_still_load(tmp_path):
    """Written before the state became plain containers: numpy arrays and scalars (the numpy RNG state) load
    through the allow-list; a planted object next to them is still refused."""
    p = tmp_path / ckpt.name_for(0, 3)
    rng = np.random.get_state()
    _plant(p, {"rng": {"numpy": rng}, "x": np.arange(4, dtype=np.int64), "f": np.float64(1.5), "it": 3})
    st = ckpt.load(p)
    assert st["it"] == 3 and np.array_equal(st["x"], np.arange(4)) and float(st["f"]) == 1.5
    assert np.array_equal(st["rng"]["numpy"][1], rng[1])
    np.random.set_state(st["rng"]["numpy"])
    marker = tmp_path / "marker"
    _plant(p, {"rng": {"numpy": rng}, "evil": Payload(str(marker))})
    with pytest.raises(CheckpointError, match="weights_only"):
        ckpt.load(p)
    assert not marker.exists()


# ---- a second real Unix user plants files: nothing of theirs runs ------------------------------------------
PLANTER = "hjplanter"
PLANTER_PY = "/usr/bin/python3"            # the system's: the planter cannot read root's environment
NODE_ENV = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
            "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "n1"}


@pytest.fixture(scope="module")
def planter():
    """A real second user (useradd once; the tests run as root), who writes files with its own uid."""
    import pwd
    import subprocess
    try:
        return pwd.getpwnam(PLANTER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                        PLANTER], check=True, capture_output=True)
        return pwd.getpwnam(PLANTER)


def as_planter(pw, code: str, data: bytes = b"") -> None:
    """Run ``code`` (stdlib Python; ``data`` on stdin) as the planter: uid, gid, no extra groups."""
    import subprocess
    r = subprocess.run([PLANTER_PY, "-c", code], input=data, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                       cwd="/", capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]


@pytest.fixture
def arena():
    """A directory the planter can reach (tmp_path is under root's private /tmp/pytest-of-root): under the
    sticky /tmp, owned by root, 0755."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="hj-trust-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _evil_pickle(marker: Path) -> bytes:
    """What a planter would put where submitit looks: creates ``marker`` when unpickled."""
    return pickle.dumps(Payload(str(marker)))


def _node_entry(folder: Path) -> subprocess.CompletedProcess[str]:
    """The node side of a submitit job (what its job script runs for rank 0 of job 77), without Slurm."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=str(ROOT), **NODE_ENV)
    return subprocess.run([sys.executable, "-u", "-m", "hpc_jabas.slurm.node_entry", str(folder)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=str(folder))


def _stderr_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_node_side_refuses_a_pickle_a_second_user_swapped_in(arena, planter):
    """The window the issue names: between sbatch and the job's start, someone who can write jobs/submitit/
    swaps ``<id>_submitted.pkl``. The node entry refuses it before submitit unpickles it."""
    folder = arena / "chain" / "jobs" / "submitit"
    folder.mkdir(parents=True)
    pkl, marker = folder / "77_submitted.pkl", arena / "marker"
    # the control: our own pickle in private directories IS unpickled (so the check below is what stops it)
    pkl.write_bytes(_evil_pickle(marker))
    r = _node_entry(folder)
    assert marker.exists(), r.stderr[-2000:]
    marker.unlink()
    os.chmod(folder, 0o777)                                   # e.g. made under a umask of 000
    as_planter(planter, f"import os, sys; os.unlink({str(pkl)!r}); "
                        f"open({str(pkl)!r}, 'wb').write(sys.stdin.buffer.read())", _evil_pickle(marker))
    assert pkl.stat().st_uid == planter.pw_uid
    r = _node_entry(folder)
    line = _stderr_line(r)
    assert r.returncode == 2 and not marker.exists(), r.stderr
    assert f"refusing to read submitted job pickle {str(pkl)!r}: it is owned by uid {planter.pw_uid}" in line, line


def test_node_side_refuses_our_own_pickle_below_a_directory_others_can_write(arena, planter):
    """The pickle is ours, but a directory above it is world-writable (not sticky): the planter could have
    renamed jobs/ away and put a tree of its own there. Refused, naming that directory."""
    chain = arena / "shared" / "chain"
    folder = chain / "jobs" / "submitit"
    folder.mkdir(parents=True)
    marker = arena / "marker"
    (folder / "77_submitted.pkl").write_bytes(_evil_pickle(marker))
    os.chmod(arena / "shared", 0o777)
    as_planter(planter, f"import os; os.mkdir({str(arena / 'shared' / 'planted')!r})")   # they can write there
    r = _node_entry(folder)
    line = _stderr_line(r)
    assert r.returncode == 2 and not marker.exists(), r.stderr
    assert f"the directory above it {str(arena / 'shared')!r} is writable by every user" in line, line
    os.chmod(arena / "shared", 0o1777)                        # sticky, like /tmp: the planter cannot rename ours
    r = _node_entry(folder)
    assert marker.exists(), r.stderr[-2000:]


def _submit_spec(chain: Path, **kw):
    from hpc_jabas.core.config.jobspec import JobSpec
    return JobSpec(task="preempt_task:build", config={}, chain_dir=str(chain), mix={"v100": 1},
                   method=kw.pop("method", "submitit"), **kw)


@pytest.fixture
def no_slurm(monkeypatch):
    """Nothing may reach sbatch (a refusal comes first)."""
    from hpc_jabas.slurm import executor

    def never(*a, **k):
        raise AssertionError("reached sbatch")
    monkeypatch.setattr(executor, "run_sbatch", never)
    monkeypatch.setattr(executor, "partition_view", never)
    monkeypatch.setattr(executor.proc, "require", lambda *a, **k: None)


def test_submit_refuses_chain_jobs_and_submitit_dirs_another_user_can_write(arena, planter, no_slurm):
    from hpc_jabas.slurm.executor import check_chain_dirs, submit
    chain = arena / "chain"
    chain.mkdir(mode=0o755)
    jobs, sub = chain / "jobs", chain / "jobs" / "submitit"
    os.chmod(chain, 0o777)
    as_planter(planter, f"import os; os.makedirs({str(sub)!r})")          # a planted jobs/ tree
    steps = [  # (what is wrong now, the refusal's start, the fix before the next step)
        (f"refusing to use chain directory {str(chain)!r}: it is writable by every user (mode 0777)",
         lambda: os.chmod(chain, 0o755)),
        (f"refusing to use job directory {str(jobs)!r}: it is owned by uid {planter.pw_uid}",
         lambda: (os.chown(jobs, 0, 0), os.chown(sub, 0, 0), os.chmod(sub, 0o777))),
        (f"refusing to use submitit directory {str(sub)!r}: it is writable by every user (mode 0777)",
         lambda: os.chmod(sub, 0o755))]
    for say, fix in steps:
        for method in ("submitit", "sbatch"):
            with pytest.raises(UntrustedFileError) as e:
                submit(_submit_spec(chain, method=method))
            line = _one_line(e.value)
            assert line.startswith(say), line
        fix()
    assert not list(chain.rglob("*.pkl")) and not list(chain.rglob("*.sbatch")) and not list(chain.rglob("*.json"))
    check_chain_dirs(chain)                                   # all private now: the check passes (Slurm is next)


def test_a_group_writable_chain_dir_is_trusted_only_with_trust_group(arena):
    from hpc_jabas.slurm.executor import check_chain_dirs
    chain = arena / "chain"
    chain.mkdir()
    os.chmod(chain, 0o775)
    with pytest.raises(UntrustedFileError, match="writable by its group .*trust_group = true"):
        check_chain_dirs(chain)
    trust.set_trust_group(True)
    check_chain_dirs(chain)
    os.chmod(chain, 0o777)
    with pytest.raises(UntrustedFileError, match="every user"):
        check_chain_dirs(chain)


def test_a_profile_a_second_user_planted_is_refused_as_calibration_json_is(arena, planter, capsys):
    """``hpc-jabas plan --profile DIR`` and a job's profile_dir (check_calibration, before job_perf_model)."""
    from hpc_jabas.cli.main import main
    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.core.perf.perfmodel import PerfModel
    from hpc_jabas.runtime.calibrate import check_calibration
    prof = arena / "prof"
    PerfModel.emulated(["v100"], [8, 16], 0.01, 0.001).save(prof)
    argv = ["plan", "--batch", "32", "--gpus", "v100:2", "--profile", str(prof)]
    assert main(argv) == 0
    capsys.readouterr()
    os.chmod(prof, 0o777)
    fake = PerfModel.emulated(["v100"], [8, 16], 9.0, 9.0).save(arena / "fake")[0]
    as_planter(planter, f"import os, sys; os.unlink({str(prof / 'v100.json')!r}); "
                        f"open({str(prof / 'v100.json')!r}, 'wb').write(sys.stdin.buffer.read())",
                        Path(fake).read_bytes())
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"refusing to use profile directory {str(prof)!r}: it is writable by every user" \
        in line, line
    os.chmod(prof, 0o755)                                   # the directory fixed: the planted file itself
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert f"refusing to read profile {str(prof / 'v100.json')!r}: it is owned by uid {planter.pw_uid}" in line, line
    with pytest.raises(UntrustedFileError, match=f"profile .*v100.json.*owned by uid {planter.pw_uid}"):
        check_calibration(JobConfig(profile_dir=str(prof)))
    from hpc_jabas.runtime.profiling.run import _existing  # hpc-jabas profile --out merges what is there
    with pytest.raises(UntrustedFileError, match=f"profile .*v100.json.*owned by uid {planter.pw_uid}"):
        _existing(str(prof))


@pytest.mark.parametrize("field", ["chain_dir", "pythonpath", "job_name"])
def test_a_control_character_in_a_path_for_the_job_script_is_refused_in_one_line(tmp_path, field, no_slurm):
    from hpc_jabas.errors import ConfigError
    from hpc_jabas.slurm.executor import submit
    evil = "x\ntouch /tmp/hj-pwned"
    kw: dict = {}
    chain = tmp_path / "chain"
    if field == "chain_dir":
        chain = tmp_path / evil
    elif field == "pythonpath":
        kw["pythonpath"] = [str(tmp_path / evil)]
    else:
        kw["extra"] = {"job_name": evil}
    for method in ("sbatch", "submitit"):
        with pytest.raises(ConfigError) as e:
            submit(_submit_spec(chain, method=method, **kw))
        line = _one_line(e.value)
        assert "holds a control character ('\\n' at position" in line and "x\\ntouch" in line, line
    assert not any(tmp_path.rglob("*.sbatch")) and not any(tmp_path.rglob("*.pkl"))


def test_a_symbolic_link_is_only_as_safe_as_the_directory_that_holds_it(arena):
    """The real path is private, but the link to it sits in a world-writable directory: whoever can write there
    can point the link elsewhere. Refused through the link (naming that directory), read through the real path."""
    real = arena / "mine" / "chain"
    real.mkdir(parents=True)
    f = real / "chain.jsonl"
    f.write_text("{}\n")
    shared = arena / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "link").symlink_to(real)
    trust.check_file(f)
    with pytest.raises(UntrustedFileError) as e:
        trust.check_file(shared / "link" / "chain.jsonl", "chain record")
    assert f"the directory above it {str(shared)!r} is writable by every user" in _one_line(e.value)
    with pytest.raises(UntrustedFileError, match=f"refusing to use chain directory .*{shared}"):
        trust.check_dir(shared / "link", "chain directory")
    trust.check_dir(real, "chain directory")
