"""What `hpc-jabas submit` (and the Python submission the demo uses) refuses before anything reaches Slurm, each in
one line with exit 2: a python environment or code its nodes cannot see (the same rule as run directories:
slurm/nodepaths.py), a section name given a value (``train = 5``, ``[[train]]``), an [autoscale] that excludes the
starting mix or names a partition the cluster lacks. And a job that dies on its node before training (its
environment lacks a module there) is reported as FAILED with the last line of its node log and the log's path, by
`submit --wait` and by `hpc-jabas status`.

The table rows run in-process through tests/support/bad_input.py's ``run_table`` (sbatch replaced by a function
that fails the row: nothing may reach it; every file of the work directory hashed before and after)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.bad_input import ROOT, Case, run_table
from support.slurm_records import node, part

from hpc_jabas.errors import ConfigError
from hpc_jabas.slurm.nodepaths import ENV, cluster_shared, node_local_root, python_paths

HPC_JABAS = str(ROOT / ".venv" / "bin" / "hpc-jabas")
TASK = "def build():\n    raise SystemExit('not called: submit runs with --no-dry-run')\n"


def declared(*shared: Path) -> str:
    """HPC_JABAS_SHARED_TMP naming ``shared`` plus this checkout and this interpreter's environment, wherever they
    lie (a clone under /tmp included): what is refused is the test's own paths."""
    return ":".join([*map(str, shared), str(ROOT), *(p for p, _ in python_paths())])


def job_text(d: Path, top: str = "", job: str = "", tail: str = "", chain: str = "chain") -> str:
    return (f'{top}\n[job]\ntask = "hj_sc_task:build"\nchain_dir = "{d / chain}"\nmethod = "sbatch"\n'
            f'pythonpath = ["{d}"]\n{job}\n{tail}\n')


def rows(d: Path, files: dict[str, str], cases: list[Case]) -> list[str]:
    """The cases run through run_table (nothing reaches sbatch); what went wrong, one string per bad row."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "hj_sc_task.py").write_text(TASK)
    for name, text in files.items():
        (d / name).write_text(text)
    out = run_table(d, cases)
    assert len(out) == len(cases)
    return [f"{r['id']}: {r['why']}: {r['stderr']}" for r in out if not r["ok"]]


def submit_case(name: str, expect: str, *args: str) -> Case:
    return Case(name, ["submit", f"{{d}}/{name}.toml", "--no-dry-run", *args], expect=expect)


@pytest.fixture(autouse=True)
def _fresh_task_module():
    """Each test's own hj_sc_task (submit imports the task's module: a copy another test left would be found)."""
    sys.modules.pop("hj_sc_task", None)
    yield
    sys.modules.pop("hj_sc_task", None)


@pytest.fixture
def no_slurm(monkeypatch, tmp_path):
    """No Slurm to reach (a row that got that far would say SLURM_CONF, not what it expects); the work directory
    declared shared, as the local cluster's shared directory is."""
    monkeypatch.setenv("SLURM_CONF", "/nonexistent")
    monkeypatch.setenv(ENV, declared(tmp_path / "w"))
    return tmp_path / "w"


def test_a_section_name_given_a_value_is_one_line_for_submit_and_scripts(no_slurm):
    d = no_slurm
    files = {"train-int.toml": job_text(d, top="train = 5\nepochs = 1"),
             "train-array.toml": job_text(d, tail="[[train]]\nepochs = 1\n[[train]]\nbatch = 8"),
             "planning-str.toml": job_text(d, top='planning = "fast"'),
             "script-train-int.toml": "train = 5\n",
             "script-output-array.toml": "[[output]]\nquiet = true\n"}
    cases = [submit_case("train-int", "train=5 must be a table of keys ([train] is a section, e.g. [train] "
                                      "epochs = ...", "--mix", "rtx2060:1"),
             submit_case("train-array", "[[train]] is an array of 2 table(s) where one [train] table belongs",
                         "--mix", "rtx2060:1"),
             submit_case("planning-str", "planning='fast' must be a table of keys", "--mix", "rtx2060:1"),
             Case("script-train-int", ["--config", "{d}/script-train-int.toml", "--epochs", "1"], example=True,
                  expect="train=5 must be a table of keys"),
             Case("script-output-array", ["--config", "{d}/script-output-array.toml", "--epochs", "1"],
                  example=True, expect="[[output]] is an array of 1 table(s)")]
    bad = rows(d, files, cases)
    assert not bad, "\n".join(bad)
    from hpc_jabas.core.config.sections import JobConfig
    with pytest.raises(ConfigError, match=r"^\[\[slurm\]\] is an array of 1 table"):
        JobConfig.from_dict({"slurm": [{"time_min": 5}]})


def _view():
    """The local cluster as its scontrol records show it (tests/support/slurm_records.py): partitions rtx2060
    (4 GPUs) and v100 (2 nodes of 2)."""
    from hpc_jabas.slurm.cluster import build_view
    return build_view([node("gpur1", "gpu:rtx2060:4", parts="rtx2060"), node("gpuv1", "gpu:v100:2"),
                       node("gpuv2", "gpu:v100:2")],
                      [part("rtx2060", "gpur1", weights="CPU=0.0,GRES/gpu=1.0"), part("v100", "gpuv[1-2]")])


def test_autoscale_that_excludes_the_starting_mix_or_names_no_partition_is_refused_before_sbatch(no_slurm,
                                                                                               monkeypatch):
    from hpc_jabas.slurm import components
    view = _view()
    assert sorted(view.partitions) == ["rtx2060", "v100"]
    monkeypatch.setattr(components, "partition_view", lambda partition_types=None: view)
    d = no_slurm
    files = {"max-gpus.toml": job_text(d, top="epochs = 1", tail="[autoscale]\nmax_gpus = 2"),
             "min-gpus.toml": job_text(d, top="epochs = 1", tail="[autoscale]\nmin_gpus = 3"),
             "allowed-h100.toml": job_text(d, top="epochs = 1", tail='[autoscale]\nallowed = ["v100", "h100"]')}
    cases = [submit_case("max-gpus", "the starting mix rtx2060:4 has 4 GPU(s), outside autoscale.min_gpus=1..max_gpus"
                                     "=2", "--mix", "rtx2060:4"),
             submit_case("min-gpus", "the starting mix v100:2 has 2 GPU(s), outside autoscale.min_gpus=3..max_gpus=8",
                         "--mix", "v100:2"),
             submit_case("allowed-h100", "autoscale.allowed names 'h100': not a partition with GPUs of this cluster, "
                                         "nor the GPU type of one; valid: rtx2060, v100", "--mix", "v100:1")]
    bad = rows(d, files, cases)
    assert not bad, "\n".join(bad)
    # the same table with the starting mix inside the bounds and known names passes these checks: it reaches
    # sbatch (refused there by the table's stand-in), so the refusals above are of the values named
    (d / "fine.toml").write_text(job_text(d, top="epochs = 1", tail='[autoscale]\nmax_gpus = 4\nallowed = ["v100"]'))
    out = run_table(d, [submit_case("fine", "", "--mix", "rtx2060:4")])
    assert out[0]["why"] == "exit 'exception'" and "a malformed input reached sbatch" in out[0]["stderr"], out


def _venv(where: Path) -> Path:
    """A bare virtual environment of the base interpreter (nothing installed in it); its python."""
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(where)],
                   check=True, timeout=120)
    return where / "bin" / "python"


def test_a_python_environment_or_code_the_nodes_cannot_see_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """The job's python in a node-local directory; a shared venv whose .pth file puts a node-local site directory on
    its path (this project's .venv reaches HPC_JABAS_CACHE that way); a pythonpath entry there: each one line, exit
    2, naming the path and what it is, from `hpc-jabas submit` and from the Python submission (executor.submit, the
    demo's), and nothing reaches Slurm."""
    from hpc_jabas.cli.main import main
    from hpc_jabas.core.config.jobspec import JobSpec
    from hpc_jabas.slurm import executor
    work, envs = tmp_path / "work", tmp_path / "envs"
    work.mkdir()
    (work / "hj_sc_task.py").write_text(TASK)
    py = _venv(envs / "venv")
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    cache = tmp_path / "cache" / "site-packages"         # the shared environment's packages, left node-local
    cache.mkdir(parents=True)
    (site / "_hpc_jabas_env.pth").write_text(f"{cache}\n")
    job = work / "job.toml"
    job.write_text(job_text(work, top="epochs = 1", job=f'python = "{py}"'))

    def reached(*a, **k):
        raise AssertionError("the submission reached sbatch")
    real_submit = executor.submit
    monkeypatch.setattr(executor, "run_sbatch", reached)
    monkeypatch.setattr(executor, "submit", reached)         # what the CLI calls last
    monkeypatch.setenv("SLURM_CONF", "/nonexistent")

    def submit() -> str:
        rc = main(["submit", str(job), "--mix", "rtx2060:1", "--no-dry-run"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, (rc, err)
        return err[0]
    monkeypatch.setenv(ENV, declared(work))                 # the venv's own directory is node-local
    line = submit()
    assert f"the directory of the job's python '{py.parent}' is under /tmp" in line, line
    assert "put the Python environment on a shared file system" in line and f"{ENV}=/tmp" in line, line
    monkeypatch.setenv(ENV, declared(work, envs))           # the venv shared, the .pth's site directory not
    line = submit()
    assert (f"site directory of the job's python (added by {site / '_hpc_jabas_env.pth'}) '{cache}' is under /tmp"
            in line), line
    # the Python submission (scripts/demo_slurm.py's): the same refusals, before sbatch
    spec = JobSpec(task="hj_sc_task:build", config={"epochs": 1}, chain_dir=str(work / "chain"), mix={"rtx2060": 1},
                   method="sbatch", pythonpath=[str(work)], python=str(py))
    with pytest.raises(ConfigError, match=r"site directory of the job's python \(added by .*_hpc_jabas_env\.pth\)"):
        real_submit(spec)
    code = tmp_path / "code"                                 # a pythonpath entry the nodes cannot see
    code.mkdir()
    monkeypatch.setenv(ENV, declared(work, envs, cache))
    with pytest.raises(ConfigError) as e:
        real_submit(JobSpec(task="hj_sc_task:build", config={"epochs": 1}, chain_dir=str(work / "chain"),
                                mix={"rtx2060": 1}, method="sbatch", pythonpath=[str(work), str(code)],
                                python=str(py)))
    assert str(e.value).startswith(f"pythonpath entry '{code}' is under /tmp") and "\n" not in str(e.value)
    assert not (work / "chain" / "jobs").exists()            # nothing written for a job that was not submitted
    monkeypatch.setenv(ENV, declared(work, envs, cache, code))   # all of it shared: the next check speaks (Slurm)
    from hpc_jabas.errors import SlurmError
    with pytest.raises(SlurmError, match="SLURM_CONF=/nonexistent"):
        real_submit(JobSpec(task="hj_sc_task:build", config={"epochs": 1}, chain_dir=str(work / "chain"),
                                mix={"rtx2060": 1}, method="sbatch", pythonpath=[str(work), str(code)],
                                python=str(py)))


def test_the_local_clusters_slurm_conf_says_which_tmp_paths_it_shares(tmp_path):
    """slurm/local/up.sh binds the checkout it runs from (when under /tmp) into every node's /tmp and writes the
    list at the head of the slurm.conf it generates; submit reads it there, so a clone under /tmp is accepted
    where the cluster shares it, and only there."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("# Generated by slurm/local/up.sh; do not edit (it is rewritten on every bring-up).\n"
                    "# shared-tmp: /tmp/hj-clone-a /tmp/hj-clone-b\nClusterName=jabas\n")
    env = {"SLURM_CONF": str(conf)}
    assert [str(p) for p in cluster_shared(env)] == ["/tmp/hj-clone-a", "/tmp/hj-clone-b"]
    assert node_local_root("/tmp/hj-clone-a/runs/chain", env) is None
    assert node_local_root("/tmp/hj-clone-b", env) is None
    assert node_local_root("/tmp/hj-clone-c/runs", env) == "/tmp" and node_local_root("/tmp/hj-clone", env) == "/tmp"
    conf.write_text("# Generated by slurm/local/up.sh\n# shared-tmp: none\nClusterName=jabas\n")
    assert cluster_shared(env) == [] and node_local_root("/tmp/hj-clone-a", env) == "/tmp"
    conf.write_text("ClusterName=site\n")                   # a site's own slurm.conf declares nothing
    assert cluster_shared(env) == [] and cluster_shared({"SLURM_CONF": str(tmp_path / "none")}) == []
    # the running local cluster's own configuration, when this machine has one, is read the same way
    live = Path("/var/tmp/hpc-jabas-slurm/etc/slurm.conf")
    if live.is_file():
        head = [ln for ln in live.read_text().splitlines()[:5] if ln.startswith("# shared-tmp: ")]
        assert len(head) == 1
        want = [w for w in head[0].split()[2:] if w != "none"]
        assert [str(p) for p in cluster_shared({"SLURM_CONF": str(live)})] == [str(Path(w).resolve()) for w in want]


def test_the_line_that_says_why_a_job_died_on_its_node_and_where_it_is(tmp_path):
    """The log a job's ranks left (submitit's per-rank stderr first, then stdout, then the job script's output) and
    its telling line: the last exception or hpc-jabas error line, not Slurm's own lines after it."""
    from hpc_jabas.cli.submit import stopped_line
    from hpc_jabas.slurm import chain as chainlog
    from hpc_jabas.slurm.watch import log_line, node_log
    chain = tmp_path / "chain"
    sub = chain / "jobs" / "submitit"
    sub.mkdir(parents=True)
    tb = ("Traceback (most recent call last):\n  File \"<frozen runpy>\", line 112, in _get_module_details\n"
          "ModuleNotFoundError: No module named 'numpy'\nsrun: error: gpur1: task 0: Exited with exit code 1\n"
          "slurmstepd-gpur1: error: *** STEP 42.0 ON gpur1 CANCELLED AT 2026-12-04T17:15:13 ***\n")
    (sub / "42_0_log.out").write_text("hpc-jabas[0] INFO: starting\n")
    (sub / "42_1_log.err").write_text(tb)
    (sub / "42_0_log.err").write_text("")
    chainlog.append(chain, "submit", job_id="42", mix={"rtx2060": 2}, method="submitit", by="user", script="")
    assert node_log(chain, "42") == {"log": str(sub / "42_1_log.err"),
                                     "line": "ModuleNotFoundError: No module named 'numpy'"}
    script = chain / "jobs" / "1.sbatch"                      # method sbatch: the script's --output
    script.write_text(f"#!/bin/bash\n#SBATCH --output={chain / 'jobs' / '1-%j.out'}\n")
    (chain / "jobs" / "1-43.out").write_text("hpc-jabas: error: task module 'hj_gone' of task 'hj_gone:build' is "
                                           "not importable\nsrun: error: gpur1: task 0: Exited with exit code 2\n")
    chainlog.append(chain, "submit", job_id="43", mix={"rtx2060": 1}, method="sbatch", by="user", script=str(script))
    got = node_log(chain, "43")
    assert got == {"log": str(chain / "jobs" / "1-43.out"),
                   "line": "hpc-jabas: error: task module 'hj_gone' of task 'hj_gone:build' is not importable"}, got
    assert node_log(chain, "44") is None
    (tmp_path / "slurm-only.out").write_text("hello\nsrun: error: gpur1: task 0: Exited with exit code 1\n")
    assert log_line(tmp_path / "slurm-only.out") == "hello" and log_line(tmp_path / "none") is None
    line = stopped_line({"ok": False, "job_id": "43", "state": "FAILED", "jobs": ["43"], "before_start": got}, None,
                        str(chain))
    assert line == (f"hpc-jabas: chain stopped: job 43 is FAILED before it started training: the last line of its "
                    f"log {chain / 'jobs' / '1-43.out'}: {got['line']}")
    line = stopped_line({"ok": False, "job_id": "44", "state": "FAILED", "jobs": ["44"], "before_start": {}}, None,
                        str(chain))
    assert line == f"hpc-jabas: chain stopped: job 44 is FAILED before it started training; it left no log under " \
                   f"{chain / 'jobs'}"

    # hpc-jabas status: the job's batch shell recorded its failure (an end event, no start): the same log line
    from hpc_jabas.cli import status as st
    from hpc_jabas.slurm import watch
    from hpc_jabas.slurm.text import parse_sacct
    chainlog.append(chain, "end", job_id="43", state="failed", exit_code=2, iteration=0, lost_iterations=0,
                    signature=None)
    sacct = "43|FAILED|3|2026-12-04T17:15:10|2026-12-04T17:15:13|rtx2060|gpur1|billing=1,cpu=1,gres/gpu=1\n"
    rows_ = watch.fold_attempts(parse_sacct(sacct, watch.ATTEMPT_FIELDS))          # sacct -D's rows, as parsed
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(watch, "sacct_attempts", lambda ids, env=None: {k: v for k, v in rows_.items() if k in ids})
        mp.setattr(watch, "job_details", lambda job_id, env=None: {})              # the controller let go of it
        cur = st.status(chain)["chains"][-1]["current"]
    finally:
        mp.undo()
    assert cur == (f"stopped: job 43 is FAILED in Slurm before it started; the last line of its log "
                   f"{chain / 'jobs' / '1-43.out'}: {got['line']}"), cur


@pytest.mark.slurm
def test_a_job_that_dies_on_its_node_before_training_is_reported_failed_with_its_log_line(slurm_cluster, slurm_tmp):
    """The job's python is a bare venv (its environment lacks the packages on the node, as when the set-up's cache
    is left where the nodes cannot reach it): every rank dies at its first import. `submit --wait` and `status` say
    FAILED, with the log's path and its last line (the ModuleNotFoundError), instead of nothing or a traceback."""
    py = _venv(slurm_tmp / "bare")
    (slurm_tmp / "hj_sc_task.py").write_text(TASK)
    job = slurm_tmp / "job.toml"
    job.write_text(job_text(slurm_tmp, top="epochs = 1", job=f'python = "{py}"'))
    r = subprocess.run([HPC_JABAS, "submit", str(job), "--mix", "rtx2060:1", "--no-dry-run", "--wait", "--timeout",
                        "240"], capture_output=True, text=True, env=slurm_cluster.env, cwd=ROOT, timeout=300)
    first = r.stdout.splitlines()[0] if r.stdout else ""
    job_id = first.split()[2] if first.startswith("submitted job ") else ""
    try:
        err = r.stderr.strip().splitlines()
        assert r.returncode == 1 and job_id.isdigit() and len(err) == 1, (r.returncode, r.stdout, r.stderr)
        log = slurm_tmp / "chain" / "jobs" / f"1-{job_id}.out"
        assert err[0].startswith(f"hpc-jabas: chain stopped: job {job_id} is FAILED before it started training: the "
                                 f"last line of its log {log}: ModuleNotFoundError: No module named "), err
        assert log.is_file() and err[0].split(f"{log}: ", 1)[1] in log.read_text(), log.read_text()[-2000:]
        assert "Traceback" not in r.stdout + r.stderr
        s = subprocess.run([HPC_JABAS, "status", str(slurm_tmp / "chain")], capture_output=True, text=True,
                           env=slurm_cluster.env, timeout=60)
        last = s.stdout.strip().splitlines()[-1]
        assert s.returncode == 0 and last.startswith(f"current: stopped: job {job_id} is FAILED in Slurm before it "
                                                     "started"), s.stdout + s.stderr
        assert last.endswith(err[0].split("before it started training: ", 1)[1]), (last, err[0])
    finally:
        if job_id:
            slurm_cluster.cancel(job_id)
