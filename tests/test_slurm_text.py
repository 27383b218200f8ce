"""The Slurm layer on text, without Slurm: job scripts rendered, sacct/scontrol/sbatch output parsed,
het-job component states folded, and submissions through a stand-in sbatch on PATH."""
from __future__ import annotations

import os
import pickle
import shlex
import stat
from pathlib import Path

import cloudpickle
import pytest

from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.errors import ConfigError, SlurmError
from hpc_jabas.slurm import chain as chainlog
from hpc_jabas.slurm import proc, sbatch, text, watch
from hpc_jabas.slurm.cluster import ClusterView, NodeView, PartitionView
from hpc_jabas.slurm.components import Component, SlurmOptions, components, parse_mix, slurm_option

PY = "/opt/py/bin/python"
ROOT = str(Path(__file__).resolve().parents[1])


def _view() -> ClusterView:
    """The local cluster's layout: a100 (1 node x 2), v100 (2 nodes x 2), rtx2060 (1 node x 4)."""
    layout = {"a100": {"gpua1": 2}, "v100": {"gpuv1": 2, "gpuv2": 2}, "rtx2060": {"gpur1": 4}}
    nodes, parts = {}, {}
    for p, ns in layout.items():
        for n, g in ns.items():
            nodes[n] = NodeView(n, "idle", (p,), {p: g}, 0)
        total = sum(ns.values())
        parts[p] = PartitionView(p, p, (p,), tuple(ns), dict.fromkeys(ns, "idle"), total, total, 1.0)
    return ClusterView(parts, nodes)


def _spec(chain_dir: Path, mix: dict, method: str = "sbatch", **extra) -> JobSpec:
    return JobSpec(task="examples.train_digits:build", config={}, chain_dir=str(chain_dir), mix=mix, method=method,
                   python=PY, extra=extra)


SETUP = ["export OMPI_ALLOW_RUN_AS_ROOT=1", "export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
         None,   # PYTHONPATH, per test
         'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"',
         'export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"',
         "export PYTHONUNBUFFERED=1",
         'export HOROVOD_STALL_CHECK_TIME_SECONDS="${HOROVOD_STALL_CHECK_TIME_SECONDS:-60}"',
         'export HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="${HOROVOD_STALL_SHUTDOWN_TIME_SECONDS:-300}"',
         *sbatch.HJ_SRUN.splitlines()]


def _setup(chain: Path) -> list[str]:
    return [ln if ln is not None else f'export PYTHONPATH={ROOT}:{chain}"${{PYTHONPATH:+:$PYTHONPATH}}"'
            for ln in SETUP]


# ---- rendering ----------------------------------------------------------------------------------
def test_render_one_partition_job(tmp_path, monkeypatch):
    monkeypatch.chdir("/tmp")                 # node-private cwd: the job runs in its chain directory
    c = tmp_path / "chain"
    spec = _spec(c, {"rtx2060": 2}, time_min=30, account="proj")
    comps = components(spec.mix, _view(), mem_per_task_mb=512)
    assert comps == [Component("rtx2060", 2, 1, "rtx2060", 1024)]
    got = sbatch.render_sbatch(spec, comps, c / "jobs" / "1.json", c / "jobs" / "1-%j.out").splitlines()
    assert got == ["#!/bin/bash", f"# hpc-jabas chain {c}: mix rtx2060:2",
                   "#SBATCH --job-name=hpc-jabas", f"#SBATCH --output={c}/jobs/1-%j.out", f"#SBATCH --chdir={c}",
                   "#SBATCH --signal=B:USR1@60",
                   "#SBATCH --partition=rtx2060 --nodes=1 --ntasks=2 --mem=1024M --gres=gpu:rtx2060:2 --time=30 "
                   "--account=proj",
                   *_setup(c), *sbatch.HJ_TRAPS.splitlines(),
                   f"hj_srun srun --mpi=pmix --kill-on-bad-exit=1 {PY} -u -m hpc_jabas.runtime.job.launch "
                   f"{c}/jobs/1.json"
                   f' || {{ rc=$?; {PY} -u -m hpc_jabas.runtime.job.launch --after-failure "$rc" {c}/jobs/1.json; '
                   'exit "$rc"; }']


def test_render_two_component_hetjob(tmp_path, monkeypatch):
    monkeypatch.chdir("/tmp")
    c = tmp_path / "chain"
    spec = _spec(c, {"v100": 3, "a100": 1}, sbatch_args=["--constraint=fast"])
    comps = components(spec.mix, _view())
    # sorted partition order; 3 v100 GPUs need both 2-GPU nodes: one GPU per task, 2 tasks per node's memory
    assert comps == [Component("a100", 1, 1, "a100", 512), Component("v100", 3, 2, "v100", 1024)]
    got = sbatch.render_sbatch(spec, comps, c / "jobs" / "2.json", c / "jobs" / "2-%j.out").splitlines()
    assert got[5] == "#SBATCH --signal=B:USR1@60"
    got = got[:5] + got[6:]
    assert got[5:10] == ["#SBATCH --partition=a100 --nodes=1 --ntasks=1 --mem=512M --gres=gpu:a100:1 --time=60",
                         "#SBATCH --constraint=fast",
                         "#SBATCH hetjob",
                         "#SBATCH --partition=v100 --nodes=2 --ntasks=3 --mem=1024M --gpus-per-task=v100:1 --time=60",
                         "#SBATCH --constraint=fast"]
    assert got[10:-1] == _setup(c) + sbatch.HJ_TRAPS.splitlines()
    assert got[-1] == (f"hj_srun srun --het-group=0,1 --mpi=pmix --kill-on-bad-exit=1 {PY} -u -m "
                       f"hpc_jabas.runtime.job.launch {c}/jobs/2.json"
                       f' || {{ rc=$?; {PY} -u -m hpc_jabas.runtime.job.launch --after-failure "$rc" {c}/jobs/2.json; '
                       'exit "$rc"; }')
    # every #SBATCH line comes before the first command (sbatch stops reading directives there)
    first_cmd = next(i for i, ln in enumerate(got) if ln.strip() and not ln.startswith("#"))
    assert max(i for i, ln in enumerate(got) if ln.startswith("#SBATCH")) < first_cmd == 10


def test_het_srun_python_and_het_groups(tmp_path):
    comps = [Component("a100", 1), Component("rtx2060", 4), Component("v100", 3, 2)]
    folder = tmp_path / "my jobs"
    got = sbatch.het_srun_python(comps, PY, folder)
    inner = f"exec \"$0\" \"$@\" >>'{folder}'/\"$SLURM_JOB_ID\"_\"$SLURM_PROCID\"_log.out " \
            f"2>>'{folder}'/\"$SLURM_JOB_ID\"_\"$SLURM_PROCID\"_log.err"
    assert got == ("hj_srun srun --unbuffered --het-group=0,1,2 --mpi=pmix --kill-on-bad-exit=1 bash -c "
                   f"{shlex.quote(inner)} {PY}")
    assert shlex.split(got)[-3:] == ["-c", inner, PY]


def test_parse_mix():
    assert parse_mix("v100:2, a100:1") == {"a100": 1, "v100": 2}
    for bad in ("a100", "a100:0", "a100:x", "a100:1,a100 :2", "", ":3"):
        with pytest.raises(ConfigError):
            parse_mix(bad)


def test_components_refuse_what_the_cluster_lacks():
    v = _view()
    with pytest.raises(ConfigError, match=r"^unknown partition 'h100' in mix"):
        components({"h100": 1}, v)
    with pytest.raises(ConfigError, match=r"^mix asks 3 GPUs of partition 'a100', which has 2 in all$"):
        components({"a100": 3}, v)
    assert [(c.partition, c.ntasks, c.nodes) for c in components({"v100": 3, "a100": 1, "rtx2060": 4}, v)] == \
        [("a100", 1, 1), ("rtx2060", 4, 1), ("v100", 3, 2)]


# ---- sacct --------------------------------------------------------------------------------------
SACCT = """\
123+0|RUNNING|2026-11-30T19:00:05|Unknown|a100|gpua1
123+1|PENDING|Unknown|Unknown|v100|None assigned
124+0|COMPLETED|2026-11-30T18:00:00|2026-11-30T18:05:00|a100|gpua1
124+1|CANCELLED by 0|2026-11-30T18:00:01|2026-11-30T18:04:00|v100|gpuv[1-2]
124+1.batch|CANCELLED|2026-11-30T18:00:01|2026-11-30T18:04:00||gpuv1
125|COMPLETED|2026-11-30T17:00:00|2026-11-30T17:10:00|rtx2060|gpur1
125.0|COMPLETED|2026-11-30T17:00:01|2026-11-30T17:09:59||gpur1
126|CANCELLED by 0|None|2026-11-30T17:00:00|v100|None assigned
garbage line
"""


def test_parse_sacct_rows():
    rows = text.parse_sacct(SACCT)
    assert [(r.job, r.component, r.step, r.state) for r in rows] == [
        ("123", 0, None, "RUNNING"), ("123", 1, None, "PENDING"), ("124", 0, None, "COMPLETED"),
        ("124", 1, None, "CANCELLED"), ("124", 1, "batch", "CANCELLED"), ("125", None, None, "COMPLETED"),
        ("125", None, "0", "COMPLETED"), ("126", None, None, "CANCELLED")]
    assert rows[3].fields == {"JobID": "124+1", "State": "CANCELLED by 0", "Start": "2026-11-30T18:00:01",
                              "End": "2026-11-30T18:04:00", "Partition": "v100", "NodeList": "gpuv[1-2]"}
    assert text.split_job_id("45_3.extern") == ("45_3", None, "extern")
    assert text.split_job_id("JobID") is None
    with_header = text.parse_sacct("JobID|State|NodeList\n7+1|FAILED|gpuv1\n", header=True)
    assert [(r.job, r.component, r.fields["NodeList"]) for r in with_header] == [("7", 1, "gpuv1")]


def test_fold_sacct_rows_one_state_per_job():
    got = watch.fold_rows(text.parse_sacct(SACCT))
    assert got == {
        "123": {"ElapsedRaw": None, "State": "RUNNING", "Start": "2026-11-30T19:00:05", "End": "Unknown",
                "Partition": "a100,v100", "NodeList": "gpua1,None assigned", "components": 2},
        "124": {"ElapsedRaw": None, "State": "CANCELLED", "Start": "2026-11-30T18:00:00", "End": "2026-11-30T18:05:00",
                "Partition": "a100,v100", "NodeList": "gpua1,gpuv[1-2]", "components": 2},
        "125": {"ElapsedRaw": None, "State": "COMPLETED", "Start": "2026-11-30T17:00:00", "End": "2026-11-30T17:10:00",
                "Partition": "rtx2060", "NodeList": "gpur1", "components": 1},
        "126": {"ElapsedRaw": None, "State": "CANCELLED", "Start": "Unknown", "End": "2026-11-30T17:00:00",
                "Partition": "v100", "NodeList": "None assigned", "components": 1}}
    # right after the end slurmdbd may list the hetjob as plain "<id>" too: its component rows win
    late = text.parse_sacct("9|RUNNING|x|Unknown|a100|n\n9+0|COMPLETED|x|y|a100|n\n9+1|FAILED|x|y|v100|m\n")
    assert watch.fold_rows(late)["9"]["State"] == "FAILED" and watch.fold_rows(late)["9"]["components"] == 2
    # with ElapsedRaw asked for: Slurm's elapsed seconds, the longest component's
    f7 = ("JobID", "State", "ElapsedRaw", "Start", "End", "Partition", "NodeList")
    rows = text.parse_sacct("7+0|COMPLETED|14|a|b|a100|n\n7+1|COMPLETED|13|a|b|v100|m\n", f7)
    assert watch.fold_rows(rows)["7"]["ElapsedRaw"] == 14


@pytest.mark.parametrize("states,want", [
    (["COMPLETED", "COMPLETED"], "COMPLETED"), (["COMPLETED", "RUNNING"], "RUNNING"),
    (["FAILED", "RUNNING"], "RUNNING"), (["COMPLETED", "CANCELLED by 0"], "CANCELLED"),
    (["TIMEOUT", "FAILED"], "TIMEOUT"), (["COMPLETED", "COMPLETING"], "COMPLETING"),
    (["REQUEUED", "PENDING"], "REQUEUED"), (["COMPLETED", "SIGNALING"], "SIGNALING"),
    (["", "COMPLETED"], "COMPLETED"), ([], "UNKNOWN"),
])
def test_fold_state(states, want):
    assert watch.fold_state(states) == want


def test_submitit_watcher_folds_like_sacct_states():
    from hpc_jabas.slurm.executor import HetSlurmInfoWatcher
    rows = ["JobID|State|NodeList", "123+0|RUNNING|gpua1", "123+0.batch|RUNNING|gpua1", "123+1|PENDING|None assigned",
            "124+0|COMPLETED|gpua1", "124+1|CANCELLED by 0|gpuv[1-2]", "125|COMPLETED|gpur1", "126|CANCELLED by 0|x"]
    info = HetSlurmInfoWatcher(delay_s=600).read_info("\n".join(rows) + "\n")
    want = {j: r["State"] for j, r in watch.fold_rows(text.parse_sacct(SACCT)).items()}
    assert {j: text.base_state(info[j]["State"]) for j in want} == want == \
        {"123": "RUNNING", "124": "CANCELLED", "125": "COMPLETED", "126": "CANCELLED"}
    assert info["124"]["NodeList"] == "gpua1,gpuv[1-2]" and info["124"]["JobID"] == "124"


# ---- scontrol, sbatch ---------------------------------------------------------------------------
# `scontrol show job -o 32` of a two-component hetjob on the local cluster (Slurm 22.05), as captured
_JOB0 = ("JobId=32 HetJobId=32 HetJobOffset=0 JobName=j.sh HetJobIdSet=32-33 UserId=root(0) GroupId=root(0) "
         "MCS_label=N/A Priority=4294901730 Nice=0 Account=root QOS=normal JobState=RUNNING Reason=None "
         "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 "
         "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-30T19:05:47 EligibleTime=2026-11-30T19:05:47 "
         "AccrueTime=2026-11-30T19:05:47 StartTime=2026-11-30T19:05:48 EndTime=Unknown Deadline=N/A "
         "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T19:05:48 Scheduler=Backfill Partition=a100 "
         "AllocNode:Sid=localhost:9458 ReqNodeList=(null) ExcNodeList=(null) NodeList=gpua1 BatchHost=gpua1 "
         "NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=100M,node=1,billing=4,"
         "gres/gpu=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=100M "
         "MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
         "Network=(null) Command=/var/tmp/hpc-jabas-slurm/shared/h5cap/j.sh WorkDir=/work/main "
         "Comment=moved by hpc-jabas  StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= "
         "TresPerNode=gres:gpu:a100:1 ")
_JOB1 = (_JOB0.replace("JobId=32 HetJobId=32 HetJobOffset=0", "JobId=33 HetJobId=32 HetJobOffset=1")
         .replace("Priority=4294901730", "Priority=4294901729").replace("Partition=a100", "Partition=v100")
         .replace("NodeList=gpua1 BatchHost=gpua1", "NodeList=gpuv1 BatchHost=gpuv1")
         .replace("NumCPUs=1 NumTasks=1", "NumCPUs=2 NumTasks=2").replace("cpu=1,mem=100M", "cpu=2,mem=100M")
         .replace("gres/gpu=1 ", "gres/gpu=2 ").replace("gres:gpu:a100:1", "gres:gpu:v100:2"))
SCONTROL_JOB = _JOB0 + "\n" + _JOB1 + "\n\n"


def test_parse_scontrol_show_job_of_a_hetjob():
    recs = text.parse_scontrol(SCONTROL_JOB)
    assert [(d["JobId"], d["HetJobId"], d["HetJobOffset"], d["Partition"], d["JobState"], d["NumTasks"],
             d["NodeList"]) for d in recs] == [("32", "32", "0", "a100", "RUNNING", "1", "gpua1"),
                                               ("33", "32", "1", "v100", "RUNNING", "2", "gpuv1")]
    d = recs[0]
    assert d["AllocNode:Sid"] == "localhost:9458" and d["CPUs/Task"] == "1" and d["ReqB:S:C:T"] == "0:0:*:*"
    assert d["Comment"] == "moved by hpc-jabas" and d["Power"] == "" and d["EndTime"] == "Unknown"
    assert d["TresPerNode"] == "gres:gpu:a100:1" and d["HetJobIdSet"] == "32-33"
    assert [text.parse_alloc_gpus(r["TRES"]) for r in recs] == [1, 2]
    assert [text.parse_gres(r["TresPerNode"].removeprefix("gres:")) for r in recs] == [{"a100": 1}, {"v100": 2}]
    assert len(d) == 65 and all(len(r) == 65 for r in recs)    # 67 words, 2 of them inside Comment


def test_parse_sbatch_id():
    assert text.parse_sbatch_id("123\n") == "123"
    assert text.parse_sbatch_id("\n456;cluster\n") == "456"
    assert text.parse_sbatch_id("Submitted batch job 5\n") is None
    assert text.parse_sbatch_id("") is None


# ---- the environment of a submission -------------------------------------------------------------
def test_submission_env_drops_the_running_jobs_variables():
    inner = {"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm.conf", "SLURM_JOB_ID": "7", "SLURM_HET_SIZE": "2",
             "SLURM_JOB_NODELIST_HET_GROUP_1": "gpuv1", "SLURMD_NODENAME": "gpua1", "SBATCH_PARTITION": "x",
             "PMIX_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_ALLOW_RUN_AS_ROOT": "1",
             "HOROVOD_RANK": "0", "SUBMITIT_FOLDER": "/f", "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": "/r"}
    assert sbatch.submission_env(inner) == {"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm.conf",
                                            "OMPI_ALLOW_RUN_AS_ROOT": "1", "PYTHONPATH": "/r"}
    outer = {"PATH": "/usr/bin", "OMPI_MCA_btl": "self,vader", "SLURM_CONF": "/c", "SBATCH_ACCOUNT": "a"}
    assert sbatch.submission_env(outer) == {"PATH": "/usr/bin", "OMPI_MCA_btl": "self,vader", "SLURM_CONF": "/c"}


# ---- the one subprocess wrapper -----------------------------------------------------------------
def _exe(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_proc_errors_are_one_line(tmp_path):
    _exe(tmp_path / "refuse", 'echo "sbatch: error: Batch job submission failed: Invalid feature" >&2\n'
                              'echo second line >&2\nexit 1\n')
    _exe(tmp_path / "hang", "sleep 5\n")
    _exe(tmp_path / "down", 'echo "sacct: error: Unable to contact slurm controller (connect failure)" >&2; exit 1\n')
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_CONF": "/etc/x.conf"}
    with pytest.raises(SlurmError) as e:
        proc.run(["refuse", "--parsable", "a b.sh"], env)
    assert str(e.value) == "`refuse --parsable 'a b.sh'` failed: sbatch: error: Batch job submission failed: " \
                           "Invalid feature"
    with pytest.raises(SlurmError) as e:
        proc.run(["refuse"], env, refused="sbatch refused 1.sbatch")
    assert str(e.value) == "sbatch refused 1.sbatch: sbatch: error: Batch job submission failed: Invalid feature"
    with pytest.raises(SlurmError) as e:
        proc.run(["hang"], env, timeout=0.3)
    assert str(e.value) == "Slurm controller unreachable: `hang` gave no answer in 0.3 s"
    with pytest.raises(SlurmError) as e:
        proc.run(["down", "-j", "1"], env)
    assert str(e.value) == ("Slurm controller unreachable: `down -j 1` said: sacct: error: Unable to contact slurm "
                            "controller (connect failure) (SLURM_CONF=/etc/x.conf; local cluster: slurm/local/up.sh)")
    with pytest.raises(SlurmError, match=r"^no Slurm here: nosuch not found on PATH; "):
        proc.run(["nosuch"], env)
    with pytest.raises(SlurmError, match=r"^no Slurm here: sacct not found on PATH"):
        proc.require(["sacct"], {"PATH": str(tmp_path)})
    assert proc.run(["echo", "ok"], env) == "ok\n"


# ---- submissions through a stand-in sbatch --------------------------------------------------------
@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch/srun stand-ins first on PATH; sbatch keeps the script and its own environment, says 4242."""
    b = tmp_path / "bin"
    b.mkdir()
    _exe(b / "sbatch", f'for a; do last=$a; done\ncp "$last" {b}/got.sh\n'
                       f'echo "id=$SLURM_JOB_ID part=$SBATCH_PARTITION pmix=$PMIX_RANK" > {b}/env.txt\necho 4242\n')
    _exe(b / "srun", "exit 0\n")
    monkeypatch.setenv("PATH", f"{b}:{os.environ['PATH']}")
    for k, v in {"SLURM_JOB_ID": "99", "SBATCH_PARTITION": "x", "PMIX_RANK": "0"}.items():  # as inside a job
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.delenv("SLURM_HET_JOB_ID", raising=False)
    monkeypatch.chdir("/tmp")
    return b


def test_submitit_hetjob_through_public_parameters(tmp_path, fake_slurm):
    from hpc_jabas.slurm.executor import EntryPoint, submit
    c = tmp_path / "chain"
    s = submit(_spec(c, {"v100": 2, "a100": 1}, method="submitit"), view=_view())
    assert (s.job_id, s.method, s.mix) == ("4242", "submitit", {"a100": 1, "v100": 2})
    assert (fake_slurm / "env.txt").read_text() == "id= part= pmix=\n"     # sbatch ran in a clean environment
    folder = c / "jobs" / "submitit"
    lines = (folder / "4242_submission.sh").read_text().splitlines()
    assert lines == (fake_slurm / "got.sh").read_text().splitlines()
    first_cmd = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#"))
    sb = [ln for ln in lines[:first_cmd] if ln.startswith("#SBATCH")]
    het = sb.index("#SBATCH hetjob")
    assert sb[het:] == ["#SBATCH hetjob",
                        "#SBATCH --partition=v100 --nodes=1 --ntasks=2 --mem=1024M --gres=gpu:v100:2 --time=60"]
    assert {"#SBATCH --partition=a100", "#SBATCH --gres=gpu:a100:1", "#SBATCH --ntasks-per-node=1",
            "#SBATCH --mem=512M", "#SBATCH --time=60", "#SBATCH --signal=USR2@60", "#SBATCH --chdir=" + str(c),
            f"#SBATCH --output={folder}/%j_0_log.out"} <= set(sb[:het])
    assert lines[lines.index("export SUBMITIT_EXECUTOR=slurm") + 1] == (
        sbatch.het_srun_python([Component("a100", 1), Component("v100", 2)], PY, folder)
        + f" -u -m hpc_jabas.slurm.node_entry {folder}")
    assert s.job.num_tasks == 3 and [s.job.task(k).paths.stdout.name for k in range(3)] == \
        ["4242_0_log.out", "4242_1_log.out", "4242_2_log.out"]
    sub = s.job.submission()
    assert sub.function == EntryPoint("hpc_jabas.runtime.job.launch:run_job") and sub.args[0].mix == s.mix
    ev = chainlog.read(c)
    assert [(e["event"], e["job_id"], e["mix"], e["by"]) for e in ev] == [("submit", "4242", s.mix, "job 99")]


def test_one_partition_submitit_job_uses_submitits_srun(tmp_path, fake_slurm):
    from hpc_jabas.slurm.executor import submit
    s = submit(_spec(tmp_path / "c", {"v100": 3}, method="submitit"), view=_view())
    lines = (fake_slurm / "got.sh").read_text().splitlines()
    assert "#SBATCH --ntasks=3" in lines and "#SBATCH --gpus-per-task=v100:1" in lines and "#SBATCH --nodes=2" in lines
    assert not any("hetjob" in ln or "hj_srun srun" in ln for ln in lines)
    cmd = lines[lines.index("export SUBMITIT_EXECUTOR=slurm") + 1]
    assert cmd.startswith("srun --unbuffered --output ") and " --mpi=pmix --kill-on-bad-exit=1 " + PY in cmd
    assert s.job.num_tasks == 3


def test_sbatch_method_writes_script_and_spec(tmp_path, fake_slurm):
    from hpc_jabas.slurm.executor import submit
    c = tmp_path / "chain"
    s = submit(_spec(c, {"a100": 1, "v100": 2}), view=_view())
    assert (s.job_id, s.method, s.script) == ("4242", "sbatch", c / "jobs" / "1.sbatch")
    assert s.script.read_text() == (fake_slurm / "got.sh").read_text()
    assert JobSpec.load(c / "jobs" / "1.json").mix == {"a100": 1, "v100": 2}
    assert s.script.read_text().splitlines()[-1].endswith(f"-u -m hpc_jabas.runtime.job.launch --after-failure "
                                                          f'"$rc" {c}/jobs/1.json; exit "$rc"; }}')
    s2 = submit(_spec(c, {"a100": 1}), view=_view())
    assert s2.script == c / "jobs" / "2.sbatch"
    assert [e["script"] for e in chainlog.read(c)] == [str(s.script), str(s2.script)]


def test_sbatch_refusal_and_bad_method(tmp_path, fake_slurm):
    from hpc_jabas.slurm.executor import submit
    _exe(fake_slurm / "sbatch", 'echo "sbatch: error: Invalid feature specification" >&2; exit 1\n')
    c = tmp_path / "chain"
    with pytest.raises(SlurmError) as e:
        submit(_spec(c, {"a100": 1}), view=_view())
    assert str(e.value) == "sbatch refused 1.sbatch: sbatch: error: Invalid feature specification"
    assert chainlog.read(c) == []
    with pytest.raises(ConfigError, match=r"^method 'qsub' is unknown; valid: submitit, sbatch$"):
        submit(_spec(c, {"a100": 1}), method="qsub", view=_view())


def test_entry_point_is_a_name_resolved_when_called():
    from hpc_jabas.slurm.executor import EntryPoint
    ep = EntryPoint("json:dumps")
    assert pickle.loads(cloudpickle.dumps(ep)) == ep and ep([1, 2]) == "[1, 2]"
    assert EntryPoint().target == sbatch.JOB_ENTRY == "hpc_jabas.runtime.job.launch:run_job"


def test_slurm_options_are_typed_and_checked_once(tmp_path):
    assert SlurmOptions.of(_spec(tmp_path, {"v100": 1})) == SlurmOptions(60, 60, 3, 2, 512)
    spec = JobSpec(task="examples.train_digits:build", config={"slurm": {"time_min": 30, "max_failures": 4}},
                   chain_dir=str(tmp_path), mix={"v100": 1}, extra={"max_failures": "5", "mem_per_task_mb": 1024.0})
    assert SlurmOptions.of(spec) == SlurmOptions(30, 60, 3, 5, 1024)       # extra over the config over defaults
    assert slurm_option(spec, "time_min") == 30
    for bad, needle in (({"time_min": "soon"}, "time_min='soon' must be an integer >= 1"),
                        ({"signal_lead_s": 0}, "signal_lead_s=0 must be an integer >= 1"),
                        ({"max_timeouts": 1.5}, "max_timeouts=1.5 must be an integer >= 0"),
                        ({"max_failures": True}, "max_failures=True must be an integer >= 0"),
                        ({"mem_per_task_mb": "lots"}, "mem_per_task_mb='lots' must be an integer >= 1")):
        with pytest.raises(ConfigError) as e:
            SlurmOptions.of(_spec(tmp_path, {"v100": 1}, **bad))
        assert str(e.value) == needle and "\n" not in str(e.value)


def test_account_qos_and_sbatch_args_are_checked_before_any_script_or_submission(tmp_path):
    """A value that would break or inject into an #SBATCH line, or override what the plan sets, is one line; the
    submission stops before it writes anything or calls sbatch (sbatch is not even looked up: no Slurm needed)."""
    from hpc_jabas.slurm import executor
    from hpc_jabas.slurm.components import check_extra, extra_args, per_component_options
    ok = _spec(tmp_path, {"v100": 1}, account="proj-1", qos="low", sbatch_args="--constraint=ib --exclusive")
    check_extra(ok)
    assert per_component_options(ok) == {"time": "60", "account": "proj-1", "qos": "low"}
    assert extra_args(ok) == ["--constraint=ib", "--exclusive"]
    for bad, needle in (
            ({"account": "proj\n#SBATCH --wrap=x"}, "account='proj\\n#SBATCH --wrap=x' is invalid; it must be a Slurm "
                                                    "account name"),
            ({"qos": "hi gh"}, "qos='hi gh' is invalid; it must be a Slurm qos name"),
            ({"account": 7}, "account=7 is invalid"),
            ({"sbatch_args": ["--constraint=a\nrm -rf /"]}, "sbatch_args item '--constraint=a\\nrm -rf /' is invalid"),
            ({"sbatch_args": ["-C", "ib"]}, "sbatch_args item '-C' is invalid; each must be --flag or --flag=value, "
                                            "long form"),
            ({"sbatch_args": "--comment='a"}, "sbatch_args=\"--comment='a\" is invalid (No closing quotation)"),
            ({"sbatch_args": 5}, "sbatch_args=5 is invalid; give a list"),
            ({"sbatch_args": ["--time=10"]}, "sbatch_args item '--time=10' is refused: hpc-jabas sets --time itself, "
                                             "from time_min"),
            ({"sbatch_args": ["--partition=a100"]}, "hpc-jabas sets --partition itself, from the mix"),
            ({"sbatch_args": ["--output=/tmp/x"]}, "hpc-jabas sets --output itself, from the chain directory")):
        spec = _spec(tmp_path / "c", {"v100": 1}, **bad)
        with pytest.raises(ConfigError) as e:
            check_extra(spec)
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
        with pytest.raises(ConfigError) as e2:
            executor.submit(spec, env={"PATH": ""})
        assert str(e2.value) == str(e.value)
    assert not (tmp_path / "c").exists()
