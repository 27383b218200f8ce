"""The package as pip installs it: the wheel built from the checkout, installed (not editable) into a new virtual
environment, run from a directory outside the repository.

The first test, one build: every directory under hpc_jabas/ with Python files is in the wheel with all its files (a
subpackage left out fails here, as core.planning once was); the wheel's dependencies are all satisfied without an
index (the third-party packages come from the shared environment of scripts/setup.sh, put on the new
environment's path as the clone's .venv has them, so torch is not downloaded again); ``hpc_jabas`` imports from
the new environment's site-packages; ``hpc-jabas doctor`` and ``hpc-jabas plan`` run; and a 2-rank mpirun job
of a small script that uses the public API only trains (its loss falls, every sample of every epoch counted
once); and the README's first torchrun run (the ``torchrun`` line of its "Installing on a cluster without root"
block, as written, with examples/porting/ copied beside it) trains on 2 ranks of the torch backend.
tests/test_nonroot.py installs the same wheel as a user who is not root. The second installs it with no extra
into an environment that lacks them: it trains, resumes and forecasts, and a command needing an extra names it.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.package import ROOT, build_wheel, source_packages, wheel_packages

#: a user's script: the public API only (nothing of tests/ or examples/)
SCRIPT = textwrap.dedent('''
    import json
    import sys

    import torch
    from torch import nn

    import hpc_jabas

    N = 384
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    loss_fn = nn.CrossEntropyLoss()
    ap = hpc_jabas.ArgumentParser()
    ap.add_argument("--out")
    hpc_jabas.add_verbosity_flags(ap)
    hpc_jabas.add_arguments(ap)
    args = ap.parse_args()
    hpc_jabas.configure_from_args(args)
    with torch.no_grad():
        before = float(loss_fn(model(x), y))
    trainer = hpc_jabas.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9),
                                torch.utils.data.TensorDataset(x, y), loss_fn,
                                config=hpc_jabas.config_from_args(args))
    result = trainer.fit()
    with torch.no_grad():
        after = float(loss_fn(model(x), y))
    if trainer.rank == 0:
        json.dump({"before": before, "after": after, "result": result, "file": hpc_jabas.__file__,
                   "size": len(trainer.gpu_types)}, open(args.out, "w"))
''')


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 300) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.mark.mpi
def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    whl = build_wheel(tmp_path / "build")
    src, got = source_packages(), wheel_packages(whl)      # every directory with Python files, and data/
    missing = {d: sorted(src[d] - got.get(d, set())) for d in src if src[d] - got.get(d, set())}
    assert not missing, f"the wheel lacks these packages' files: {missing}"
    assert "hpc_jabas/core/planning" in got and "hpc_jabas/runtime/profiling" in got
    n_py = sum(n.endswith(".py") for v in got.values() for n in v)

    # a new environment: the base interpreter, the shared third-party environment on its path, the wheel in it
    venv = tmp_path / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    vpy = venv / "bin" / "python"
    site = Path(_run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     tmp_path, os.environ).strip())
    shared = Path(str(md.distribution("torch").locate_file(""))).resolve()
    (site / "_shared_env.pth").write_text(f"{shared}\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "HPC_JABAS"))}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", PIP_DISABLE_PIP_VERSION_CHECK="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               OMPI_MCA_mpi_yield_when_idle="1", OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1")
    # --no-index: every dependency the wheel declares must already be there (nothing is downloaded)
    _run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-index", str(whl)], outside, env)
    where = _run([str(vpy), "-c", "import hpc_jabas, hpc_jabas.core.planning, hpc_jabas.runtime.profiling; "
                  "print(hpc_jabas.__file__)"], outside, env).strip()
    assert Path(where).is_relative_to(site) and not Path(where).is_relative_to(ROOT), where
    assert not list(site.glob("__editable__*")) and not list(site.glob("*.egg-link")), "installed in editable mode"
    assert (site / "hpc_jabas" / "data" / "gpus.toml").is_file()           # package data

    doctor = _run([str(venv / "bin" / "hpc-jabas"), "doctor"], outside, env)
    assert doctor.rstrip().splitlines()[-1].split() == ["status", "OK"], doctor
    plan = _run([str(venv / "bin" / "hpc-jabas"), "plan", "--batch", "2048", "--gpus", "v100:4,p100:4,rtx2060:8"],
                outside, env)
    rows = {ln.split()[0]: ln.split() for ln in plan.splitlines() if ln.split() and ln.split()[0] in
            ("v100", "p100", "rtx2060")}
    assert {k: int(v[1]) for k, v in rows.items()} == {"v100": 4, "p100": 4, "rtx2060": 8}, plan
    assert sum(int(v[1]) * int(v[2]) * int(v[3]) for v in rows.values()) == 2048, plan   # ranks x b x n = B

    (outside / "train.py").write_text(SCRIPT)
    out = outside / "result.json"
    _run(["mpirun", "-np", "2", str(vpy), "train.py", "--emulate", "--gpu-types", "v100,rtx2060", "--batch", "64",
          "--epochs", "3", "--run-dir", "run", "--quiet", "--out", str(out)], outside, env, timeout=400)
    res = json.loads(out.read_text())
    assert Path(res["file"]).is_relative_to(site), res["file"]
    assert res["size"] == 2 and res["result"]["epoch"] == 3 and res["result"]["samples"] == 3 * 384, res
    assert res["after"] < 0.7 * res["before"], res
    recs = [json.loads(ln) for ln in (outside / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    its = [r for r in recs if r.get("type") == "iteration"]
    assert sorted(r["it"] for r in its) == list(range(len(its))) and len(its) == res["result"]["iterations"]
    acc = _readme_torchrun(vpy, outside, env)
    print(f"README torchrun line: test accuracy {acc}")
    print(f"wheel {whl.name}: {n_py} Python files in {len(got)} packages; doctor OK; plan 16 ranks B=2048; "
          f"2-rank fit {res['result']['iterations']} iterations, loss {res['before']:.3f} -> {res['after']:.3f}")


def _readme_torchrun(vpy: Path, outside: Path, env: dict) -> float:
    """The README's torchrun line, run from the wheel's environment (``torchrun`` is ``python -m
    torch.distributed.run``, what the torchrun command runs); its test accuracy."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Installing on a cluster without root"):]
    line = next(ln for ln in section.splitlines() if ln.startswith("torchrun "))
    argv = line.split("#")[0].split()
    (outside / "examples" / "porting").mkdir(parents=True)
    script = next(a for a in argv if a.endswith(".py"))
    (outside / script).write_text((ROOT / script).read_text())
    out = _run([str(vpy), "-m", "torch.distributed.run", *argv[1:]], outside, env, timeout=300)
    acc = float(out.strip().splitlines()[-1].split()[-1])
    assert "test accuracy" in out and acc > 0.5, out
    assert list((outside / "runs").glob("ddp_jabas_mnist-*/metrics.jsonl")), sorted((outside / "runs").iterdir())
    return acc


#: the extras' packages (and their metadata), left out of the new environment's view of the shared environment
EXTRA_PACKAGES = ("matplotlib", "mpl_toolkits", "PIL", "pillow", "sklearn", "scikit_learn")


def test_the_wheel_without_extras_trains_resumes_and_names_the_missing_extra(tmp_path):
    """pip install of the wheel with no extra, into an environment without matplotlib, pillow and scikit-learn (the
    shared environment's packages linked in, all but theirs): a small job trains and resumes; the forecast fits its
    GP in numpy; doctor lists the extras as not installed and stays OK; ``hpc-jabas report`` says in one line which
    extra it needs."""
    whl = build_wheel(tmp_path / "build")
    venv = tmp_path / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    vpy = venv / "bin" / "python"
    site = Path(_run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     tmp_path, os.environ).strip())
    # the shared environment's packages, as links, all but the extras': an environment that never had them
    view = tmp_path / "shared-without-extras"
    view.mkdir()
    for p in Path(str(md.distribution("torch").locate_file(""))).resolve().iterdir():
        if not p.name.startswith(EXTRA_PACKAGES):
            (view / p.name).symlink_to(p)
    (site / "_shared_env.pth").write_text(f"{view}\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "HPC_JABAS"))}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}", PIP_DISABLE_PIP_VERSION_CHECK="1",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    _run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-index", str(whl)], outside, env)
    probe = ("import importlib.util, importlib.metadata as md\n"
             "print([r for r in md.requires('hpc-jabas') if 'extra ==' not in r])\n"
             "print([m for m in ('matplotlib', 'PIL', 'sklearn') if importlib.util.find_spec(m) is None])")
    base, hidden = _run([str(vpy), "-c", probe], outside, env).strip().splitlines()
    assert not any(p in base for p in ("matplotlib", "pillow", "scikit-learn")), base
    assert hidden == "['matplotlib', 'PIL', 'sklearn']", hidden

    doctor = _run([str(venv / "bin" / "hpc-jabas"), "doctor"], outside, env)
    for extra in ("report", "forecast", "examples"):
        assert f"not installed (optional: pip install 'hpc-jabas[{extra}]'" in doctor, doctor
    assert doctor.rstrip().splitlines()[-1].split() == ["status", "OK"], doctor

    (outside / "train.py").write_text(SCRIPT)
    args = ["train.py", "--emulate", "--gpu-types", "v100", "--batch", "64", "--run-dir", "run", "--quiet"]
    _run([str(vpy), *args, "--epochs", "2", "--out", "first.json"], outside, env)
    _run([str(vpy), *args, "--epochs", "3", "--out", "second.json"], outside, env)
    first, second = (json.loads((outside / f).read_text()) for f in ("first.json", "second.json"))
    assert first["result"]["epoch"] == 2 and second["result"]["epoch"] == 3, (first, second)
    assert second["after"] < first["before"], (first, second)
    recs = [json.loads(ln) for ln in (outside / "run" / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    resumes = [r for r in recs if r.get("type") == "resume"]
    assert resumes and resumes[-1]["epoch"] == 2, resumes

    fc = _run([str(vpy), "-c", "from hpc_jabas.core.autoscale.forecast import forecast_next_epoch, have_sklearn; "
               "print(have_sklearn(), forecast_next_epoch([(i * 100, 100 + 10 * i) for i in range(12)], 500))"],
              outside, env)
    said, out = fc.split(" ", 1)
    got = json.loads(out)
    assert said == "False" and len(got) == 5 and got == sorted(got) and got[0] >= 210, fc

    r = subprocess.run([str(venv / "bin" / "hpc-jabas"), "report", "run"], cwd=outside, env=env, capture_output=True,
                       text=True, timeout=120)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(err) == 1 and "pip install 'hpc-jabas[report]'" in err[0], (r.returncode, err)
