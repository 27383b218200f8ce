"""Adaptive batching benchmark (issue 5): time to a target test accuracy.

3 ranks (mpirun) emulating V100 / P100 / RTX 2060, same model and base lr per task. Runs, in
one process run: fixed small B, fixed large B, adaptive similarity (JABAS), adaptive noise
scale (Pollux's statistic). Tasks: scikit-learn's digits and a harder synthetic classification
(make_classification). Wall time counts training only (evaluation pauses the clock).
Emulated cost per micro-batch: (4 ms + 0.05 ms * b) / speed, the planner picks b.
Last line: tta_ratio_similarity= tta_ratio_noise_scale= acc_gap_pts= (adaptive time over
fixed-small time, the worse of the two tasks; worst final-accuracy gap to fixed-small, points).
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _launch import ensure_ranks  # noqa: E402

ensure_ranks(3)

import torch  # noqa: E402
from sklearn.datasets import load_digits, make_classification  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from torch import nn  # noqa: E402

from hpc_jabas.core.config import JobConfig  # noqa: E402
from hpc_jabas.runtime import comm  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

torch.set_num_threads(1)
comm.init()
rank = comm.rank()
TYPES = ["v100", "p100", "rtx2060"]


def task_digits():
    X, y = load_digits(return_X_y=True)
    return X / 16.0, y, 10, 0.95, 40


def task_synthetic():
    X, y = make_classification(n_samples=12000, n_features=40, n_informative=24, n_redundant=4, n_classes=6,
                               n_clusters_per_class=2, class_sep=1.2, flip_y=0.02, random_state=0)
    return (X - X.mean(0)) / X.std(0), y, 6, 0.80, 30


def run(task, name, **kw):
    X, y, classes, target, max_epochs = task
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    ds = torch.utils.data.TensorDataset(torch.tensor(Xtr, dtype=torch.float32), torch.tensor(ytr))
    Xt, yt = torch.tensor(Xte, dtype=torch.float32), torch.tensor(yte)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(X.shape[1], 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cfg = JobConfig(emulate=True, gpu_types=TYPES, checkpoint=False, run_dir=f"/tmp/hj-bench-tta/{name}",
                    epochs=max_epochs, metrics_period=50, **kw)
    tr = Trainer(model, opt, ds, nn.CrossEntropyLoss(), config=cfg)

    def acc():
        model.eval()
        with torch.no_grad():
            a = float((model(Xt).argmax(1) == yt).float().mean())
        model.train()
        return a

    clock, t_hit = 0.0, None
    eval_every = 5
    while tr.sampler.epoch < max_epochs:
        t0 = time.perf_counter()
        if tr.sampler.epoch_done(tr.B):
            tr.sampler.new_epoch()
            continue
        tr.train_step()
        clock += time.perf_counter() - t0
        if tr.iteration % eval_every == 0:
            a = comm.broadcast_object(acc() if rank == 0 else None, name=f"acc{name}")
            if a >= target and t_hit is None:
                t_hit = clock
                break
    final = comm.broadcast_object(acc() if rank == 0 else None, name=f"fin{name}")
    tr.flush_metrics()
    tr.opt.remove_hooks()
    Bs = [h["B"] for h in tr.history]
    clock = max(comm.allgather_object(clock))
    if rank == 0:
        print(f"  {name:<22} time_to_target={t_hit if t_hit is None else round(t_hit, 2)} "
              f"iterations={tr.iteration} final_acc={final:.4f} B[{min(Bs)}..{max(Bs)}] wall={clock:.2f}s",
              flush=True)
    return (t_hit if t_hit is not None else float("inf")), final


results = {}
small, large = 32, 512
# A GPU-like cost: a micro-batch costs a fixed launch/latency part plus a small per-sample part, so
# small batches leave the device underused (the regime where growing B pays off).
common = dict(planner="optimal", lr_rule="sqrt", batch_ref=small, emulate_base_s=0.004, emulate_per_sample_s=0.00005)
for tname, task in (("digits", task_digits()), ("synthetic", task_synthetic())):
    if rank == 0:
        print(f"task {tname}: target accuracy {task[3]}", flush=True)
    r = {}
    r["fixed_small"] = run(task, f"{tname}-fixed-small", batch=small, **common)
    r["fixed_large"] = run(task, f"{tname}-fixed-large", batch=large, batch_min=large, batch_max=large,
                           **dict(common, batch_ref=large))
    r["similarity"] = run(task, f"{tname}-similarity", batch=small, batch_min=small, batch_max=large,
                          policy="similarity", gamma=0.5, alpha=0.25, p=5, **common)
    r["noise_scale"] = run(task, f"{tname}-noise-scale", batch=small, batch_min=small, batch_max=large,
                           policy="noise-scale", k=2.0, p=5, **common)
    results[tname] = r

if rank == 0:
    ratio = lambda k: max(results[t][k][0] / results[t]["fixed_small"][0] for t in results)
    gap = max(100 * (results[t]["fixed_small"][1] - results[t][k][1]) for t in results
              for k in ("similarity", "noise_scale"))
    print(f"tta_ratio_similarity={ratio('similarity'):.3f} tta_ratio_noise_scale={ratio('noise_scale'):.3f} "
          f"acc_gap_pts={gap:.2f}")
