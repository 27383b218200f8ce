"""A resubmission chain on the real local Slurm cluster (slurm/local): submit, epoch-end move, resume.

(b) by hand: `sbatch slurm/jabas-hetjob.sbatch JOB.toml` after `module load hpc-jabas`: digits on a
    heterogeneous job {a100:1, v100:2} on the torch backend, adaptive B (similarity policy), CPU ranks emulating their
    partition's GPU type; the epoch-end auto-scaler (objective cost, limited to 3 x v100) moves it through
    method sbatch onto two nodes; the second job finishes. Checked: chain events, the ranks' GPU types per
    job, the rendered job script, sacct, and the final parameters against one process replaying the same B
    trajectory (metrics.jsonl; tests/chain_checks.py).
(c) `hpc-jabas status CHAIN_DIR` shows both jobs of the chain.
The same chain under submitit, submitted from Python, is the demo's (tests/test_demo.py: the same checks, and
submitit's own job objects). Plus cheap checks: job scripts against the real cluster's view, one-line errors
(the environment cleaning and the rest of the script text: tests/test_slurm_text.py).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from chain_checks import check_moves, check_parameters, events
from slurm_env import cluster_lock

from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.errors import ConfigError, SlurmError

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python")
HPC_JABAS = str(ROOT / ".venv" / "bin" / "hpc-jabas")
LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
CHAIN_TIMEOUT_S = 200

TRAIN = {"epochs": 2, "batch": 128, "batch_min": 64, "batch_max": 256, "policy": "similarity", "p": 4,
         "emulate": True, "seed": 0, "metrics_period": 5}


def autoscale_to(partition: str, n: int) -> dict:
    """Force the epoch-end choice: only n GPUs of `partition` besides the current mix, cost objective
    (a100 bills 4/GPU-h, v100 2, rtx2060 1), no restart overhead prior and no margin."""
    return {"objective": "cost", "allowed": [partition], "min_gpus": n, "max_gpus": n,
            "restart_prior_s": 0.0, "margin": 0.0}


# ---- helpers ------------------------------------------------------------------------------------
def follow(chain_dir, first_job: str, timeout: float = CHAIN_TIMEOUT_S) -> dict:
    from hpc_jabas.slurm.watch import wait_chain
    res = wait_chain(chain_dir, first_job, timeout=timeout, poll_s=0.5)
    if not res["ok"]:
        subprocess.run(["scancel", *res["jobs"]], capture_output=True, timeout=30)
        logs = []
        for p in sorted((Path(chain_dir) / "jobs").rglob("*")):
            if p.is_file() and p.suffix in (".out", ".err"):
                logs.append(f"--- {p.name}\n{p.read_text()[-1500:]}")
        pytest.fail(f"chain from job {first_job} stopped: {res}\nchain:\n"
                    + "\n".join(json.dumps(e) for e in events(chain_dir)) + "\n" + "\n".join(logs[-6:]))
    return res


def first_decision(chain_dir) -> dict:
    """The auto-scaler's record at the end of epoch 0 (run/metrics.jsonl)."""
    p = Path(chain_dir) / "run" / "metrics.jsonl"
    recs = [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []
    return next((r for r in recs if r.get("type") == "autoscale" and r.get("epoch") == 0), {})


def run_chain(cluster, name: str, start, target: dict, attempts: int = 3) -> dict:
    """start(workdir) -> (chain_dir, first job id); follow the chain. The cluster is shared with other
    sessions: when the forced target's GPUs were busy at the epoch end (the target is then no
    candidate and the job stays), run the chain again in a fresh directory."""
    from hpc_jabas.core.autoscale.scaler import mix_label
    tried = []
    for k in range(attempts):
        w = cluster.shared / f"{name}-{os.getpid()}-{k}"
        shutil.rmtree(w, ignore_errors=True)
        w.mkdir(mode=0o777)
        chain_dir, first = start(w)
        res = follow(chain_dir, first)
        dec = first_decision(chain_dir)
        labels = [r.get("label") for r in dec.get("table") or []]
        if dec.get("move") or (mix_label(target) in labels and not dec.get("error")):
            return {"work": w, "chain": chain_dir, "job_id": first, "follow": res, "attempts": k + 1}
        tried.append(f"attempt {k + 1}: {dec.get('reason') or dec.get('error')} (candidates {labels})")
        _settle(cluster, res["jobs"])
        shutil.rmtree(w, ignore_errors=True)
    pytest.fail(f"{name}: the target {target} never had free GPUs at the epoch end: " + "; ".join(tried))


def _settle(cluster, jobs) -> None:
    """Let the chain's jobs exit on their own (their ranks finish after the chain's end event), then cancel."""
    for j in jobs:
        try:
            cluster.wait_state(j, timeout=30)
        except AssertionError:
            pass
    cluster.cancel(*jobs)


def status_text(cluster, chain_dir) -> str:
    # --wait: until every job of the chain has ended and Slurm has released it (the last job's exit)
    r = subprocess.run([HPC_JABAS, "status", str(chain_dir), "--wait", "60"], capture_output=True, text=True,
                       env=cluster.env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


# ---- (b) by hand: sbatch slurm/jabas-hetjob.sbatch JOB.toml --------------------------------------
def _toml(chain_dir: Path, auto: dict) -> str:
    def val(v):
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()
    # on the torch backend (docs/backends.md): the same chain under submitit (tests/test_demo.py) runs on Horovod
    lines = [f"{k} = {val(v)}" for k, v in {**TRAIN, "backend": "torch"}.items()]
    lines += ["[job]", 'task = "examples.train_digits:build"', f"chain_dir = {json.dumps(str(chain_dir))}",
              'method = "sbatch"', "[autoscale]"] + [f"{k} = {val(v)}" for k, v in auto.items()]
    return "\n".join(lines) + "\n"


def _module_shell(cmd: str) -> list[str]:
    """`module load hpc-jabas` then cmd (Lmod when installed; else what the modulefile sets)."""
    if LMOD_INIT.exists():
        pre = f"source {LMOD_INIT} && module use {ROOT}/modulefiles && module load hpc-jabas && "
    else:
        pre = (f"export HPC_JABAS_ROOT={ROOT} PATH={ROOT}/.venv/bin:$PATH "
               f"PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}} && ")
    return ["bash", "--noprofile", "--norc", "-c", pre + cmd]


@pytest.fixture(scope="module")
def hand_chain(slurm_cluster):
    env = {k: v for k, v in slurm_cluster.env.items()
           if not k.startswith(("LMOD", "MODULE", "_ModuleTable", "__LMOD", "PYTHONPATH", "HPC_JABAS_ROOT"))}

    def start(w):
        (w / "job.toml").write_text(_toml(w / "chain", autoscale_to("v100", 3)))
        cmd = f"sbatch --parsable --output={w}/hand-%j.out {ROOT}/slurm/jabas-hetjob.sbatch job.toml"
        r = subprocess.run(_module_shell(cmd), cwd=w, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return w / "chain", r.stdout.strip().split(";")[0]

    with cluster_lock(slurm_cluster, exclusive=False):
        out = run_chain(slurm_cluster, "chain-hand", start, {"v100": 3})
    out["dir"] = out["work"]
    yield out
    _settle(slurm_cluster, out["follow"]["jobs"])
    shutil.rmtree(out["work"], ignore_errors=True)


def test_hetjob_sbatch_by_hand_moves_with_sbatch(slurm_cluster, hand_chain):
    c = hand_chain["chain"]
    j1, j2 = check_moves(c, {"a100": 1, "v100": 2}, by_hand=True, epochs=TRAIN["epochs"])
    ev = events(c)
    assert next(e for e in ev if e["event"] == "move")["mix"] == {"v100": 3}
    # both jobs on the torch backend, the heterogeneous job's components one world under srun
    assert [(e["backend"], e["launcher"], e["world"]) for e in ev if e["event"] == "start"] == \
        [("torch", "srun", 3), ("torch", "srun", 3)], ev
    assert j1 == hand_chain["job_id"]
    log = (c / "jobs" / f"sbatch-{j1}.out").read_text()       # the template writes under the chain directory
    assert "hpc-jabas: hetjob" in log and ".venv/bin/python" in log
    # the resubmission was a rendered job script (method sbatch), spanning two v100 nodes
    script = (c / "jobs" / "1.sbatch").read_text()
    assert "--partition=v100 --nodes=2 --ntasks=3" in script and "--gpus-per-task=v100:1" in script
    assert "-m hpc_jabas.runtime.job.launch" in script and "--het-group" not in script
    assert JobSpec.load(c / "jobs" / "1.json").mix == {"v100": 3}
    assert slurm_cluster.wait_state(j2, timeout=60) == "COMPLETED"
    acct = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID,Partition,State,NodeList", "-j", j2).stdout
    assert acct.startswith(f"{j2}|v100|COMPLETED|gpuv[1-2]"), acct
    check_parameters(c, {3})


# ---- (c) hpc-jabas status ---------------------------------------------------------------------
def test_status_shows_the_chains_two_jobs(slurm_cluster, hand_chain):
    d, jobs = hand_chain["chain"], hand_chain["follow"]["jobs"]
    out = status_text(slurm_cluster, d)
    lines = out.splitlines()
    rows = {ln.split()[0]: ln.split() for ln in lines[2:] if ln.split() and ln.split()[0].isdigit()}
    assert list(rows) == jobs, out
    first, second = rows[jobs[0]], rows[jobs[1]]
    assert "moved" in first and "COMPLETED" in first and "0->1" in first, out
    assert "finished" in second and "COMPLETED" in second and "1->2" in second and "sbatch" in second, out
    assert lines[-1].startswith(f"current: finished (job {jobs[1]}"), out
    assert "1 restart(s)" in out
    r = subprocess.run([HPC_JABAS, "status", str(d), "--json"], capture_output=True, text=True,
                       env=slurm_cluster.env, timeout=60)
    st = json.loads(r.stdout)
    assert [j["job_id"] for j in st["jobs"]] == jobs
    assert st["total_cost"] > 0 and st["jobs"][0]["cost"] > 0 and st["jobs"][1]["slurm"] == "COMPLETED"


# ---- cheap checks -------------------------------------------------------------------------------
def test_components_span_nodes_and_keep_partition_order(slurm_cluster):
    from hpc_jabas.slurm.cluster import read_cluster
    from hpc_jabas.slurm.components import components, parse_mix
    from hpc_jabas.slurm.sbatch import render_sbatch
    view = read_cluster()
    comps = components({"v100": 3, "a100": 1, "rtx2060": 4}, view)
    assert [(c.partition, c.ntasks, c.nodes) for c in comps] == [("a100", 1, 1), ("rtx2060", 4, 1), ("v100", 3, 2)]
    spec = JobSpec(task="examples.train_digits:build", config={}, chain_dir="/x", mix={"a100": 1}, python="/py")
    text = render_sbatch(spec, comps, "/x/jobs/1.json", "/x/jobs/1-%j.out")
    assert text.count("#SBATCH hetjob") == 2
    assert "srun --het-group=0,1,2 --mpi=pmix" in text
    assert text.index("--partition=a100") < text.index("--partition=rtx2060") < text.index("--partition=v100")
    assert parse_mix("v100:2, a100:1") == {"a100": 1, "v100": 2}
    for bad in ("a100", "a100:0", "a100:x", "a100:1,a100:2", ""):
        with pytest.raises(ConfigError):
            parse_mix(bad)
    with pytest.raises(ConfigError, match="unknown partition 'h100'"):
        components({"h100": 1}, view)
    with pytest.raises(ConfigError, match="has 2 in all"):
        components({"a100": 3}, view)


def test_sbatch_refusal_is_one_clear_slurm_error(slurm_cluster, slurm_tmp):
    from hpc_jabas.slurm.executor import submit_job
    spec = JobSpec(task="examples.train_digits:build", config={}, chain_dir=str(slurm_tmp), mix={"a100": 1},
                   method="sbatch", extra={"sbatch_args": ["--constraint=no-such-feature"]})
    with pytest.raises(SlurmError) as e:
        submit_job(spec)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("sbatch refused") and "Invalid feature specification" in msg, msg
    assert not any(ev["event"] == "submit" for ev in events(slurm_tmp))
    with pytest.raises(SlurmError, match="SLURM_CONF=/nonexistent"):
        from hpc_jabas.slurm.executor import submit
        submit(spec, env={**os.environ, "SLURM_CONF": "/nonexistent"})


def test_cli_misuse_exits_2_with_one_line(slurm_cluster, slurm_tmp):
    job = slurm_tmp / "job.toml"
    job.write_text(_toml(slurm_tmp / "chain", {"objective": "cost"}))
    bad_key = slurm_tmp / "bad.toml"
    bad_key.write_text('[job]\ntask = "examples.train_digits:build"\nchain_dir = "c"\nepochs = 2\n')
    mb = slurm_tmp / "mb.toml"                      # bad input found at submit, not on the cluster
    mb.write_text("micro_batch = 1000\n" + _toml(slurm_tmp / "mb", {"objective": "cost"}))
    (slurm_tmp / "badtask.py").write_text("def build():\n    return None\n")
    none_task = slurm_tmp / "none.toml"
    none_task.write_text(_toml(slurm_tmp / "nt", {}).replace("examples.train_digits:build", "badtask:build")
                         .replace('method = "sbatch"', f'method = "sbatch"\npythonpath = ["{slurm_tmp}"]'))
    no_callable = slurm_tmp / "nc.toml"
    no_callable.write_text(_toml(slurm_tmp / "nc", {}).replace("train_digits:build", "train_digits:nope"))
    busy = slurm_tmp / "busy.toml"                  # a chain whose run directory another process holds
    busy.write_text(_toml(slurm_tmp / "busy", {"objective": "cost"}))
    code = ("import time; from hpc_jabas.runtime.persist.dirlock import DirLock; "
            f"DirLock({str(slurm_tmp / 'busy' / 'run')!r}).acquire(); print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert holder.stdout.readline().strip() == "held"
    cases = [(["submit", str(busy), "--mix", "rtx2060:1"], f"is in use by pid {holder.pid}"),
             (["submit", str(job), "--mix", "rtx2060:1", "--time-min", "0"], "--time-min 0 must be >= 1"),
             (["submit", str(mb), "--mix", "rtx2060:1"], "micro_batch=1000 does not fit the memory of partition "
                                                         "'rtx2060'"),
             (["submit", str(none_task), "--mix", "rtx2060:1"], "returned NoneType; it must return a hpc_jabas.Task"),
             (["submit", str(no_callable), "--mix", "rtx2060:1"], "has no attribute 'nope'"),
             (["submit", str(job), "--mix", "a100:x"], "PARTITION:COUNT"),
             (["submit", str(job), "--mix", "h100:1"], "unknown partition 'h100'"),
             (["submit", str(job)], "no mix"),
             (["submit", str(bad_key), "--mix", "a100:1"], "unknown [job] key 'epochs'"),
             (["status", str(slurm_tmp / "nowhere")], "does not exist"),
             (["status", str(slurm_tmp)], "no chain")]
    for args, want in cases:
        r = subprocess.run([HPC_JABAS, *args], capture_output=True, text=True, env=slurm_cluster.env, timeout=60,
                           cwd=ROOT)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and want in lines[0], (args, r.stderr)
    holder.kill()
    holder.wait()
    for d in ("busy", "mb", "nt", "nc"):
        assert not (slurm_tmp / d / "jobs").exists(), d     # nothing was submitted
