"""Issue 58, finding 2: torch.compile. A script that compiles its model (``torch.compile`` wraps it in an
OptimizedModule whose state_dict keys carry ``_orig_mod.``) checkpoints the original module's state: a run
resumes with compile switched on or off, exactly (the weights after 1 epoch + resume + 1 epoch equal 2 epochs
straight, either way), and ``hpc-jabas export`` writes keys that load into the plain model. Run as a user runs
it: ``python script.py --epochs N --run-dir DIR [--compile]`` (one process; the eager compile backend keeps it
fast, the wrapper and its keys are the same as inductor's)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from mpi_util import mpi_env

PY = sys.executable

SCRIPT = '''
import argparse
import json

import torch
from torch import nn

import hpc_jabas

parser = hpc_jabas.ArgumentParser()
parser.add_argument("--compile", action="store_true")
hpc_jabas.add_arguments(parser)
args = parser.parse_args()
torch.manual_seed(0)
x = torch.randn(192, 10)
data = torch.utils.data.TensorDataset(x, x[:, :2] * 0.3 + 0.05 * torch.randn(192, 2))
model = nn.Sequential(nn.Linear(10, 16), nn.Dropout(0.1), nn.Tanh(), nn.Linear(16, 2))
plain = model
if args.compile:
    model = torch.compile(model, backend="eager")
opt = torch.optim.Adam(model.parameters(), lr=0.01)
trainer = hpc_jabas.Trainer(model, opt, data, nn.MSELoss(), config=hpc_jabas.config_from_args(args))
res = trainer.fit()
print("RESULT " + json.dumps({"iterations": res["iterations"], "here": res["iterations_here"],
                              "w": {k: v.tolist() for k, v in plain.state_dict().items()}}))
'''


def _run(script: Path, *args: str) -> dict:
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_"))}
    env.update(HPC_JABAS_BACKEND="torch")
    p = subprocess.run([PY, str(script), "--batch", "32", "-q", *args], env=env, capture_output=True, text=True,
                       timeout=180, cwd=str(script.parent))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_compile_on_and_off_resume_into_each_other_exactly_and_export_is_plain(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    straight = _run(script, "--epochs", "2", "--run-dir", str(tmp_path / "straight"))
    for first, second in ((["--compile"], []), ([], ["--compile"])):
        run = tmp_path / f"run{len(first)}"
        one = _run(script, "--epochs", "1", "--run-dir", str(run), *first)
        assert one["here"] == 192 // 32
        two = _run(script, "--epochs", "2", "--run-dir", str(run), *second)
        assert two["here"] == 192 // 32 and two["iterations"] == straight["iterations"]
        assert two["w"] == straight["w"], (first, second)                  # exact, either way
        ckpt = sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1]
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        assert not any("_orig_mod" in k for k in saved["model"]) and saved["model_name"] == "Sequential"
    out = tmp_path / "model.pt"
    hj = Path(PY).parent / "hpc-jabas"
    p = subprocess.run([str(hj), "export", str(tmp_path / "run1"), str(out)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    sd = torch.load(out, weights_only=True)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Dropout(0.1), torch.nn.Tanh(),
                                torch.nn.Linear(16, 2))
    model.load_state_dict(sd)                                          # strict: the plain model's keys
    assert {k: v.tolist() for k, v in sd.items()} == straight["w"]


def test_a_checkpoint_written_with_orig_mod_keys_still_loads():
    """Checkpoints of earlier versions keyed a compiled model's state with ``_orig_mod.``: read as the plain keys."""
    from hpc_jabas.runtime.persist.checkpoint import plain_module, plain_state
    m = torch.nn.Sequential(torch.nn.Linear(2, 2))
    c = torch.compile(m, backend="eager")
    assert plain_module(c) is m and plain_module(m) is m
    sd = c.state_dict()
    assert list(sd) == ["_orig_mod.0.weight", "_orig_mod.0.bias"]
    assert list(plain_state(sd)) == ["0.weight", "0.bias"]
    nested = {"enc._orig_mod.w": torch.zeros(1), "b": torch.ones(1)}
    assert list(plain_state(nested)) == ["enc.w", "b"]
