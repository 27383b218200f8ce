"""``Jabas``' checkpoint as a user's script meets it on a shared machine (one process, ``hpc_jabas.init()``, run
from a clean directory): a checkpoint path whose directory does not exist yet is made (it was a torch traceback
after the first epoch, the epoch's work lost); a file planted as a symbolic link where the checkpoint goes, or a
directory that every user may write, is refused in one line with exit code 2, never read or written through."""
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
import torch
from torch import nn
import hpc_jabas

hpc_jabas.init()
torch.manual_seed(0)
X, y = torch.randn(64, 5), torch.randint(0, 3, (64,))
model = nn.Linear(5, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
jabas = hpc_jabas.Jabas(batch=16, micro_batch=4, checkpoint=sys.argv[1])
model, opt, loader = jabas.setup(model, opt, torch.utils.data.TensorDataset(X, y))
for epoch in jabas.epochs(int(sys.argv[2])):
    for step in loader:
        for xb, yb in step:
            jabas.backward(nn.functional.cross_entropy(model(xb), yb), len(xb))
        opt.step()
print("iterations", jabas.iteration, float(sum(p.sum() for p in model.parameters())))
"""


def run(tmp: Path, ckpt: str, epochs: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_COMM_WORLD", "PMI", "SLURM"))}
    env["HPC_JABAS_BACKEND"] = "torch"
    return subprocess.run([sys.executable, "user.py", ckpt, str(epochs)], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=120)


def test_a_missing_directory_is_made_and_the_run_resumes_where_it_ended(tmp_path):
    (tmp_path / "user.py").write_text(SCRIPT)
    one = run(tmp_path, "runs/a/b/loop.pt", 2)
    assert one.returncode == 0, one.stderr[-2000:]
    assert one.stdout.split()[:2] == ["iterations", "8"], one.stdout
    assert (tmp_path / "runs/a/b/loop.pt").is_file()
    assert not (tmp_path / "runs/a/b").stat().st_mode & 0o002          # made without world write
    more = run(tmp_path, "runs/a/b/loop.pt", 3)                         # resumes: 4 more iterations
    assert more.returncode == 0, more.stderr[-2000:]
    assert more.stdout.split()[:2] == ["iterations", "12"], more.stdout
    whole = run(tmp_path, "other/loop.pt", 3)                           # the same 3 epochs in one run
    assert whole.stdout.split()[1:] == more.stdout.split()[1:], (whole.stdout, more.stdout)


def test_a_planted_link_or_a_world_writable_directory_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "user.py").write_text(SCRIPT)
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    (tmp_path / "ck").mkdir()
    os.symlink(target, tmp_path / "ck" / "loop.pt")
    r = run(tmp_path, "ck/loop.pt", 1)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and " INFO: " not in ln]
    assert len(lines) == 1 and "symbolic link" in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert target.read_text() == "keep me"
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    r = run(tmp_path, "open/loop.pt", 1)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and " INFO: " not in ln]
    assert len(lines) == 1 and "writable by every user" in lines[0], r.stderr
    assert list((tmp_path / "open").iterdir()) == []                  # nothing written there
