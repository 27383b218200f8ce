"""CPU burnt while ranks wait: Horovod as released vs the edited build (scripts/horovod_cycle_patch.py), and
Horovod's own synchronize vs hpc_jabas.runtime.comm.seam.synchronize (docs/toolchain.md).

One job, four ways, in one run of this script, order rotated per repeat: two Horovod builds x two waits.
- ``released-*``: the Horovod 0.28.1 wheel built WITHOUT the edit (``scripts/setup.sh --released-horovod-wheel``
  builds it once into the cache, ``wheels/torch-<v>-cpu/``; ``--released-wheel`` names another), unpacked into a
  temporary folder put first on PYTHONPATH;
- ``edited-*``: the installed (edited) Horovod;
- ``*-hvd``: every collective of the trainer waits with Horovod's own ``synchronize``;
- ``*-ours``: with ``comm.synchronize`` (what the trainer runs). ``edited-ours`` is what hpc-jabas runs here.
The job: 3 mpirun ranks emulating v100, p100 and rtx2060, a small MLP, B = 192 as micro-batches of 4 split
equally (``--plan``, default b=4 n=16,16,16: what plain Horovod does, so the two faster ranks wait for the
rtx2060 every iteration), 30 iterations. Each rank measures
its own process's CPU time (every thread: Horovod's background thread too) and the wall time of ``fit()``
only, after start-up. Printed per way: the 3 ranks' CPU-s summed, per second of fit(), and fit()'s wall time;
medians [min, max] over the repeats; "separated" when the two ways' ranges do not overlap.

Run: .venv/bin/python -m bench.horovod_spin [--repeats 3] [--iterations 30] [--released-wheel WHEEL]
(about 6 minutes here with the defaults)
Last line: key=value pairs.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import tempfile
import zipfile
from pathlib import Path

from bench.common.launch import ROOT, _mpi_env, _mpirun, load_note, self_command

WAYS = ("released-hvd", "released-ours", "edited-hvd", "edited-ours")


def worker(spec_path: str) -> None:
    """One rank: Trainer.fit() on the emulated job; writes its CPU and wall time of fit()."""
    import resource
    import time

    import torch
    from torch import nn

    from hpc_jabas.core.config.sections import JobConfig
    from hpc_jabas.runtime.comm import seam as comm
    from hpc_jabas.runtime.trainer import Trainer

    spec = json.loads(Path(spec_path).read_text())
    if spec["wait"] == "horovod":
        import horovod.torch as hvd
        comm.synchronize = hvd.synchronize          # Horovod's own wait, for every collective of the trainer
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    ds = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    cfg = JobConfig(planner="fixed", plan=spec["plan"], batch=192, micro_batch=4, epochs=1000, emulate=True,
                    gpu_types=["v100", "p100", "rtx2060"], run_dir=spec["run_dir"], checkpoint=False,
                    emulate_base_s=0.016, emulate_per_sample_s=0.0012)
    cfg.validate()
    tr = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), ds, nn.CrossEntropyLoss(), config=cfg)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    tr.fit(max_iterations=spec["iterations"])
    r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    import horovod
    (Path(spec["out"]) / f"rank{tr.rank}.json").write_text(json.dumps(
        {"cpu_s": cpu, "wall_s": wall, "horovod": str(Path(horovod.__file__).parent)}))


def released_wheel(arg: str | None) -> Path:
    """The unedited CPU wheel: ``--released-wheel``, else the one ``scripts/setup.sh --released-horovod-wheel``
    builds once into the cache beside the edited one (3-6 minutes the first time) and names."""
    if arg:
        return Path(arg)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "--released-horovod-wheel"], capture_output=True,
                       text=True)
    found = sorted(glob.glob(str(Path(r.stdout.strip() or "/nonexistent") / "horovod-0.28.1-*.whl")))
    if r.returncode != 0 or not found:
        why = (r.stderr.strip().splitlines() or [f"rc={r.returncode}"])[-1]
        raise SystemExit(f"horovod_spin: no unedited Horovod wheel (scripts/setup.sh --released-horovod-wheel: "
                         f"{why}); pass --released-wheel")
    return Path(found[-1])


def run_once(way: str, iterations: int, plan: str, released_dir: Path, tmp: Path, k: int) -> dict:
    out = tmp / f"{way}-{k}"
    out.mkdir()
    spec = {"wait": "ours" if way.endswith("-ours") else "horovod", "iterations": iterations, "out": str(out),
            "plan": plan, "run_dir": str(out / "run")}
    (out / "spec.json").write_text(json.dumps(spec))
    env = _mpi_env()
    if way.startswith("released"):
        env["PYTHONPATH"] = os.pathsep.join([str(released_dir), env["PYTHONPATH"]])
    r = subprocess.run([*_mpirun(3), *self_command(), "--worker", str(out / "spec.json")], env=env, capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"horovod_spin: the {way} run failed (rc={r.returncode}): "
                         f"{(r.stderr.strip().splitlines() or [''])[-1]}")
    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(3)]
    want = str(released_dir) if way.startswith("released") else None
    assert all((rk["horovod"].startswith(want) if want else str(released_dir) not in rk["horovod"]) for rk in ranks), \
        (way, [rk["horovod"] for rk in ranks])
    cpu, wall = sum(rk["cpu_s"] for rk in ranks), max(rk["wall_s"] for rk in ranks)
    return {"cpu_s": cpu, "wall_s": wall, "cpu_per_s": cpu / wall}


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}, {max(xs):.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--released-wheel")
    ap.add_argument("--plan", default="b=4 n=16,16,16", help="the fixed plan (default: equal split of B = 192)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return
    if a.repeats < 1 or a.iterations < 1:
        ap.error(f"--repeats {a.repeats} / --iterations {a.iterations}: both must be >= 1")
    wheel = released_wheel(a.released_wheel)
    res: dict[str, list[dict]] = {w: [] for w in WAYS}
    with tempfile.TemporaryDirectory(prefix="hj-spin-") as td:
        tmp = Path(td)
        released_dir = tmp / "released"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(released_dir)
        for k in range(a.repeats):
            order = WAYS[k % len(WAYS):] + WAYS[:k % len(WAYS)]
            for way in order:
                r = run_once(way, a.iterations, a.plan, released_dir, tmp, k)
                res[way].append(r)
                print(f"repeat {k} {way:<13} cpu_s={r['cpu_s']:.1f} fit_wall_s={r['wall_s']:.1f} "
                      f"cpu_per_s={r['cpu_per_s']:.2f}", flush=True)
    print(f"\n3 ranks, {a.iterations} iterations, {a.repeats} repeats, {load_note()}; released wheel: {wheel}")
    print(f"{'way':<14} {'CPU-s of the 3 ranks':<24} {'CPU-s per s of fit()':<24} fit() wall s")
    for w in WAYS:
        print(f"{w:<14} {fmt([r['cpu_s'] for r in res[w]]):<24} {fmt([r['cpu_per_s'] for r in res[w]]):<24} "
              f"{fmt([r['wall_s'] for r in res[w]])}")

    def sep(a_: str, b_: str, key: str) -> str:
        xa, xb = [r[key] for r in res[a_]], [r[key] for r in res[b_]]
        if len(xa) < 3:
            return "too few repeats to tell"
        return "separated" if max(xa) < min(xb) or max(xb) < min(xa) else "not separated"
    med = {w: {k: statistics.median(r[k] for r in res[w]) for k in ("cpu_s", "wall_s", "cpu_per_s")} for w in WAYS}
    for a_, b_ in (("edited-hvd", "released-hvd"), ("edited-ours", "released-ours"), ("released-ours", "released-hvd"),
                   ("edited-ours", "edited-hvd"), ("edited-ours", "released-hvd")):
        print(f"{a_} vs {b_}: CPU {sep(a_, b_, 'cpu_s')}, fit() wall {sep(a_, b_, 'wall_s')}")
    key = {w: w.replace("-", "_") for w in WAYS}
    print(" ".join(f"{key[w]}_cpu_s={med[w]['cpu_s']:.1f} {key[w]}_fit_wall_s={med[w]['wall_s']:.1f}" for w in WAYS)
          + f" cpu_ratio_ours_vs_released={med['edited-ours']['cpu_s'] / med['released-hvd']['cpu_s']:.3f}"
          + f" wall_ratio_ours_vs_released={med['edited-ours']['wall_s'] / med['released-hvd']['wall_s']:.3f}")


if __name__ == "__main__":
    main()
