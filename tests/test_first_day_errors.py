"""Issue 36, finding 4: an hpc-jabas error is one line and exit code 2 on every rank, with or without
``run_main``: the README's whole-script example (taken from README.md as it stands) and examples/train_digits.py,
each with a run directory that cannot be written and with an unknown GPU type, on 3 mpirun ranks; run_main also
takes a plain main()."""
from __future__ import annotations

import os
import re
import subprocess

import pytest
from mpi_util import PY, ROOT, mpi_env


def readme_script(tmp_path) -> str:
    """The README's whole script, its arguments extended by the command line's."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    block = next(b for b in blocks if "hpc_jabas.Trainer(" in b and "parse_args([" in b)
    code = re.sub(r"parse_args\((\[.*?\])\)", r"parse_args(\1 + __import__('sys').argv[1:])", block, count=1)
    assert code != block
    p = tmp_path / "readme_script.py"
    p.write_text(code)
    return str(p)


def unwritable(tmp_path) -> str:
    if os.geteuid() == 0:                         # root writes through any mode bits; /sys takes no new names
        return "/sys/hpc-jabas-test/run"
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    return str(d / "run")


@pytest.mark.mpi
def test_one_line_and_exit_2_on_three_ranks_without_run_main(tmp_path):
    scripts = {"readme": (readme_script(tmp_path), []),
               "digits": (str(ROOT / "examples" / "train_digits.py"), ["--epochs", "1", "-q"])}
    bad = {"run_dir": (["--run-dir", unwritable(tmp_path)], "cannot be written"),
           "gpu": (["--emulate", "--gpu-types", "v100,p100,rtx2600", "--run-dir", str(tmp_path / "g")], "rtx2600")}
    env = dict(mpi_env(), HPC_JABAS_ERROR_GRACE_S="60")
    runs = {}                       # the four launches at once: each spends its time starting torch on 3 ranks
    for name, (script, base) in scripts.items():
        for kind, (args, want) in bad.items():
            cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "3", PY, script, *base, *args]
            runs[name, kind, want] = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, text=True)
    for (name, kind, want), p in runs.items():
        out = p.communicate(timeout=240)[0]
        lines = [ln for ln in out.splitlines() if "hpc-jabas: error" in ln]
        assert p.returncode == 2, f"{name}/{kind}: rc {p.returncode}\n{out}"
        assert len(lines) == 1 and want in lines[0] and "rank" not in lines[0], f"{name}/{kind}:\n{out}"
        assert "Traceback" not in out and "horovod" not in out.lower(), f"{name}/{kind}:\n{out}"


@pytest.mark.mpi
def test_a_key_the_resolved_backend_lacks_is_one_line_on_every_rank(tmp_path):
    """backend = auto resolves to Horovod where it imports (as here): DDP's bucket_cap_mb is then refused in one
    line, exit code 2, before any rank trains (the config refuses it at once when backend = horovod is explicit:
    tests/test_config.py)."""
    assert subprocess.run([PY, "-c", "import horovod.torch"], env=mpi_env()).returncode == 0   # auto is Horovod
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", PY, str(ROOT / "examples" / "train_digits.py"),
           "--epochs", "1", "-q", "--bucket-cap-mb", "10", "--run-dir", str(tmp_path / "run")]
    p = subprocess.run(cmd, env=dict(mpi_env(), HPC_JABAS_ERROR_GRACE_S="60"), cwd=tmp_path, capture_output=True,
                       text=True, timeout=240)
    out = p.stdout + p.stderr
    lines = [ln for ln in out.splitlines() if "hpc-jabas: error" in ln]
    assert p.returncode == 2, out
    assert len(lines) == 1 and "bucket_cap_mb=10 is the torch backend's DDP bucket size" in lines[0], out
    assert "HOROVOD_FUSION_THRESHOLD" in lines[0] and "Traceback" not in out, out
    assert not (tmp_path / "run" / "metrics.jsonl").exists()           # refused before a record was written


def test_run_main_takes_a_plain_main_and_a_cli_main(tmp_path):
    code = ("import sys, hpc_jabas\n"
            "def plain():\n    print('plain ran')\n    return 3\n"
            "def cli(argv):\n    print('cli', argv)\n    raise hpc_jabas.ConfigError('batch=0 is invalid')\n"
            "hpc_jabas.run_main(plain if sys.argv[1] == 'plain' else cli, ['x'])\n")
    p = tmp_path / "m.py"
    p.write_text(code)
    r = subprocess.run([PY, str(p), "plain"], capture_output=True, text=True, timeout=60, env=mpi_env())
    assert r.returncode == 3 and r.stdout == "plain ran\n", r.stderr
    r = subprocess.run([PY, str(p), "cli"], capture_output=True, text=True, timeout=60, env=mpi_env())
    assert r.returncode == 2 and r.stdout == "cli ['x']\n", r.stderr
    assert r.stderr == "hpc-jabas: error: batch=0 is invalid\n"


def test_an_interactive_session_survives_an_error():
    r = subprocess.run([PY, "-i"], input="import hpc_jabas\nhpc_jabas.JobConfig(batch=0).validate()\nprint('alive')\n",
                       capture_output=True, text=True, timeout=60, env=mpi_env())
    assert "alive" in r.stdout and "batch=0" in r.stderr and r.returncode == 0, (r.stdout, r.stderr)
    r = subprocess.run([PY, "-c", "import hpc_jabas\nhpc_jabas.JobConfig(batch=0).validate()\nprint('alive')"],
                       capture_output=True, text=True, timeout=60, env=mpi_env())
    assert r.returncode == 2 and r.stdout == "" and r.stderr == "hpc-jabas: error: batch=0 must be an integer >= 1\n"


#: a script in the shape docs/porting.md shows (no run_main) on the torch backend: the run directory is refused in
#: setup(), after the process group started (torch.distributed's own sys.excepthook is then in front of ours)
TORCH_SCRIPT = """import sys
import torch
from torch import nn
import hpc_jabas
x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
model = nn.Linear(4, 2)
cfg = hpc_jabas.JobConfig(batch=8, backend="torch", run_dir=sys.argv[1], epochs=1)
trainer = hpc_jabas.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), ds, nn.CrossEntropyLoss(),
                            config=cfg)
trainer.fit()
"""


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["python", "mpirun", "torchrun"])
def test_torch_backend_error_after_start_is_one_line_without_run_main(tmp_path, launcher):
    script = tmp_path / "port.py"
    script.write_text(TORCH_SCRIPT)
    run_dir = unwritable(tmp_path)
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_BACKEND"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HPC_JABAS_ERROR_GRACE_S="60")
    cmd = {"python": [PY, str(script), run_dir],
           "mpirun": ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", PY, str(script), run_dir],
           "torchrun": [str(ROOT / ".venv" / "bin" / "torchrun"), "--standalone", "--nproc-per-node=2", str(script),
                        run_dir]}[launcher]
    p = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in p.stderr.splitlines() if "hpc-jabas: error" in ln]
    assert lines and all("cannot be written" in ln for ln in lines), f"rc {p.returncode}\n{p.stdout}\n{p.stderr}"
    if launcher == "torchrun":
        # torchrun adds its failure report (exit code 1): its root cause is our line, not "To enable traceback"
        assert p.returncode != 0 and "To enable traceback" not in p.stderr, p.stderr
        assert any(ln.lstrip().startswith("traceback : hpc-jabas: error:") for ln in p.stderr.splitlines()), p.stderr
    else:
        assert p.returncode == 2, f"rc {p.returncode}\n{p.stderr}"
        assert lines == [f"hpc-jabas: error: {lines[0].split('hpc-jabas: error: ', 1)[1]}"], p.stderr
        assert "Traceback" not in p.stderr and "[rank" not in p.stderr, p.stderr


def test_backend_horovod_without_horovod_is_one_line_naming_torch(tmp_path):
    script = tmp_path / "hvd.py"
    script.write_text("import sys\nsys.modules['horovod'] = None          # import horovod -> ImportError\n"
                      + TORCH_SCRIPT.replace('backend="torch"', 'backend="horovod"'))
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_BACKEND"))}
    p = subprocess.run([PY, str(script), str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpc-jabas: error: backend='horovod' but horovod.torch does not "
                                                   "import here"), p.stderr
    assert "use backend='torch' (--backend torch)" in lines[0]


#: TORCH_SCRIPT's run inside a main() that ``run_main`` runs, the backend from the command line
RUN_MAIN_SCRIPT = """import sys
import torch
from torch import nn
import hpc_jabas


def main():
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    model = nn.Linear(4, 2)
    cfg = hpc_jabas.JobConfig(batch=8, backend=sys.argv[2], run_dir=sys.argv[1], epochs=1)
    trainer = hpc_jabas.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), ds, nn.CrossEntropyLoss(),
                                config=cfg)
    trainer.fit()


hpc_jabas.run_main(main)
"""


def _scripts(tmp_path) -> dict[bool, str]:
    """The script without run_main (backend from argv) and with it."""
    plain = tmp_path / "plain.py"
    plain.write_text(TORCH_SCRIPT.replace('backend="torch"', "backend=sys.argv[2]"))
    wrapped = tmp_path / "wrapped.py"
    wrapped.write_text(RUN_MAIN_SCRIPT)
    return {False: str(plain), True: str(wrapped)}


def _check_one_line(p_rc: int, out: str, what: str, torchrun: bool = False) -> None:
    """Our line once (torchrun: plus its report, whose root cause is our line, one entry per failed rank, and its
    own exit code 1), no traceback of ours, and nothing of torch's or Horovod's in front."""
    ours = [ln for ln in out.splitlines() if ln.startswith("hpc-jabas: error:")]
    assert len(ours) == 1 and "cannot be written" in ours[0], f"{what}: rc {p_rc}\n{out[-3000:]}"
    assert [ln for ln in out.splitlines() if "hpc-jabas: error" in ln and not ln.startswith("hpc-jabas: error:")
            and not (torchrun and ln.lstrip().startswith("traceback : hpc-jabas: error:"))] == [], f"{what}:\n{out}"
    if torchrun:
        report = [ln for ln in out.splitlines() if ln.lstrip().startswith("traceback : ")]
        assert p_rc == 1 and 1 <= len(report) <= 2 and all("hpc-jabas: error:" in ln for ln in report), out
        assert "To enable traceback" not in out and len(out.splitlines()) <= 60, f"{what}: {len(out.splitlines())}"
        frames = [ln.strip() for ln in out.splitlines() if ln.strip().startswith('File "')]
        assert all("bin/torchrun" in f or "/torch/distributed/" in f for f in frames), out[-3000:]
    else:
        assert p_rc == 2, f"{what}: rc {p_rc}\n{out[-3000:]}"
        assert "Traceback" not in out and "[rank" not in out, f"{what}:\n{out[-3000:]}"


@pytest.mark.mpi
def test_error_after_start_is_one_line_with_run_main_on_both_backends(tmp_path):
    """Issue 58, item 7: ``run_main`` under python, mpirun and torchrun (torch only), on both backends; and torchrun
    without it: our line at most once, and what torchrun adds is its report (root cause: our line)."""
    scripts = _scripts(tmp_path)
    run_dir = unwritable(tmp_path)
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_BACKEND"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", HPC_JABAS_ERROR_GRACE_S="60")
    mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", PY]
    torchrun = [str(ROOT / ".venv" / "bin" / "torchrun"), "--standalone", "--nproc-per-node=2"]
    cases = {("python", "torch", True): [PY], ("mpirun", "torch", True): mpirun,
             ("torchrun", "torch", True): torchrun, ("python", "horovod", True): [PY],
             ("mpirun", "horovod", True): mpirun}
    runs = {}                           # at once: each spends its time starting torch
    for (how, backend, wrapped), cmd in cases.items():
        runs[how, backend, wrapped] = subprocess.Popen([*cmd, scripts[wrapped], run_dir, backend], env=env,
                                                       cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                       text=True)
    for (how, backend, wrapped), p in runs.items():
        out = p.communicate(timeout=240)[0]
        _check_one_line(p.returncode, out, f"{how}/{backend}/run_main={wrapped}", torchrun=how == "torchrun")


@pytest.mark.mpi
def test_torchrun_adds_only_its_report_without_run_main(tmp_path):
    script = _scripts(tmp_path)[False]
    env = {k: v for k, v in mpi_env().items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "HPC_JABAS_BACKEND"))}
    env["HPC_JABAS_ERROR_GRACE_S"] = "60"
    cmd = [str(ROOT / ".venv" / "bin" / "torchrun"), "--standalone", "--nproc-per-node=2", script,
           unwritable(tmp_path), "torch"]
    p = subprocess.run(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240)
    _check_one_line(p.returncode, p.stdout, "torchrun/torch/run_main=False", torchrun=True)


@pytest.mark.slurm
def test_error_after_start_is_one_line_under_srun(slurm_cluster, slurm_tmp):
    """srun on two nodes, as the job files run it (--kill-on-bad-exit=1; the PMIx plugin for Horovod), with and
    without ``run_main``, on both backends: our line once, exit code 2 from srun."""
    scripts = _scripts(slurm_tmp)
    run_dir = "/sys/hpc-jabas-test/run" if os.geteuid() == 0 else unwritable(slurm_tmp)
    runs = {}                           # at once: the v100 nodes hold the four steps side by side
    for backend, mpi in (("torch", "none"), ("horovod", "pmix")):
        for wrapped in (False, True):
            cmd = ["srun", "-p", "v100", "-N", "2", "-n", "2", f"--mpi={mpi}", "--kill-on-bad-exit=1", "-t", "3",
                   f"--chdir={slurm_tmp}", f"--export=ALL,PYTHONPATH={ROOT},OMP_NUM_THREADS=1,"
                   "HPC_JABAS_ERROR_GRACE_S=60", PY, scripts[wrapped], run_dir, backend]
            runs[backend, wrapped] = subprocess.Popen(cmd, env=dict(slurm_cluster.env), stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, text=True)
    for (backend, wrapped), p in runs.items():
        out = "\n".join(ln for ln in p.communicate(timeout=240)[0].splitlines() if not ln.startswith("srun: "))
        _check_one_line(p.returncode, out, f"srun/{backend}/run_main={wrapped}")
