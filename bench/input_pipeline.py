"""Input pipeline benchmark: ResNet-18 training fed from JPEG files, three ways.

Every run is one epoch of a fresh Trainer (standard ResNet-18, BasicBlock [2, 2, 2, 2], on
--image-size JPEG files of examples/jpeg_shapes.py; torch on 1 thread per rank, plan b=--batch,
one micro-batch per rank per iteration), timed as the whole fit() loop (worker start-up, the
epoch's iterations, the allreduce and the sampler all included), on rank 0 between barriers:

  (a) loader:    a torch DataLoader with --workers worker processes (decode + random crop + flip +
                 normalise in the workers, prefetch factor 2) driven by the heterogeneous batch sampler;
  (b) sync:      the old synchronous path, the JpegFolder Dataset itself: dataset[i] (decode +
                 augment) and default_collate on the training thread;
  (c) preloaded: the same images decoded once beforehand and normalised, as a TensorDataset
                 (tensor indexing; NO augmentation: the cheapest possible input, the ceiling).

Throughput = samples / wall time. --repeats rounds, the order of the three rotated every round;
the ratios are taken within a round. Last line: loader_vs_preloaded=<median> sync_vs_preloaded=<median>
(goal: loader_vs_preloaded >= 0.85); the line before: min/max and the machine's load. Also printed:
the per-sample cost of decode + augment and of the model's forward/backward on the training thread,
which bound what a loader can win: on a CPU-only machine the model's compute dominates, and the
workers take CPU time from the training ranks when the cores are all busy.

    .venv/bin/python -m bench.input_pipeline                 # 1 rank, 1 worker (re-runs itself under mpirun)
    .venv/bin/python -m bench.input_pipeline --ranks 2 --workers 1
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common.launch import ensure_ranks, load_note

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--ranks", type=int, default=1, choices=(1, 2))
ap.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank (>= 1)")
ap.add_argument("--image-size", type=int, default=64)
ap.add_argument("--width", type=int, default=64, help="ResNet-18 first-stage channels (64: the standard one)")
ap.add_argument("--files", type=int, default=320, help="JPEG files (10 classes)")
ap.add_argument("--batch", type=int, default=32, help="micro-batch size b (one per rank per iteration)")
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "hj-bench-jpeg"))
args = ap.parse_args()
if args.workers < 1 or args.repeats < 3 or args.files < 10:
    sys.exit("input_pipeline.py: give --workers >= 1, --repeats >= 3, --files >= 10")
ensure_ranks(args.ranks)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from examples.jpeg_shapes import JpegFolder, ensure_image_folder, preload  # noqa: E402
from examples.train_resnet import resnet18  # noqa: E402
from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.log import get_logger  # noqa: E402
from hpc_jabas.runtime.comm import seam as comm  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

get_logger("hpc_jabas").setLevel("ERROR")
torch.set_num_threads(1)
comm.init()
rank, world = comm.rank(), comm.size()
root = ensure_image_folder(Path(args.data_dir) / f"{args.files // 10}x{args.image_size}",
                           per_class=args.files // 10, size=args.image_size)
folder = JpegFolder(root, train=True)
pre = preload(folder)
N = len(folder)
tmp = Path(tempfile.mkdtemp(prefix="hj-input-"))


def data_for(mode: str):
    if mode == "loader":
        return torch.utils.data.DataLoader(folder, num_workers=args.workers, prefetch_factor=2)
    return folder if mode == "sync" else pre


def one_run(mode: str, r: int) -> tuple[float, int]:
    torch.manual_seed(0)
    model = resnet18(10, args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    run_dir = str(tmp / f"{mode}-{r}") if rank == 0 else str(tmp / f"{mode}-{r}-r{rank}")
    cfg = JobConfig(planner="fixed", plan=f"b={args.batch} n={','.join(['1'] * world)}", batch=args.batch * world,
                    epochs=1, checkpoint=False, run_dir=run_dir, metrics_period=1000, seed=r)
    cfg.validate()
    tr = Trainer(model, opt, data_for(mode), nn.CrossEntropyLoss(), config=cfg)
    comm.allgather_object(0, name=f"bar.{mode}.{r}.a")
    t0 = time.perf_counter()
    res = tr.fit(resume=False)
    comm.allgather_object(0, name=f"bar.{mode}.{r}.b")
    return time.perf_counter() - t0, int(res["samples"])


def per_sample_costs() -> tuple[float, float]:
    """Training thread, per sample: decode + augment + normalise; forward + backward of the model."""
    k = min(64, N)
    t0 = time.perf_counter()
    for i in range(k):
        folder[i]
    data_s = (time.perf_counter() - t0) / k
    model = resnet18(10, args.width)
    x, y = pre.tensors[0][:args.batch], pre.tensors[1][:args.batch]
    nn.CrossEntropyLoss()(model(x), y).backward()          # warm-up
    t0 = time.perf_counter()
    for _ in range(2):
        nn.CrossEntropyLoss()(model(x), y).backward()
    return data_s, (time.perf_counter() - t0) / (2 * len(x))


modes = ["loader", "sync", "preloaded"]
thr: dict[str, list[float]] = {m: [] for m in modes}
ratios: dict[str, list[float]] = {"loader": [], "sync": []}
for r in range(args.repeats):
    order = modes[r % 3:] + modes[:r % 3]
    got = {}
    for m in order:
        wall, samples = one_run(m, r)
        got[m] = samples / wall
        thr[m].append(got[m])
    ratios["loader"].append(got["loader"] / got["preloaded"])
    ratios["sync"].append(got["sync"] / got["preloaded"])
    if rank == 0:
        print(f"round {r}: order {','.join(order)}: " + " ".join(f"{m}={got[m]:.1f}/s" for m in modes), flush=True)
if rank == 0:
    data_s, model_s = per_sample_costs()
    params = sum(p.numel() for p in resnet18(10, args.width).parameters())
    print(f"setup: ranks={world} workers/rank={args.workers} files={N} image={args.image_size}px "
          f"resnet18 width={args.width} ({params / 1e6:.1f}M params) b={args.batch} per rank, 1 torch thread/rank")
    print(f"per sample on the training thread: decode+augment+normalise {data_s * 1e3:.2f} ms, "
          f"forward+backward {model_s * 1e3:.2f} ms (data = {data_s / (data_s + model_s):.1%} of the sync path)")
    for m in modes:
        v = thr[m]
        print(f"{m:9s} samples/s median {statistics.median(v):.1f} min {min(v):.1f} max {max(v):.1f}")
    lo, so = ratios["loader"], ratios["sync"]
    print(f"loader_vs_preloaded min={min(lo):.3f} max={max(lo):.3f} sync_vs_preloaded min={min(so):.3f} "
          f"max={max(so):.3f} {load_note()}")
    print(f"loader_vs_preloaded={statistics.median(lo):.3f} sync_vs_preloaded={statistics.median(so):.3f}")
