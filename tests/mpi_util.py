"""Run a worker script on several Horovod ranks (mpirun or horovodrun --gloo) and collect JSON."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
WORKERS = ROOT / "tests" / "workers"


def mpi_env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1",
               OMPI_MCA_mpi_yield_when_idle="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_ranks_cases(worker: str, specs: list[dict], np_: int = 3, timeout: int = 300) -> list[list[dict]]:
    """Several specs in ONE launch of `np_` ranks (the worker runs its "cases" one after another): per spec,
    each rank's JSON result. A launch costs every rank its torch/Horovod start-up (seconds of CPU each), so
    the cases of one test module that need the same worker and rank count share it."""
    with tempfile.TemporaryDirectory() as td:
        cases = []
        for k, s in enumerate(specs):
            (Path(td) / f"case{k}").mkdir()
            cases.append(dict(s, out_dir=str(Path(td) / f"case{k}")))
        run_ranks(worker, {"cases": cases}, np_=np_, timeout=timeout, _out_dir=td)
        return [[json.loads((Path(c["out_dir"]) / f"rank{r}.json").read_text()) for r in range(np_)] for c in cases]


def run_ranks(worker: str, spec: dict, np_: int = 3, launcher: str = "mpirun", timeout: int = 300,
              _out_dir: str | None = None) -> list[dict]:
    """Start `np_` ranks of tests/workers/<worker> with spec (JSON); return each rank's JSON result."""
    with tempfile.TemporaryDirectory() as td:
        if _out_dir is not None:
            td = _out_dir
        spec = dict(spec, out_dir=td)
        sp = Path(td) / "spec.json"
        sp.write_text(json.dumps(spec))
        script = str(WORKERS / worker)
        if launcher == "mpirun":
            cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), PY, script, str(sp)]
        elif launcher == "gloo":
            hvdrun = str(Path(PY).parent / "horovodrun")
            cmd = [hvdrun, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", PY, script, str(sp)]
        else:
            raise ValueError(launcher)
        p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
        if p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}")
        out = []
        if _out_dir is not None:             # run_ranks_cases reads the cases' results
            return out
        for r in range(np_):
            f = Path(td) / f"rank{r}.json"
            assert f.exists(), f"rank {r} wrote no result\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            out.append(json.loads(f.read_text()))
        return out
