"""The failure path does not resubmit a job that died of the same deterministic error twice
(runtime/job/launch.py resubmit_after_failure, slurm/chain.py): the signature (type, message, innermost frame) that a
rank records as a chain ``error`` event, the pure decision over chain events, and the batch shell's path with a
fake submit (no Slurm)."""
import json
import subprocess
import sys
from pathlib import Path

from hpc_jabas.core.config.jobspec import JobSpec
from hpc_jabas.runtime.job.launch import resubmit_after_failure
from hpc_jabas.slurm import chain as chainlog

ROOT = Path(__file__).resolve().parents[1]


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


def test_the_signature_is_type_message_and_the_innermost_frame():
    e = raised(AttributeError("'str' object has no attribute 'to'\n  (in build)"))
    sig = chainlog.failure_signature(e)
    line = raised.__code__.co_firstlineno + 2                     # the raise inside raised()
    assert sig == {"type": "builtins.AttributeError", "message": "'str' object has no attribute 'to' (in build)",
                   "where": f"{__file__}:{line}"}
    assert chainlog.failure_signature(ValueError("x" * 1000))["message"] == "x" * chainlog.SIGNATURE_MESSAGE_CHARS
    assert chainlog.failure_signature(ValueError("never raised"))["where"] == ""


SIG = {"type": "builtins.TypeError", "message": "bad operand", "where": "/u/task.py:12"}


def ev(event, t, **kw):
    return {"event": event, "time": t, **kw}


def test_the_decision_refuses_only_the_same_signature_as_the_previous_failure():
    first = [ev("start", 1, job_id="7"), ev("error", 2, job_id="7", rank=1, signature=SIG),
             ev("error", 3, job_id="7", rank=0, signature=dict(SIG, message="peer failed")),
             ev("end", 4, job_id="7", state="failed", signature=SIG), ev("start", 5, job_id="9")]
    assert chainlog.job_failure_signature(first, "7", since=1) == SIG                 # the first rank's error
    assert chainlog.job_failure_signature(first, "9", since=5) is None                # no rank said (killed)
    assert chainlog.job_failure_signature(first, "7", since=4) is None                # not this run of the job
    assert chainlog.repeated_failure(first, SIG, before=5)["job_id"] == "7"
    for other in (dict(SIG, message="other"), dict(SIG, where="/u/task.py:13"), dict(SIG, type="builtins.KeyError"),
                  None):
        assert chainlog.repeated_failure(first, other, before=5) is None, other
    assert chainlog.repeated_failure(first, SIG, before=4) is None                    # no failure before
    killed = first + [ev("end", 6, job_id="9", state="failed", signature=None), ev("start", 7, job_id="11")]
    assert chainlog.repeated_failure(killed, SIG, before=7) is None                   # the previous one differs
    assert chainlog.repeated_failure([ev("end", 1, job_id="5", state="finished", signature=SIG)], SIG, 2) is None


def test_the_batch_shell_resubmits_a_first_failure_and_not_the_same_one_again(tmp_path, capfd):
    spec = JobSpec(task="t:build", config={"slurm": {"max_failures": 5}}, chain_dir=str(tmp_path),
                   mix={"rtx2060": 2}, method="sbatch")
    subs = []

    def fake_submit(s):
        subs.append(s.mix)
        return str(8 + 2 * len(subs) - 1)
    kw = {"sleep": lambda s: None, "submit": fake_submit, "env": {"SLURM_CONF": "/nonexistent"}}
    chainlog.append(tmp_path, "start", job_id="7")
    chainlog.append(tmp_path, "error", job_id="7", rank=0, signature=SIG)
    assert resubmit_after_failure(spec, "7", 1, **kw) == "9"
    end, req = chainlog.read(tmp_path)[-2:]
    assert end["event"] == "end" and end["signature"] == SIG and "message" not in end
    assert req["event"] == "requeue" and req["reason"] == "failure" and req["signature"] == SIG
    chainlog.append(tmp_path, "start", job_id="9")
    chainlog.append(tmp_path, "error", job_id="9", rank=1, signature=dict(SIG, message="another"))
    assert resubmit_after_failure(spec, "9", 1, **kw) == "11"                        # a different error: again
    chainlog.append(tmp_path, "start", job_id="11")
    chainlog.append(tmp_path, "error", job_id="11", rank=0, signature=dict(SIG, message="another"))
    capfd.readouterr()
    assert resubmit_after_failure(spec, "11", 1, **kw) is None and len(subs) == 2
    last = chainlog.read(tmp_path)[-1]
    assert last["event"] == "end" and last["state"] == "failed" and last["resubmitted"] is False
    assert "same error as job 9" in last["message"] and "not resubmitted" in last["message"]
    # said once, on stderr, in one line (the log handler writes to the file descriptor, whatever ran before)
    said = [ln for ln in capfd.readouterr().err.splitlines() if "same error" in ln]
    assert len(said) == 1 and "\n" not in said[0]
    chainlog.append(tmp_path, "start", job_id="13")                                   # killed: no signature
    assert resubmit_after_failure(spec, "13", 137, **kw) == "13" and len(subs) == 3


def test_a_failing_job_records_its_error_in_the_chain(tmp_path):
    """A task that raises: the job (one process, no Slurm) exits with the traceback and leaves an ``error``
    event whose signature points at the raise in the user's code."""
    (tmp_path / "hjboom.py").write_text("def build():\n    raise RuntimeError('no data here')\n")
    (tmp_path / "job.toml").write_text(f'[job]\ntask = "hjboom:build"\nchain_dir = "{tmp_path}/chain"\n'
                                       f'pythonpath = ["{tmp_path}"]\n[train]\nepochs = 1\nemulate = true\n')
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "hpc_jabas.runtime.job.launch", str(tmp_path / "job.toml")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 1 and "RuntimeError: no data here" in out.stderr, out.stderr
    errs = [json.loads(ln) for ln in (tmp_path / "chain" / "chain.jsonl").read_text().splitlines()]
    errs = [e for e in errs if e["event"] == "error"]
    assert len(errs) == 1 and errs[0]["rank"] == 0
    assert errs[0]["signature"] == {"type": "builtins.RuntimeError", "message": "no data here",
                                    "where": f"{tmp_path}/hjboom.py:2"}


def test_submit_wait_describes_the_error_and_the_refusal():
    from hpc_jabas.cli.submit import _describe
    line = _describe(ev("error", 1.0, job_id="7", rank=1, signature=SIG))
    assert "error   job 7 rank 1: builtins.TypeError: bad operand at /u/task.py:12" in line
    assert "failed: not resubmitted" in _describe(ev("end", 1.0, job_id="9", state="failed",
                                                     message="not resubmitted"))
