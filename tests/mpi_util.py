"""Run a worker script on several Horovod ranks (mpirun or horovodrun --gloo) and collect JSON.

A launch costs every rank its torch/Horovod start-up (about 5 s of CPU each on this machine), which made rank
starts most of the suite's time. So the worker scripts in POOL_WORKERS run on a warm pool of mpirun ranks
(RankPool, tests/workers/pool_worker.py), one pool per rank count and test process, started on first use: each
script runs there as ``python SCRIPT SPEC`` would, one at a time. Scripts that signal or kill their own ranks
always get a launch of their own, and so does everything when HPC_JABAS_TEST_POOL=0.
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
WORKERS = ROOT / "tests" / "workers"


def mpi_env(backend: str | None = None):
    """The ranks' environment; ``backend`` ("torch" or "horovod") pins HPC_JABAS_BACKEND, None leaves "auto"
    (Horovod where it is built)."""
    env = dict(os.environ)
    if backend is not None:
        env["HPC_JABAS_BACKEND"] = backend
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1",
               OMPI_MCA_mpi_yield_when_idle="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


#: the worker scripts that run on a warm pool: none signals, kills or exits its own ranks
POOL_WORKERS = frozenset({"train_worker.py", "protocol_worker.py", "optim_worker.py", "model_eval.py", "model_bn.py",
                          "adaptive_worker.py", "calib_worker.py", "comm_worker.py", "loader_worker.py"})


class _Warm:
    """A warm helper process (rank pool, fork server) serving requests through files in ``self.dir``."""
    dir: Path
    log: Any
    proc: subprocess.Popen

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(self, k: int, req: dict) -> None:
        (self.dir / f".req{k}.tmp").write_text(json.dumps(req))
        (self.dir / f".req{k}.tmp").rename(self.dir / f"req{k}.json")

    def close(self) -> None:
        if self.alive():
            (self.dir / "stop").touch()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)         # started in a session of its own
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class RankPool(_Warm):
    """``np_`` mpirun ranks that run worker scripts on request (tests/workers/pool_worker.py)."""

    def __init__(self, np_: int, backend: str | None = None):
        self.np = np_
        self.dir = Path(tempfile.mkdtemp(prefix=f"hj-pool{np_}{backend or ''}-"))
        self.k = 0
        self.log = open(self.dir / "mpirun.log", "w")
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), PY,
               str(WORKERS / "pool_worker.py"), str(self.dir), str(os.getpid())]
        self.proc = subprocess.Popen(cmd, env=mpi_env(backend), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=str(ROOT), start_new_session=True)

    def run(self, script: str, spec_path: Path, log_dir: Path, timeout: float) -> None:
        """Run one script on every rank; AssertionError (with the ranks' output) when a rank fails. A pool whose
        ranks did not all come back (one raised while the others wait in a collective) is closed."""
        k, self.k = self.k, self.k + 1
        req = {"script": script, "spec": str(spec_path), "log_dir": str(log_dir)}
        self.request(k, req)
        done: dict[int, dict] = {}
        end, grace_end = time.time() + timeout, None
        while len(done) < self.np:
            for r in range(self.np):
                f = self.dir / f"done{k}-{r}.json"
                if r not in done and f.exists():
                    done[r] = json.loads(f.read_text())
                    if not done[r]["ok"] and grace_end is None:
                        grace_end = time.time() + 5.0       # the others may fail alike, or hang
            now = time.time()
            if len(done) < self.np and (not self.alive() or now > end or (grace_end and now > grace_end)):
                break
            time.sleep(0.02)
        if len(done) == self.np and all(d["ok"] for d in done.values()):
            return
        why = "timed out" if time.time() > end else "a rank failed" if done else "the pool died"
        self.close()
        logs = "\n".join(f"--- rank {r}\n{(log_dir / f'rank{r}.log').read_text()[-3000:]}"
                         for r in range(self.np) if (log_dir / f"rank{r}.log").exists())
        mp = (self.dir / "mpirun.log").read_text()[-2000:] if (self.dir / "mpirun.log").exists() else ""
        raise AssertionError(f"{Path(script).name} {spec_path} on the {self.np}-rank pool: {why} "
                             f"(done: {sorted(done)}):\n{logs}\n--- mpirun\n{mp}")


_POOLS: dict[tuple[int, str | None], RankPool] = {}


def _pool(np_: int, backend: str | None = None) -> RankPool:
    p = _POOLS.get((np_, backend))
    if p is None or not p.alive():
        p = _POOLS[np_, backend] = RankPool(np_, backend)
    return p


@atexit.register
def _close_pools() -> None:
    for p in [*_POOLS.values(), *_SERVER]:
        p.close()
    _POOLS.clear()
    _SERVER.clear()


class ForkServer(_Warm):
    """One-process scripts forked from a warm process (tests/workers/fork_server.py), one server per test process."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="hj-fork-"))
        self.k = 0
        self.log = open(self.dir / "server.log", "w")
        self.proc = subprocess.Popen([PY, str(WORKERS / "fork_server.py"), str(self.dir), str(os.getpid())],
                                     env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(ROOT),
                                     start_new_session=True)

    def run(self, args: list[str], env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
        k, self.k = self.k, self.k + 1
        out, err = self.dir / f"out{k}", self.dir / f"err{k}"
        req = {"script": args[0], "args": list(args[1:]), "env": dict(env), "cwd": str(cwd), "stdout": str(out),
               "stderr": str(err)}
        self.request(k, req)
        end = time.time() + timeout
        done = self.dir / f"done{k}.json"
        while not done.exists():
            if not self.alive():
                raise AssertionError(f"the fork server died:\n{(self.dir / 'server.log').read_text()[-3000:]}")
            if time.time() > end:
                pid = self.dir / f"pid{k}"
                if pid.exists():
                    os.kill(int(pid.read_text()), 9)
                raise subprocess.TimeoutExpired([PY, *args], timeout)
            time.sleep(0.01)
        rc = json.loads(done.read_text())["returncode"]
        res = subprocess.CompletedProcess([PY, *args], rc, out.read_text(errors="replace"),
                                          err.read_text(errors="replace"))
        out.unlink()
        err.unlink()
        return res


_SERVER: list[ForkServer] = []


def run_script(args: list[str], env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run([python, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)``
    for a one-process script, forked from a warm process unless HPC_JABAS_TEST_POOL=0 (or the script needs
    other OpenMP threads than the tests' one)."""
    if os.environ.get("HPC_JABAS_TEST_POOL", "1") == "0" or env.get("OMP_NUM_THREADS") != "1":
        return subprocess.run([PY, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if not _SERVER or not _SERVER[0].alive():
        _SERVER[:] = [ForkServer()]
    return _SERVER[0].run(args, env, cwd, timeout)


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
              _out_dir: str | None = None, backend: str | None = None) -> list[dict]:
    """Start `np_` ranks of tests/workers/<worker> with spec (JSON); return each rank's JSON result. ``backend``:
    see :func:`mpi_env` (a pool of its own per backend)."""
    with tempfile.TemporaryDirectory() as td:
        if _out_dir is not None:
            td = _out_dir
        spec = dict(spec, out_dir=td)
        sp = Path(td) / "spec.json"
        sp.write_text(json.dumps(spec))
        script = str(WORKERS / worker)
        if launcher == "mpirun" and worker in POOL_WORKERS and os.environ.get("HPC_JABAS_TEST_POOL", "1") != "0":
            logs = Path(td) / "logs"
            logs.mkdir(exist_ok=True)
            _pool(np_, backend).run(script, sp, logs, timeout)
            return [] if _out_dir is not None else _results(td, np_, "\n".join(
                f"--- rank {r}\n{(logs / f'rank{r}.log').read_text()[-3000:]}" for r in range(np_)
                if (logs / f"rank{r}.log").exists()))
        if launcher == "mpirun":
            cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), PY, script, str(sp)]
        elif launcher == "gloo":
            hvdrun = str(Path(PY).parent / "horovodrun")
            cmd = [hvdrun, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", PY, script, str(sp)]
        else:
            raise ValueError(launcher)
        p = subprocess.run(cmd, env=mpi_env(backend), capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
        if p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}")
        if _out_dir is not None:             # run_ranks_cases reads the cases' results
            return []
        return _results(td, np_, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")


def _results(td: str, np_: int, output: str) -> list[dict]:
    out = []
    for r in range(np_):
        f = Path(td) / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no result\n{output}"
        out.append(json.loads(f.read_text()))
    return out
