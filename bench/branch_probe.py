"""A study before building the branch probe: can k paired steps measure how much a larger batch buys, per run?

    .venv/bin/python -m bench.branch_probe            # 2 tasks x 3 seeds x 4 points (a few minutes)
    .venv/bin/python -m bench.branch_probe --quick    # 1 seed, 2 points

Why: goodput prices B with E(B) = (B_noise + B0) / (B_noise + B) from the measured noise scale B_noise. A
calibration kappa (B_noise_eff = kappa B_noise) helps on the shapes task (kappa 4 cuts the climb) and breaks the
digits task (its B = 256 never reaches the target), with the same optimizer (momentum SGD): no prior serves both,
so kappa would have to be measured per run. The probe: from one snapshot of model and optimizer, k steps at B and
k/2 steps at 2B on the same k B samples (lr by goodput's rule, linear in B); progress = the fall of the loss on a
fixed probe set (the task's test split, eval mode). Under the model, rho = progress(2B) / progress(B) =
(B + B_noise_eff) / (2B + B_noise_eff), so B_noise_eff = B (2 rho - 1) / (1 - rho) (rho >= 1: no loss from
doubling, rho <= 1/2: doubling buys nothing). Does rho separate the tasks where the grids say they differ
(B = 128 -> 256), and how precise is one probe?

What it runs, per task (bench/common/tta_tasks.py: shapes, 10 epochs; digits, 20 epochs; lr0 0.05, momentum
0.9, cosine per epoch, the adaptive benchmark's set-up) and seed (0, 1, 2): a fixed-32 run; at 4 points of it
("early": after 2 iterations; "late": after 10%, 40% and 70% of the epochs) the noise scale B_simple =
tr(Sigma) / |G|^2 (per-batch estimator, tta_tasks.noise_scale) and, for k in 8, 32 and B in 32, 64, 128, 256,
REPEATS = 5 probes, each on fresh samples. Plain torch, one process, no hpc_jabas: a measurement that decides what
to build, not the trainer's code.

Printed per task, phase, k and B: rho of the 5 probes pooled (summed progress at 2B over summed progress at B), its
median over seeds and points with min/max; one probe's 10-90% band and the share of probes whose B-branch made no
progress (rho undefined); the implied kappa = B_noise_eff / B_simple (median). Last line: ``<task>_<phase>_k<k>_
<B>_rho`` (pooled medians), ``..._single_spread`` (one probe's 90th - 10th percentile) for B = 64, 128, 256 at
k = 8 and B = 128 at k = 32, and ``separated_late_128=yes|no`` (the tasks' late pooled rho at B = 128, k = 32:
their min-max ranges do not overlap).
"""
from __future__ import annotations

import argparse
import copy
import math

import numpy as np
import torch
from torch import nn

from bench.common import tta_tasks as tasks

KS = (8, 32)            # steps of the B-branch (the 2B-branch takes k / 2 on the same samples)
REPEATS = 5             # probes per point and B, each on fresh samples
BS = (32, 64, 128, 256)
SMALL, LR0, MOM, FLOOR = 32, 0.05, 0.9, 0.05
POINTS = (None, 0.1, 0.4, 0.7)      # None: after 2 iterations; else a share of the epochs


def cosine_lr(epoch: float, epochs: int) -> float:
    return LR0 * (FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * min(epoch, epochs) / epochs)))


def probe_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    was = model.training
    model.eval()
    with torch.no_grad():
        v = float(nn.functional.cross_entropy(model(x), y))
    model.train(was)
    return v


def branch(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor,
           b: int, lr: float) -> None:
    """len(idx) / b momentum-SGD steps of batch b at lr, in place."""
    for g in opt.param_groups:
        g["lr"] = lr
    for s in range(0, len(idx), b):
        sel = idx[s:s + b]
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x[sel]), y[sel]).backward()
        opt.step()


def one_probe(model, opt, x, y, xp, yp, B: int, k: int, lr_b: float, gen: torch.Generator) -> tuple[float, float]:
    """(progress(B), progress(2B)) from the same snapshot and the same k B samples: k steps at B, k / 2 at 2B."""
    snap_m, snap_o = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    idx = torch.randperm(x.shape[0], generator=gen)[: k * B] if k * B <= x.shape[0] else \
        torch.randint(0, x.shape[0], (k * B,), generator=gen)
    l0 = probe_loss(model, xp, yp)
    rng_state = torch.get_rng_state()
    branch(model, opt, x, y, idx, B, lr_b * B / SMALL)
    d1 = l0 - probe_loss(model, xp, yp)
    model.load_state_dict(snap_m)
    opt.load_state_dict(snap_o)
    torch.set_rng_state(rng_state)                   # the same augmentation draws
    branch(model, opt, x, y, idx, 2 * B, lr_b * 2 * B / SMALL)
    d2 = l0 - probe_loss(model, xp, yp)
    model.load_state_dict(snap_m)
    opt.load_state_dict(snap_o)
    return d1, d2


def ratio(pairs) -> float:
    """rho of probes pooled: the summed progress at 2B over the summed progress at B (nan: no progress at B)."""
    d1, d2 = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return d2 / d1 if d1 > 0 else float("nan")


def kappa_of(rho: float, B: int, b_simple: float) -> float:
    if not math.isfinite(rho) or b_simple <= 0 or not math.isfinite(b_simple):
        return float("nan")
    if rho >= 1.0:
        return float("inf")
    b_eff = B * max(0.0, 2 * rho - 1) / (1 - rho)
    return b_eff / b_simple


def run_task(name: str, seeds, points, out: dict) -> None:
    data, model_fn, epochs = {"shapes": (tasks.shapes_data(), tasks.shapes_model, 10),
                              "digits": (tasks.digits_data(), tasks.digits_model, 20)}[name]
    xtr, ytr, xte, yte = data
    x, y = torch.tensor(xtr), torch.tensor(ytr, dtype=torch.long)
    xp, yp = torch.tensor(xte), torch.tensor(yte, dtype=torch.long)
    n = x.shape[0]
    iters_per_epoch = math.ceil(n / SMALL)
    single: dict[tuple, list[float]] = {}    # (k, B, late) -> rho of single probes
    pooled: dict[tuple, list[float]] = {}    # (k, B, late) -> rho of REPEATS probes pooled, one per point and seed
    kappa: dict[tuple, list[float]] = {}
    for seed in seeds:
        torch.manual_seed(seed)
        model = model_fn()
        opt = torch.optim.SGD(model.parameters(), lr=LR0, momentum=MOM)
        gen = torch.Generator().manual_seed(1000 + seed)
        stops = sorted(2 if p is None else int(round(p * epochs * iters_per_epoch)) for p in points)
        it = 0
        for j, stop in enumerate(stops):
            while it < stop:                       # fixed-32 training up to the next point
                e = it // iters_per_epoch
                if it % iters_per_epoch == 0:
                    perm = torch.randperm(n, generator=gen)
                sel = perm[(it % iters_per_epoch) * SMALL:(it % iters_per_epoch + 1) * SMALL]
                for g in opt.param_groups:
                    g["lr"] = cosine_lr(e, epochs)
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(x[sel]), y[sel]).backward()
                opt.step()
                it += 1
            lr_now = cosine_lr(it // iters_per_epoch, epochs)
            b_simple = tasks.noise_scale(model, nn.CrossEntropyLoss(), x, y, gen=gen)[0]
            late = j > 0
            line = []
            for k in KS:
                for B in BS:
                    pairs = [one_probe(model, opt, x, y, xp, yp, B, k, lr_now, gen) for _ in range(REPEATS)]
                    single.setdefault((k, B, late), []).extend(ratio([p]) for p in pairs)
                    r = ratio(pairs)
                    pooled.setdefault((k, B, late), []).append(r)
                    kappa.setdefault((k, B, late), []).append(kappa_of(r, B, b_simple))
                    line.append(f"k={k} B={B} {r:.2f}")
            print(f"  [{name} seed {seed}] iteration {it} (epoch {it / iters_per_epoch:.1f}), B_simple={b_simple:.0f}; "
                  f"rho pooled over {REPEATS}: " + ", ".join(line), flush=True)
    for (k, B, late), rs in sorted(single.items()):
        fin = [r for r in rs if math.isfinite(r)]
        q10, q90 = np.percentile(fin, [10, 90]) if fin else (float("nan"),) * 2
        pl = [r for r in pooled[(k, B, late)] if math.isfinite(r)]
        ks = [v for v in kappa[(k, B, late)] if not math.isnan(v)]
        tag = f"{name}_{'late' if late else 'early'}_k{k}_{B}"
        out[f"{tag}_rho"] = float(np.median(pl)) if pl else float("nan")
        out[f"{tag}_rho_lo"], out[f"{tag}_rho_hi"] = (min(pl), max(pl)) if pl else (float("nan"),) * 2
        out[f"{tag}_single_spread"] = float(q90 - q10)
        out[f"{tag}_kappa"] = float(np.median(ks)) if ks else float("nan")
        print(f"{name} {'late ' if late else 'early'} k={k:3d} B={B:3d}->{2 * B:3d}: rho pooled median "
              f"{out[tag + '_rho']:.3f} [min {out[tag + '_rho_lo']:.3f}, max {out[tag + '_rho_hi']:.3f}] "
              f"over {len(pl)}; "
              f"one probe 10-90% [{q10:.2f}, {q90:.2f}] ({1 - len(fin) / len(rs):.0%} undefined); "
              f"implied kappa median {out[tag + '_kappa']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    seeds, points = ((0,), (None, 0.4)) if a.quick else ((0, 1, 2), POINTS)
    out: dict = {}
    for name in ("shapes", "digits"):
        run_task(name, seeds, points, out)
    k = KS[-1]
    s, d = f"shapes_late_k{k}_128", f"digits_late_k{k}_128"
    sep = out[s + "_rho_lo"] > out[d + "_rho_hi"] or out[d + "_rho_lo"] > out[s + "_rho_hi"]
    keys = [f"{t}_{ph}_k{kk}_{B}_{v}" for t in ("shapes", "digits") for ph in ("early", "late")
            for kk, B in ((8, 64), (8, 128), (8, 256), (k, 128)) for v in ("rho", "single_spread")]
    print(" ".join(f"{key}={out[key]:.3f}" for key in keys) + f" separated_late_128={'yes' if sep else 'no'}")


if __name__ == "__main__":
    main()
