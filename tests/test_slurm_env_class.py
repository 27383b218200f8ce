"""hpc_jabas/slurm/env.py: SlurmEnv, the one table of Slurm's variables.

A table of environments as Slurm 22.05 sets them (a plain batch job, a task of its srun step, a task of a
heterogeneous step's second component, an interactive srun --pty step, a requeued job, no Slurm at all) and
what each rule reads from them; and a check of the package's source that no other module reads a Slurm
variable itself."""
from __future__ import annotations

import ast
import re
import signal
from pathlib import Path

import pytest

from hpc_jabas.errors import ConfigError
from hpc_jabas.slurm.env import SlurmEnv

ROOT = Path(__file__).resolve().parents[1] / "hpc_jabas"

PLAIN_BATCH = {"SLURM_JOB_ID": "812", "SLURM_JOBID": "812", "SLURM_JOB_NODELIST": "gpuv[1-2]",
               "SLURM_NODELIST": "gpuv[1-2]", "SLURM_JOB_PARTITION": "v100", "SLURM_NTASKS": "8",
               "SLURMD_NODENAME": "gpuv1", "SLURM_CONF": "/opt/slurm/slurm.conf"}
PLAIN_STEP = {**PLAIN_BATCH, "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
              "SLURM_STEP_NUM_TASKS": "6", "SLURM_STEP_NODELIST": "gpuv2", "SLURMD_NODENAME": "gpuv2"}
HET_STEP = {"SLURM_JOB_ID": "901", "SLURM_HET_JOB_ID": "900", "SLURM_HET_SIZE": "2", "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "3", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURMD_NODENAME": "gpup02",
            "SLURM_JOB_PARTITION": "v100",                    # not this component's (Slurm 22.05)
            "SLURM_JOB_NODELIST_HET_GROUP_0": "gpuv[1-2]", "SLURM_JOB_PARTITION_HET_GROUP_0": "v100",
            "SLURM_NTASKS_HET_GROUP_0": "2",
            "SLURM_JOB_NODELIST_HET_GROUP_1": "gpup[01-02]", "SLURM_JOB_PARTITION_HET_GROUP_1": "p100",
            "SLURM_NTASKS_HET_GROUP_1": "4"}
#: what a task of component 1 saw in a het job (a100 x1 + v100 x2, srun --het-group=0,1) on the local Slurm 22.05
#: cluster: no SLURM_HET_JOB_ID, SLURM_JOB_ID the leader's id in every component
LOCAL_HET_STEP = {"SLURM_JOB_ID": "64", "SLURM_HET_SIZE": "2", "SLURM_JOB_ID_HET_GROUP_0": "64",
                  "SLURM_JOB_ID_HET_GROUP_1": "65", "SLURM_JOB_PARTITION": "v100", "SLURM_PROCID": "2",
                  "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "gpuv1",
                  "SLURM_JOB_PARTITION_HET_GROUP_0": "a100", "SLURM_JOB_PARTITION_HET_GROUP_1": "v100",
                  "SLURM_JOB_NODELIST_HET_GROUP_0": "gpua1", "SLURM_JOB_NODELIST_HET_GROUP_1": "gpuv1",
                  "SLURM_NTASKS_HET_GROUP_0": "1", "SLURM_NTASKS_HET_GROUP_1": "2"}
PACK_STEP = {"SLURM_JOB_ID": "77", "SLURM_PACK_SIZE": "2", "SLURMD_NODENAME": "b1", "SLURM_PROCID": "0",
             "SLURM_STEP_ID": "2", "SLURM_JOB_NODELIST_PACK_GROUP_0": "a1", "SLURM_JOB_PARTITION_PACK_GROUP_0": "pa",
             "SLURM_JOB_NODELIST_PACK_GROUP_1": "b[1-3]", "SLURM_JOB_PARTITION_PACK_GROUP_1": "pb"}
PTY = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_PTY_PORT": "4242",
       "SLURM_JOB_PARTITION": "a100,v100"}
REQUEUED = {"SLURM_JOB_ID": "44", "SLURM_RESTART_COUNT": "2", "SLURM_STEP_ID": "batch"}
NONE: dict[str, str] = {}

# env -> (job id, inside, batch, in a step, procid, step tasks, node, rank partition, het component, het size,
#         nodes, mix, restarts)
TABLE = [
    (PLAIN_BATCH, "812", True, True, False, None, 8, "gpuv1", "v100", None, None, ["gpuv1", "gpuv2"],
     {"v100": 8}, 0),
    (PLAIN_STEP, "812", True, True, True, 5, 6, "gpuv2", "v100", None, None, ["gpuv1", "gpuv2"], {"v100": 8}, 0),
    (HET_STEP, "900", True, True, True, 3, 2, "gpup02", "p100", 1, 2, ["gpup01", "gpup02", "gpuv1", "gpuv2"],
     {"p100": 4, "v100": 2}, 0),
    (LOCAL_HET_STEP, "64", True, True, True, 2, 3, "gpuv1", "v100", 1, 2, ["gpua1", "gpuv1"], {"a100": 1, "v100": 2},
     0),
    (PACK_STEP, "77", True, True, True, 0, None, "b1", "pb", 1, 2, ["a1", "b1", "b2", "b3"], {}, 0),
    (PTY, "5", True, False, True, 0, None, None, None, None, None, [], {}, 0),
    (REQUEUED, "44", True, True, False, None, None, None, None, None, None, [], {}, 2),
    (NONE, None, False, False, False, None, None, None, None, None, None, [], {}, 0),
]


@pytest.mark.parametrize("env,job,inside,batch,step,procid,ntasks,node,part,comp,size,nodes,mix,restarts", TABLE)
def test_slurm_env_table(env, job, inside, batch, step, procid, ntasks, node, part, comp, size, nodes, mix,
                         restarts):
    e = SlurmEnv(env)
    got = (e.job_id, e.inside, e.batch, e.in_step, e.procid, e.step_ntasks, e.node_name, e.rank_partition(),
           e.het_component, e.het_size, e.nodes(), e.mix(), e.restart_count)
    assert got == (job, inside, batch, step, procid, ntasks, node, part, comp, size, nodes, mix, restarts)
    assert e.local_job_id() == (job if job else e.local_job_id()) and e.local_job_id().startswith(job or "local-")


def test_slurm_env_details():
    het = SlurmEnv(HET_STEP)
    assert het.is_job("900") and het.is_job(901) and not het.is_job("902")
    assert [(g.index, g.partition, g.ntasks) for g in het.het_groups()] == [(0, "v100", 2), (1, "p100", 4)]
    assert SlurmEnv(PLAIN_STEP).step_nodelist == "gpuv2" and SlurmEnv(PLAIN_BATCH).step_nodelist == "gpuv[1-2]"
    assert SlurmEnv(PLAIN_BATCH).conf == "/opt/slurm/slurm.conf" and SlurmEnv(NONE).conf is None
    assert SlurmEnv.job_variable("SLURM_JOB_ID") and SlurmEnv.job_variable("SRUN_DEBUG")
    assert not SlurmEnv.job_variable("SLURM_CONF") and not SlurmEnv.job_variable("PATH")
    assert SlurmEnv.STOP_SIGNALS == (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
    assert SlurmEnv({"SLURM_STEP_ID": "interactive", "SLURM_PROCID": "0"}).in_step is False
    with pytest.raises(ConfigError, match=r"^SLURM_PROCID='x' in the environment is invalid; it must be an integer$"):
        _ = SlurmEnv({"SLURM_PROCID": "x"}).procid


def test_slurm_env_reads_os_environ_live(monkeypatch):
    e = SlurmEnv()
    monkeypatch.delenv("SLURM_HET_JOB_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    assert e.job_id == "123"
    monkeypatch.setenv("SLURM_JOB_ID", "124")
    assert e.job_id == "124"


# ---- no other module reads Slurm's variables ------------------------------------------------------
SLURM_NAME = re.compile(r"SLURMD?_[A-Z0-9_]*[A-Z0-9]")
#: (module, variable): reads still outside the class, each with its reason (empty: none)
ALLOWED: set[tuple[str, str]] = set()


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def slurm_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of every Slurm variable name in the code as a string constant (or the head of an
    f-string: SLURM_..._{k}) other than a docstring or the key of an assignment (a write into an
    environment that a command will run in)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        for t in getattr(node, "targets", []):        # env["SLURM_CONF"] = ... writes
            if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant):
                skip.add(id(t.slice))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            head = node.values[0] if node.values else None
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and SLURM_NAME.match(head.value):
                out.append((node.lineno, head.value))
            for v in node.values:
                skip.add(id(v))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if SLURM_NAME.fullmatch(node.value):
                out.append((node.lineno, node.value))
    return out


def test_the_checker_finds_reads():
    src = '''
import os
def f(env, k):
    """SLURM_JOB_ID in a docstring is no read."""
    a = os.environ.get("SLURM_JOB_ID")
    b = os.getenv("SLURMD_NODENAME")
    c = env["SLURM_PROCID"]
    d = "SLURM_PTY_PORT" in env
    e = any(x in env for x in ("OMPI_COMM_WORLD_SIZE", "SLURM_JOBID"))
    g = env.get(f"SLURM_JOB_NODELIST_HET_GROUP_{k}")
    env["SLURM_CONF"] = "/etc/slurm.conf"
    h = "echo $SLURM_JOB_ID"
'''
    assert sorted(n for _, n in slurm_reads(src)) == sorted(["SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_PROCID",
                                                             "SLURM_PTY_PORT", "SLURM_JOBID",
                                                             "SLURM_JOB_NODELIST_HET_GROUP_"])


def test_only_the_class_reads_slurm_variables():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        if rel == "hpc_jabas/slurm/env.py":
            continue
        found += [f"{rel}:{line}: {name}" for line, name in slurm_reads(path.read_text())
                  if (rel, name) not in ALLOWED]
    assert not found, "read Slurm's variables through hpc_jabas.slurm.env.SlurmEnv:\n" + "\n".join(found)
