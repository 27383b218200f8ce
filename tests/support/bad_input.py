"""The table of malformed inputs to `hpc-jabas submit`, `plan`, `status`, `profile`, `report` and the example's flags
(:data:`CASES`), and :func:`run_table`, which runs it in-process: tests/test_bad_input.py asserts on its rows,
bench/faults.py counts them for its ``bad_inputs_clear`` figure.

Each case must give exit 2, exactly one line on stderr (no traceback), and modify no existing file (every file of the
work directory and the repository's job files hashed before and after).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv" / "bin" / "python")

TASKS = '''
import torch
from torch import nn


def ok():
    m = nn.Linear(4, 2)
    return {"model": m, "optimizer": torch.optim.SGD(m.parameters(), lr=0.1),
            "dataset": torch.utils.data.TensorDataset(torch.zeros(8, 4), torch.zeros(8, dtype=torch.long)),
            "loss_fn": nn.CrossEntropyLoss()}


def none():
    return None


def noloss():
    d = ok()
    d.pop("loss_fn")
    return d


def boom():
    raise RuntimeError("no data here")


not_callable = 3


def prof():
    m = nn.Linear(4, 2)
    return m, nn.CrossEntropyLoss(), (torch.zeros(8, 4), torch.zeros(8, dtype=torch.long))
'''


def job_toml(d: Path, task: str = "hj_bad_tasks:ok", job: str = "", train: str = "", autoscale: str = "",
             top: str = "", slurm: str = "", method: str = "sbatch", name: str = "chain-new") -> str:
    base = "".join(f"{k} = {v}\n" for k, v in (("epochs", "1"), ("batch", "16"), ("emulate", "true"))
                   if f"{k} =" not in train and f"{k} =" not in top)
    return (f'{top}\n[job]\ntask = "{task}"\nchain_dir = "{d}/{name}"\nmethod = "{method}"\n'
            f'pythonpath = ["{d}"]\nmix = {{ rtx2060 = 2 }}\n{job}\n'
            f'[train]\n{base}{train}\n'
            f'[autoscale]\nenabled = false\n{autoscale}\n' + (f"[slurm]\n{slurm}\n" if slurm else ""))


@dataclass
class Case:
    id: str
    argv: list[str]                          # {d}: the work directory
    files: dict[str, str | bytes | tuple] = field(default_factory=dict)   # written before the run (relative to {d})
    example: bool = False                    # examples/train_digits.py's main instead of hpc-jabas
    expect: str = ""                         # a part of the line it must say


def _sub(name: str, *args: str, **toml) -> Case:
    """A submit case whose job file is case-<name>.toml."""
    return Case(f"submit-{name}", ["submit", f"{{d}}/case-{name}.toml", *args],
                files={f"case-{name}.toml": ("TOML", {"name": f"chain-{name}", **toml})})


CASES: list[Case] = [
    # ---- hpc-jabas submit: the job file ------------------------------------------------------------------
    Case("submit-missing-file", ["submit", "{d}/nope.toml"]),
    Case("submit-file-is-dir", ["submit", "{d}/adir"]),
    Case("submit-not-toml", ["submit", "{d}/garbage.toml"]),
    Case("submit-unwritable-chain-dir", ["submit", "{d}/case-unwritable.toml"],
         files={"case-unwritable.toml": "[job]\ntask = \"hj_bad_tasks:ok\"\nchain_dir = \"/proc/hj-chain\"\n"
                                        "mix = { rtx2060 = 2 }\n[train]\nepochs = 1\n"}),
    Case("submit-chain-dir-is-file", ["submit", "{d}/case-chainfile.toml"],
         files={"case-chainfile.toml": "[job]\ntask = \"hj_bad_tasks:ok\"\nchain_dir = \"{d}/afile\"\n"
                                       "pythonpath = [\"{d}\"]\nmix = { rtx2060 = 2 }\n[train]\nepochs = 1\n"}),
    Case("submit-no-task", ["submit", "{d}/case-notask.toml"],
         files={"case-notask.toml": "[job]\nchain_dir = \"{d}/c\"\n"}),
    _sub("emulate-yes", train='emulate = "yes"'),
    _sub("emulate-yes-train", top='emulate = "yes"'),
    _sub("objective-cheapest", autoscale='objective = "cheapest"'),
    _sub("run-dir-in-job", job='run_dir = "{d}/elsewhere"'),
    _sub("run-dir-in-train", train='run_dir = "{d}/elsewhere"'),
    _sub("unknown-gpu-type", "--mix", "h900:2"),
    _sub("unknown-partition-in-table", job="", top=""),     # replaced below: mix table with an unknown name
    _sub("micro-batch-1000", train="micro_batch = 1000"),
    _sub("task-callable-missing", task="hj_bad_tasks:nosuch"),
    _sub("task-module-missing", task="hj_no_such_module:ok"),
    _sub("task-not-callable", task="hj_bad_tasks:not_callable"),
    _sub("task-no-colon", task="hj_bad_tasks"),
    _sub("task-returns-none", task="hj_bad_tasks:none"),
    _sub("task-without-loss-fn", task="hj_bad_tasks:noloss"),
    _sub("task-raises", task="hj_bad_tasks:boom"),
    _sub("mix-no-count", "--mix", "rtx2060"),
    _sub("mix-zero", "--mix", "rtx2060:0"),
    _sub("mix-not-int", "--mix", "rtx2060:x"),
    _sub("method-unknown", "--method", "pbs"),
    _sub("method-unknown-in-job", method="pbs"),
    _sub("time-min-zero", "--time-min", "0"),
    _sub("time-min-text", "--time-min", "abc"),
    _sub("signal-lead-negative", "--signal-lead-s", "-1"),
    _sub("max-timeouts-negative", "--max-timeouts", "-1"),
    _sub("wait-timeout-zero", "--wait", "--timeout", "0"),
    _sub("epochs-zero", train="epochs = 0"),
    _sub("batch-text", train='batch = "16"'),
    _sub("unknown-train-key", train="epochz = 3"),
    _sub("policy-unknown", train='policy = "bogus"'),
    _sub("max-gpus-zero", autoscale="max_gpus = 0"),
    _sub("slurm-time-min-text", slurm='time_min = "long"'),
    _sub("checkpoint-every-zero", train="checkpoint_every = 0"),
    _sub("slowdown-bad-factor", train='[slowdown]\n0 = "factor=abc"'),
    Case("submit-chain-dir-int", ["submit", "{d}/case-chain-int.toml"], expect="chain_dir = 42",
         files={"case-chain-int.toml": "[job]\ntask = \"hj_bad_tasks:ok\"\nchain_dir = 42\n"
                                       "mix = { rtx2060 = 2 }\n[train]\nepochs = 1\n"}),
    _sub("signal-lead-above-limit", "--time-min", "1", "--signal-lead-s", "600"),
    _sub("signal-lead-above-limit-toml", slurm="time_min = 2\nsignal_lead_s = 100"),
    _sub("gpu-types-longer-than-mix", train='gpu_types = ["rtx2060", "rtx2060", "rtx2060"]'),
    Case("submit-finished-chain", ["submit", "{d}/case-finished.toml"], expect="already finished",
         files={"case-finished.toml": ("TOML", {"name": "chain-finished"}),
                "chain-finished/chain.jsonl": '{"event": "submit", "job_id": "5", "time": 1}\n'
                                             '{"event": "end", "job_id": "5", "state": "finished", "epochs": 1, '
                                             '"time": 2}\n'}),
    # ---- hpc-jabas plan --------------------------------------------------------------------------------
    Case("plan-no-gpus", ["plan", "--batch", "64"]),
    Case("plan-gpus-bad-count", ["plan", "--batch", "64", "--gpus", "v100:x"]),
    Case("plan-unknown-gpu", ["plan", "--batch", "64", "--gpus", "h900:2", "--emulated"]),
    Case("plan-batch-text", ["plan", "--batch", "abc", "--gpus", "v100:2", "--emulated"]),
    Case("plan-batch-zero", ["plan", "--batch", "0", "--gpus", "v100:2", "--emulated"]),
    Case("plan-range-one-number", ["plan", "--batch-range", "10", "--gpus", "v100:2", "--emulated"]),
    Case("plan-range-reversed", ["plan", "--batch-range", "20:10", "--gpus", "v100:2", "--emulated"]),
    Case("plan-candidates-text", ["plan", "--batch", "64", "--gpus", "v100:2", "--emulated", "--b-candidates", "a,b"]),
    Case("plan-profile-missing", ["plan", "--batch", "64", "--gpus", "v100:2", "--profile", "{d}/noprof"]),
    Case("plan-profile-is-file", ["plan", "--batch", "64", "--gpus", "v100:2", "--profile", "{d}/afile"],
         expect="is not a directory"),
    Case("plan-batch-huge", ["plan", "--batch", "1000000000000", "--gpus", "v100:2", "--emulated"],
         expect="at most 10000000"),
    Case("plan-batch-overflow", ["plan", "--batch", "99999999999999999999", "--gpus", "v100:2", "--emulated"],
         expect="at most 10000000"),
    Case("plan-range-huge", ["plan", "--batch-range", "8:99999999999999999999", "--gpus", "v100:2", "--emulated"],
         expect="at most 10000000"),
    Case("plan-grad-mb-negative", ["plan", "--batch", "64", "--gpus", "v100:2", "--emulated", "--grad-mb", "-1"]),
    Case("plan-batch-and-range", ["plan", "--batch", "64", "--batch-range", "8:64", "--gpus", "v100:2"]),
    # ---- hpc-jabas status ------------------------------------------------------------------------------
    Case("status-missing-dir", ["status", "{d}/nochain"]),
    Case("status-file", ["status", "{d}/afile"]),
    Case("status-empty-dir", ["status", "{d}/adir"]),
    Case("status-wait-negative", ["status", "{d}/adir", "--wait", "-1"]),
    Case("status-wait-text", ["status", "{d}/adir", "--wait", "abc"]),
    Case("status-garbage-log", ["status", "{d}/badchain"], files={"badchain/chain.jsonl": "not json\n{\n"}),
    Case("status-chain-not-utf8", ["status", "{d}/utf8chain"], expect="not valid UTF-8",
         files={"utf8chain/chain.jsonl": b'{"event": "submit", "job_id": "1", "time": 1}\n{"event": "\xff\xfe"}\n'}),
    # ---- hpc-jabas profile -----------------------------------------------------------------------------
    Case("profile-model-module-missing", ["profile", "--model", "hj_no_such_module:m", "--out", "{d}/p1",
                                          "--emulate", "--gpu-type", "v100"]),
    Case("profile-model-no-colon", ["profile", "--model", "hj_bad_tasks", "--out", "{d}/p1", "--emulate",
                                    "--gpu-type", "v100"]),
    Case("profile-out-is-file", ["profile", "--model", "hj_bad_tasks:prof", "--out", "{d}/afile", "--emulate",
                                 "--gpu-type", "v100"]),
    Case("profile-out-unwritable", ["profile", "--model", "hj_bad_tasks:prof", "--out", "/proc/hj-prof", "--emulate",
                                    "--gpu-type", "v100"]),
    Case("profile-b-list-zero", ["profile", "--model", "hj_bad_tasks:prof", "--out", "{d}/p1", "--emulate",
                                 "--gpu-type", "v100", "--b-list", "0,1"]),
    Case("profile-b-list-text", ["profile", "--model", "hj_bad_tasks:prof", "--out", "{d}/p1", "--emulate",
                                 "--gpu-type", "v100", "--b-list", "a"]),
    Case("profile-warmup-negative", ["profile", "--model", "hj_bad_tasks:prof", "--out", "{d}/p1", "--emulate",
                                     "--gpu-type", "v100", "--warmup", "-1"]),
    Case("profile-unknown-gpu", ["profile", "--model", "hj_bad_tasks:prof", "--out", "{d}/p1", "--emulate",
                                 "--gpu-type", "h900"]),
    Case("profile-allreduce-size", ["profile", "--model", "hj_bad_tasks:prof", "--out", "{d}/p1", "--emulate",
                                    "--gpu-type", "v100", "--allreduce-sizes", "1X"]),
    Case("profile-overlap-2", ["profile", "--model", "hj_bad_tasks:prof", "--out", "{d}/p1", "--emulate",
                               "--gpu-type", "v100", "--overlap", "2"]),
    Case("profile-out-is-run-dir", ["profile", "--model", "hj_bad_tasks:prof", "--out", "{d}/run-ok", "--emulate",
                                    "--gpu-type", "v100"], expect="not a perf-model directory"),
    Case("profile-model-returns-none", ["profile", "--model", "hj_bad_tasks:none", "--out", "{d}/p1", "--emulate",
                                        "--gpu-type", "v100"]),
    # ---- hpc-jabas report ------------------------------------------------------------------------------
    Case("report-missing-run", ["report", "{d}/norun"]),
    Case("report-no-iterations", ["report", "{d}/run-noit"]),
    Case("report-out-is-dir", ["report", "{d}/run-ok", "--out", "{d}/adir"]),
    Case("report-out-unwritable", ["report", "{d}/run-ok", "--out", "/proc/hj-report.png"]),
    Case("report-out-under-file", ["report", "{d}/run-ok", "--out", "{d}/afile/r.png"]),
    # ---- examples/train_digits.py ----------------------------------------------------------------------
    Case("example-config-missing", ["--config", "{d}/nope.toml"], example=True),
    Case("example-config-is-dir", ["--config", "{d}/adir"], example=True),
    Case("example-config-emulate-yes", ["--config", "{d}/ex-emulate.toml"], example=True,
         files={"ex-emulate.toml": 'emulate = "yes"\n'}),
    Case("example-config-objective", ["--config", "{d}/ex-objective.toml"], example=True,
         files={"ex-objective.toml": '[autoscale]\nobjective = "cheapest"\n'}),
    Case("example-run-dir-is-file", ["--run-dir", "{d}/afile", "--epochs", "1"], example=True),
    Case("example-run-dir-unwritable", ["--run-dir", "/proc/hj-run", "--epochs", "1"], example=True),
    Case("example-summary-is-dir", ["--summary", "{d}/adir", "--run-dir", "{d}/exrun", "--epochs", "1"],
         example=True),
    Case("example-summary-unwritable", ["--summary", "/proc/hj-sum.json", "--run-dir", "{d}/exrun"], example=True),
    Case("example-slowdown-bad-factor", ["--slowdown", "0:factor=abc"], example=True),
    Case("example-epochs-zero", ["--epochs", "0"], example=True),
    Case("example-lr-text", ["--lr", "abc"], example=True),
    Case("example-lr-nan", ["--lr", "nan", "--epochs", "1"], example=True, expect="training diverged"),
    Case("example-batch-negative", ["--batch", "-5"], example=True),
    Case("example-policy-unknown", ["--policy", "bogus"], example=True),
    Case("example-unknown-flag", ["--bogus"], example=True),
]
for _id, _say in (("submit-signal-lead-above-limit", "at most half of it, 30 s"),
                  ("submit-signal-lead-above-limit-toml", "at most half of it, 60 s"),
                  ("submit-gpu-types-longer-than-mix", "gpu_types lists 3 types but the mix rtx2060:2 has 2 ranks")):
    CASES[[c.id for c in CASES].index(_id)].expect = _say
#: rows refused before anything asks Slurm: they run without the cluster (test_rows_that_need_no_slurm)
NO_SLURM = ["plan-profile-is-file", "plan-batch-huge", "plan-batch-overflow", "plan-range-huge",
            "status-chain-not-utf8", "profile-out-is-run-dir", "submit-chain-dir-int", "submit-signal-lead-above-limit",
            "submit-signal-lead-above-limit-toml", "submit-gpu-types-longer-than-mix", "submit-finished-chain",
            "example-lr-nan"]
# a [job] mix table naming a partition Slurm does not have
CASES[[c.id for c in CASES].index("submit-unknown-partition-in-table")] = Case(
    "submit-unknown-partition-in-table", ["submit", "{d}/case-nopart.toml"],
    files={"case-nopart.toml": "[job]\ntask = \"hj_bad_tasks:ok\"\nchain_dir = \"{d}/chain-np\"\n"
                               "pythonpath = [\"{d}\"]\nmix = { nosuch = 1 }\n[train]\nepochs = 1\n"})


def prepare(d: Path) -> None:
    """The work directory every case reads: task module, files, directories, runs."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "hj_bad_tasks.py").write_text(TASKS)
    (d / "adir").mkdir(exist_ok=True)
    (d / "afile").write_text("a file, not a directory\n")
    (d / "garbage.toml").write_text("this is = not [ toml\n")
    for name, it in (("run-ok", True), ("run-noit", False)):
        (d / name).mkdir(exist_ok=True)
        recs = ['{"type": "iteration", "it": 0, "B": 16, "lr_scale": 1.0}',
                '{"type": "iteration", "it": 1, "B": 16, "lr_scale": 1.0}'] if it else ['{"type": "start"}']
        (d / name / "metrics.jsonl").write_text("\n".join(recs) + "\n")
    for c in CASES:
        for rel, text in c.files.items():
            p = d / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):         # bytes as they are (e.g. invalid UTF-8)
                p.write_bytes(text)
                continue
            if isinstance(text, tuple):         # ("TOML", kwargs of job_toml)
                kw = {k: v.replace("{d}", str(d)) for k, v in text[1].items()}
                text = job_toml(d, **kw)
            p.write_text(text.replace("{d}", str(d)))


def digest(paths: list[Path]) -> dict[str, str]:
    out = {}
    for root in paths:
        for p in sorted([root] if root.is_file() else root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def watched(d: Path) -> list[Path]:
    return [d, ROOT / "slurm", ROOT / "examples"]


def run_case(c: Case, d: Path) -> tuple[object, str]:
    """(exit code, stderr) of one case, in-process; an exception that escapes is returned as its traceback."""
    argv = [a.replace("{d}", str(d)) for a in c.argv]
    if c.example and "--run-dir" not in argv:          # each its own run: a finished one would refuse anyway
        argv += ["--run-dir", str(d / f"run-{c.id}")]
    err, out = io.StringIO(), io.StringIO()
    old_cwd, old_path = os.getcwd(), list(sys.path)
    code: object
    try:
        os.chdir(d)
        sys.path.insert(0, str(d))
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                if c.example:
                    import hpc_jabas
                    from examples.train_digits import main as ex_main
                    hpc_jabas.run_main(ex_main, argv)
                    code = 0
                else:
                    from hpc_jabas.cli.main import main
                    code = main(argv)
            except SystemExit as e:
                code = e.code
            except BaseException:       # noqa: B036  (what escapes is what this table looks for)
                code = "exception"
                err.write(traceback.format_exc())
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path
        sys.modules.pop("hj_bad_tasks", None)
    return code, err.getvalue()


def verdict(code: object, stderr: str) -> str:
    """'' when the case is handled well (exit 2, one line, no traceback); else what is wrong. Information a run
    logs before it fails (the per-rank start lines, ``hpc-jabas[0] INFO: ...``) is not part of the error."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not re.match(r"hpc-jabas\[\d+\] INFO: ", ln)]
    if code != 2:
        return f"exit {code!r}"
    if "Traceback" in stderr:
        return "traceback"
    if len(lines) != 1:
        return f"{len(lines)} lines"
    return ""


def _no_submission(*a, **k):
    raise AssertionError("a malformed input reached sbatch")


def run_table(d: Path, cases: list[Case] | None = None) -> list[dict]:
    """Every case in-process (nothing reaches sbatch: a case that would is a failure); one row per case."""
    from hpc_jabas.slurm import executor
    prepare(d)
    before = digest(watched(d))
    rows = []
    real_submit, executor.submit = executor.submit, _no_submission
    try:
        rows = _run_all(cases or CASES, d, before)
    finally:
        executor.submit = real_submit
    return rows


def _run_all(cases: list[Case], d: Path, before: dict[str, str]) -> list[dict]:
    rows = []
    for c in cases:
        code, stderr = run_case(c, d)
        after = digest(watched(d))
        changed = sorted(p for p in before if after.get(p) != before[p])
        why = verdict(code, stderr) or (f"modified {changed}" if changed else "") or \
            (f"does not say {c.expect!r}" if c.expect and c.expect not in stderr else "")
        rows.append({"id": c.id, "ok": not why, "why": why, "stderr": stderr.strip()[-600:]})
        before = {**after, **{p: before[p] for p in changed}}
    return rows
