"""The typed task contract (runtime/job/task.py): a Task, or the older dict converted, validated once with one
line per problem; submit's dry run and the job's launcher both use it."""
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import hpc_jabas
from hpc_jabas import Callback, ConfigError, Task

ROOT = Path(__file__).resolve().parents[1]


def parts(**kw):
    m = nn.Linear(4, 2)
    d = {"model": m, "optimizer": torch.optim.SGD(m.parameters(), lr=0.1),
         "dataset": torch.utils.data.TensorDataset(torch.zeros(8, 4), torch.zeros(8, dtype=torch.long)),
         "loss_fn": nn.CrossEntropyLoss()}
    d.update(kw)
    return d


def one_line_error(fn, *args) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def test_the_older_dict_is_converted_with_forward_fn_and_callbacks_passed_through():
    cb = Callback()

    def fwd(m, b):
        return m(b[0]).sum()
    t = Task.from_parts(parts(forward_fn=fwd, callbacks=[cb], scheduler_step="iteration"), "m:build")
    assert isinstance(t, Task) and t.forward_fn is fwd and list(t.callbacks) == [cb]
    kw = t.trainer_kwargs()
    assert kw["forward_fn"] is fwd and kw["callbacks"] == [cb] and kw["scheduler_step"] == "iteration"
    assert kw["scheduler"] is None and kw["eval_fn"] is None


def test_a_task_is_returned_as_is_and_loss_fn_may_be_none_with_forward_fn():
    p = parts()
    t = Task(p["model"], p["optimizer"], p["dataset"], p["loss_fn"])
    assert Task.from_parts(t, "m:build") is t
    p.pop("loss_fn")
    assert Task.from_parts(dict(p, forward_fn=lambda m, b: 0.0)).loss_fn is None
    Task(p["model"], p["optimizer"], p["dataset"], forward_fn=lambda m, b: 0.0).validate()


@pytest.mark.parametrize("got,say", [
    (None, "returned NoneType; it must return a hpc_jabas.Task"),
    ({"model": 1}, "returned a dict without optimizer, dataset, loss_fn"),
    ("noloss", "returned a dict without loss_fn"),
    ("typo", "unknown key 'shceduler'"),
    ("resnet", "model=builtins.str ('resnet'); it must be a torch.nn.Module"),
    ("opt", "it must be a torch.optim.Optimizer"),
    ("ds", "it must be a map-style Dataset"),
    ("loss", "loss_fn=builtins.str ('mse'); it must be callable"),
    ("fwd", "forward_fn=builtins.int (3); it must be callable"),
    ("cbs", "callbacks=builtins.str ('x'); it must be a list of hpc_jabas.Callback"),
    ("cb", "it must be a list of hpc_jabas.Callback instances; one item is not"),
    ("step", "scheduler_step='batch'; it must be one of epoch, iteration"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 12 else None)
def test_each_bad_part_is_one_line_naming_the_task(got, say):
    p = parts()
    bad = {"noloss": {k: v for k, v in p.items() if k != "loss_fn"}, "typo": dict(p, shceduler=None),
           "resnet": dict(p, model="resnet"), "opt": dict(p, optimizer=p["model"]), "ds": dict(p, dataset=5),
           "loss": dict(p, loss_fn="mse"), "fwd": dict(p, forward_fn=3), "cbs": dict(p, callbacks="x"),
           "cb": dict(p, callbacks=[object()]), "step": dict(p, scheduler_step="batch")}
    got = bad.get(got, got) if isinstance(got, str) else got
    msg = one_line_error(Task.from_parts, got, "m:build")
    assert msg.startswith("task 'm:build' returned") and say in msg, msg


def test_task_is_public_and_lazy():
    assert hpc_jabas.Task is Task and "Task" in hpc_jabas.__all__


def test_the_examples_build_a_valid_task():
    sys.path.insert(0, str(ROOT))
    try:
        from examples.train_digits import build
        t = build()
    finally:
        sys.path.remove(str(ROOT))
    assert isinstance(t, Task) and Task.from_parts(t, "examples.train_digits:build") is t
    assert callable(t.eval_fn)


def test_submit_dry_run_and_the_launcher_use_the_same_check():
    """Both go through Task.from_parts (no second copy of the checks in cli/submit.py)."""
    src = (ROOT / "hpc_jabas" / "cli" / "submit.py").read_text()
    assert "Task.from_parts(" in src and "_check_parts" not in src
    assert "Task.from_parts(" in (ROOT / "hpc_jabas" / "runtime" / "job" / "launch.py").read_text()


TASK_WITH_HOOKS = '''
import json, os
import torch
from torch import nn
import hpc_jabas


class Count(hpc_jabas.Callback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, trainer, rec):
        self.steps += 1

    def on_epoch_end(self, trainer, epoch):
        with open(os.environ["HJ_OUT"], "w") as f:
            json.dump({"steps": self.steps, "forward_calls": CALLS[0]}, f)


CALLS = [0]


def forward(model, batch):
    CALLS[0] += 1
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def build():
    torch.manual_seed(0)
    m = nn.Linear(4, 2)
    ds = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    return hpc_jabas.Task(m, torch.optim.SGD(m.parameters(), lr=0.1), ds, forward_fn=forward, callbacks=[Count()])
'''


def test_the_launcher_passes_forward_fn_and_callbacks_to_the_trainer(tmp_path):
    """One process, no Slurm: the job's launcher builds the Trainer from the Task, with its forward_fn and its
    callbacks (beside the launcher's own)."""
    import json
    import subprocess
    (tmp_path / "hjhooks.py").write_text(TASK_WITH_HOOKS)
    (tmp_path / "job.toml").write_text(f'[job]\ntask = "hjhooks:build"\nchain_dir = "{tmp_path}/chain"\n'
                                       f'pythonpath = ["{tmp_path}"]\n[train]\nepochs = 1\nbatch = 16\n'
                                       'emulate = true\ngpu_types = ["v100"]\n[autoscale]\nenabled = false\n')
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "HJ_OUT": str(tmp_path / "o")}
    out = subprocess.run([sys.executable, "-m", "hpc_jabas.runtime.job.launch", str(tmp_path / "job.toml")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads((tmp_path / "o").read_text())
    assert got["steps"] == 4 and got["forward_calls"] >= 4, got
