"""Issue 56's three cheap experiments on the tasks of bench/adaptive_tta.py: updates, stability, generalisation.

    .venv/bin/python -m bench.adaptive_experiments                       # shapes, digits, seq, cnn; 3 seeds
    .venv/bin/python -m bench.adaptive_experiments --tasks shapes,digits,lm --seeds 2
    .venv/bin/python -m bench.adaptive_experiments --quick               # smoke run (under a minute)

What a run is: the fixed-B runs of bench/adaptive_tta.py, trained in ONE process with plain torch (no hpc_jabas, no
emulated cluster): the same data, model, optimizer (SGD with momentum 0.9; Adam for seq and cnn; AdamW for lm),
lr0 (the one adaptive_tta's lr grid kept), lr rules (sqrt: lr0 sqrt(B/32); linear: lr0 B/32 with a 2-epoch linear
warm-up, Goyal et al.), cosine schedule stepped per epoch to 0.05 lr0, epochs and initial weights per seed
(torch.manual_seed(1000 + seed)). A fixed B's update is the mean gradient over B samples whether one process
computes it or three ranks do, so the accuracy, loss and curvature trajectories are the bench's (up to sample
order); no time is measured, so nothing here depends on the machine's load. "latency shapes" and "compute shapes"
of the bench are one task here: the regimes change the clock, not the trajectory.

- Evaluations: test accuracy every quarter epoch (and at the start); training loss over the whole training set
  (eval mode, the labels trained on, noisy ones included) and the curvature headroom at every epoch end.
- Targets per task, from fixed-32's runs: "mid" = the median of its accuracy at 60% of the budget (adaptive_tta's
  rule), "plateau" = its median final accuracy less two standard deviations over the seeds.
- A fixed B MEETS a target when, with the sqrt or the linear rule, at least half of the seeds reach it (at any
  evaluation); B* = the largest grid B that meets it.

Experiments:
- Updates: digits' fixed-256-linear with twice the epochs (the cosine and the warm-up stretched over them). If it
  reaches the targets the 20-epoch run misses, the miss came from too few updates, not from the batch.
- Stability: the curvature headroom h = 2 eps_max / lr_eff, eps_max = g'g / g'Hg along the gradient g of a fixed
  1,024-sample probe batch of the training set (train mode, its augmentation drawn from a fixed seed; one
  Hessian-vector product by double backward), lr_eff = lr / (1 - 0.9) for SGD with momentum and the lr of the next
  step (schedule and warm-up included). Adam: along its preconditioned direction d = g / (sqrt(v_hat) + eps),
  eps_max = g'd / d'Hd, lr_eff = lr. Logged at every epoch end of the fixed-32 and fixed-256 runs. Summary:
  h_early = per seed the median of fixed-32's h at the epoch ends within the first 40% of the budget, then the
  median over seeds; c = (B* / 32) / h_early per task and target. One constant c across tasks is the hypothesis.
- Generalisation: final training loss and test accuracy of fixed-256 (both rules) against fixed-32. Equal (or
  lower) training loss with lower test accuracy is a generalisation gap no target-agnostic rule can see.

Last line: per task T: T_mid=, T_plateau= (targets, %), T_bstar_mid=, T_bstar_plateau=, T_h32_early=,
T_c_mid=, T_c_plateau=, T_h256_early=, T_loss32=, T_loss256=, T_acc32=, T_acc256= (medians; 256 = the
linear rule), T_gen_gap_seeds= (seeds where 256-linear ends with a lower-or-equal training loss and a lower test
accuracy than 32, paired), digits_x2_mid= digits_x2_plateau= (seeds reaching / seeds) and digits_acc256x2=,
c_fit_mid= and c_fit_plateau= (the range of one constant c that puts every task's B* where it is, or none), seeds=.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from bench.common import tta_tasks as tasks

SMALL = 32
GRID = (64, 128, 256, 512)
WARMUP_EPOCHS = 2
LR_FLOOR = 0.05
TARGET_AT = 0.6
PROBE = 1024
EARLY = 0.4                   # h_early: fixed-32's h at the epoch ends within this fraction of the budget
MOMENTUM = 0.9


@dataclass
class Spec:
    name: str
    optimizer: str            # sgd | adam | adamw
    lr0: float
    epochs: int
    lm: bool = False


#: lr0: what adaptive_tta's lr grids kept (bench/RESULTS.md): shapes and digits 0.05 (SGD), seq and cnn 0.01 (Adam),
#: lm 0.01 (AdamW)
SPECS = {"shapes": Spec("shapes", "sgd", 0.05, 10), "digits": Spec("digits", "sgd", 0.05, 20),
         "seq": Spec("seq", "adam", 0.01, 10), "cnn": Spec("cnn", "adam", 0.01, 8),
         "lm": Spec("lm", "adamw", 0.01, 8, lm=True)}


class Data:
    """A task's tensors and its loss / accuracy functions; ``train`` is a tuple of tensors indexed per sample."""

    def __init__(self, name: str, quick: bool):
        self.lm = name == "lm"
        if name == "lm":
            from examples.train_lm import lm_forward
            ds, vt, vl = tasks.lm_data(*((1024, 256) if quick else (tasks.LM_TRAIN, tasks.LM_TEST)))
            self.train, self.test = tuple(ds.tensors), (vt, vl)
            self.model_fn = tasks.lm_model
            self._fwd = lm_forward
            return
        if name == "shapes" or name == "cnn":
            raw = tasks.shapes_data(*((1200, 500) if quick else ()))
        elif name == "digits":
            raw = tasks.digits_data()
        else:
            raw = tasks.seq_data(*((800, 400) if quick else (tasks.SEQ_TRAIN, tasks.SEQ_TEST)))
        xtr, ytr, xte, yte = raw
        self.train = (torch.tensor(xtr), torch.tensor(ytr, dtype=torch.long))
        self.test = (torch.tensor(xte), torch.tensor(yte, dtype=torch.long))
        self.model_fn = {"shapes": tasks.shapes_model, "digits": tasks.digits_model, "seq": tasks.seq_model,
                         "cnn": tasks.shapes_cnn_model}[name]
        self._ce = nn.CrossEntropyLoss()

    @property
    def n(self) -> int:
        return len(self.train[0])

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        if self.lm:
            return self._fwd(model, batch)[0]
        return self._ce(model(batch[0]), batch[1])

    def accuracy(self, model: nn.Module) -> float:
        if self.lm:
            return tasks.lm_accuracy(model, *self.test)
        return tasks.accuracy(model, *self.test)

    def train_loss(self, model: nn.Module) -> float:
        """Mean loss over the whole training set in eval mode (the LM: token-weighted)."""
        was = model.training
        model.eval()
        tot, w = 0.0, 0.0
        with torch.no_grad():
            for i in range(0, self.n, 1024):
                b = tuple(t[i:i + 1024] for t in self.train)
                if self.lm:
                    loss, ntok = self._fwd(model, b)
                    tot, w = tot + float(loss) * float(ntok), w + float(ntok)
                else:
                    tot, w = tot + float(self.loss(model, b)) * len(b[0]), w + len(b[0])
        model.train(was)
        return tot / max(w, 1.0)


def cosine_factor(e: int, epochs: int) -> float:
    return LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1 + math.cos(math.pi * min(e, epochs) / epochs))


def headroom(model: nn.Module, data: Data, probe: tuple, lr: float, opt: torch.optim.Optimizer,
             kind: str) -> float:
    """h = 2 eps_max / lr_eff on the probe batch (see the module docstring); inf where the curvature along the
    direction is not positive. The model's parameters and .grad are left untouched."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    params = [p for p in model.parameters() if p.requires_grad]
    # the math attention kernel: the fused CPU one has no double backward (the LM's Hessian-vector product)
    with torch.random.fork_rng(), sdpa_kernel([SDPBackend.MATH]):
        torch.manual_seed(4242)                  # the same augmentation draw at every measurement
        loss = data.loss(model, probe)
        g = torch.autograd.grad(loss, params, create_graph=True)
        if kind == "sgd":
            d = [gi.detach() for gi in g]
            lr_eff = lr / (1 - MOMENTUM)
        else:
            d = []
            for p, gi in zip(params, g):
                st = opt.state.get(p, {})
                if "exp_avg_sq" not in st:
                    return math.nan              # Adam before its first step: no preconditioner yet
                b2 = opt.param_groups[0]["betas"][1]
                step = float(st["step"])
                v_hat = st["exp_avg_sq"] / (1 - b2 ** step)
                d.append(gi.detach() / (v_hat.sqrt() + opt.param_groups[0]["eps"]))
            lr_eff = lr
        gd = sum((gi * di).sum() for gi, di in zip(g, d))
        hd = torch.autograd.grad(gd, params)
    dhd = float(sum((hi * di).double().sum() for hi, di in zip(hd, d)))
    gtd = float(sum((gi.detach() * di).double().sum() for gi, di in zip(g, d)))
    if dhd <= 0:
        return math.inf
    return 2.0 * (gtd / dhd) / lr_eff


def run(data: Data, spec: Spec, B: int, rule: str, seed: int, probe: tuple, epochs: int | None = None,
        measure_h: bool = False) -> dict:
    """One fixed-B run; returns its evaluations {(frac_epoch, acc)}, per-epoch train loss and h, final values."""
    epochs = epochs or spec.epochs
    torch.manual_seed(1000 + seed)
    model = data.model_fn()
    base = spec.lr0 * {"none": 1.0, "sqrt": math.sqrt(B / SMALL), "linear": B / SMALL}[rule]
    if spec.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=base, momentum=MOMENTUM)
    elif spec.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=base)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=base, weight_decay=0.01)
    n = data.n
    per_epoch = math.ceil(n / B)
    warm_iters = WARMUP_EPOCHS * per_epoch if rule == "linear" else 0
    r0 = SMALL / B

    def lr_at(epoch: int, step: int) -> float:          # step: the 0-based index of the optimizer step
        f = r0 + (1 - r0) * min(1.0, (step + 1) / warm_iters) if warm_iters else 1.0
        return base * cosine_factor(epoch, epochs) * f

    gen = torch.Generator().manual_seed(seed)
    evals = [(0.0, data.accuracy(model))]
    losses, hs = [], []
    if measure_h:
        hs.append(headroom(model, data, probe, lr_at(0, 0), opt, spec.optimizer))
    quarter = [round(n * q / 4) for q in (1, 2, 3)]
    step = 0
    model.train()
    for e in range(epochs):
        perm = torch.randperm(n, generator=gen)
        done = 0
        qi = 0
        for i in range(0, n, B):
            idx = perm[i:i + B]
            for g_ in opt.param_groups:
                g_["lr"] = lr_at(e, step)
            opt.zero_grad(set_to_none=True)
            data.loss(model, tuple(t[idx] for t in data.train)).backward()
            opt.step()
            step += 1
            done += len(idx)
            while qi < 3 and done >= quarter[qi]:
                evals.append((e + (qi + 1) / 4, data.accuracy(model)))
                qi += 1
        evals.append((e + 1.0, data.accuracy(model)))
        losses.append(data.train_loss(model))
        if measure_h:
            hs.append(headroom(model, data, probe, lr_at(e + 1, step), opt, spec.optimizer))
    return {"B": B, "rule": rule, "seed": seed, "epochs": epochs, "evals": evals, "losses": losses, "h": hs,
            "final": evals[-1][1], "loss": losses[-1], "steps": step}


def reached(r: dict, target: float) -> float:
    """The first evaluation (in epochs) at or above the target; inf if none."""
    return next((t for t, a in r["evals"] if a >= target - 1e-12), math.inf)


def med(v):
    v = [x for x in v if not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(v) if v else math.nan


def task_section(name: str, seeds: list[int], quick: bool, out: dict, grid: tuple[int, ...] = GRID) -> None:
    spec = SPECS[name]
    if quick:
        spec = Spec(spec.name, spec.optimizer, spec.lr0, 3, spec.lm)
    data = Data(name, quick)
    pg = torch.Generator().manual_seed(12345)
    pidx = torch.randperm(data.n, generator=pg)[:PROBE]
    probe = tuple(t[pidx] for t in data.train)
    grid = (256,) if quick else grid
    t0 = time.perf_counter()
    runs: dict[tuple[int, str], list[dict]] = {}
    for s in seeds:
        runs.setdefault((SMALL, "none"), []).append(run(data, spec, SMALL, "none", s, probe, measure_h=True))
        for B in grid:
            for rule in ("sqrt", "linear"):
                runs.setdefault((B, rule), []).append(run(data, spec, B, rule, s, probe, measure_h=B == 256))
    base = runs[(SMALL, "none")]
    k = max(1, round(TARGET_AT * spec.epochs))
    mid = statistics.median(next(a for t, a in r["evals"] if t == float(k)) for r in base)
    finals = [r["final"] for r in base]
    plateau = statistics.median(finals) - 2 * (statistics.stdev(finals) if len(finals) > 1 else 0.0)
    print(f"\n== {name}: {data.n} training samples, {spec.epochs} epochs, {spec.optimizer} lr0 {spec.lr0:g}, seeds "
          f"{seeds}; targets: mid {100 * mid:.2f}% (fixed-32's median after {k} epochs), plateau {100 * plateau:.2f}% "
          f"(its median final {100 * statistics.median(finals):.2f}% less 2 sd); {time.perf_counter() - t0:.0f} s")
    print(f"{'config':<16} {'final acc % med [min,max]':<26} {'train loss':>10} {'epochs to mid':>14} "
          f"{'to plateau':>11} {'steps':>6}")
    for (B, rule), rs in runs.items():
        accs = [100 * r["final"] for r in rs]
        print(f"fixed-{B}-{rule:<8} {med(accs):6.2f} [{min(accs):.2f},{max(accs):.2f}]{'':<8} "
              f"{med([r['loss'] for r in rs]):>10.4f} {med([reached(r, mid) for r in rs]):>14.2f} "
              f"{med([reached(r, plateau) for r in rs]):>11.2f} {rs[0]['steps']:>6}")
    bstar = {}
    for tname, tgt in (("mid", mid), ("plateau", plateau)):
        meets = [B for B in grid if any(sum(reached(r, tgt) < math.inf for r in runs[(B, rule)]) * 2 >= len(seeds)
                                        for rule in ("sqrt", "linear"))]
        ok32 = sum(reached(r, tgt) < math.inf for r in base) * 2 >= len(seeds)
        bstar[tname] = max(meets) if meets else (SMALL if ok32 else 0)
    early = [e for e in range(1, spec.epochs + 1) if e <= EARLY * spec.epochs]
    h32 = med([med([r["h"][e] for e in early]) for r in base])
    h256 = med([med([r["h"][e] for e in early]) for r in runs[(256, "linear")]])
    print("h per epoch end (index 0 = before training), median over seeds:")
    for key in ((SMALL, "none"), (256, "sqrt"), (256, "linear")):
        rs = runs[key]
        traj = [med([r["h"][i] for r in rs]) for i in range(len(rs[0]["h"]))]
        print(f"  fixed-{key[0]}-{key[1]}: " + ", ".join(f"{x:.2f}" for x in traj))
    c = {t: (bstar[t] / SMALL) / h32 if h32 > 0 and bstar[t] else math.nan for t in bstar}
    print(f"B* (largest B meeting the target): mid {bstar['mid']}, plateau {bstar['plateau']}; h32_early {h32:.2f} "
          f"(epoch ends {early[0]}..{early[-1]}); c = (B*/32)/h32_early: mid {c['mid']:.2f}, "
          f"plateau {c['plateau']:.2f}; h256-linear early {h256:.2f}")
    l32, l256 = med([r["loss"] for r in base]), med([r["loss"] for r in runs[(256, "linear")]])
    l256s = med([r["loss"] for r in runs[(256, "sqrt")]])
    a32, a256 = med([r["final"] for r in base]), med([r["final"] for r in runs[(256, "linear")]])
    a256s = med([r["final"] for r in runs[(256, "sqrt")]])
    print(f"generalisation: final train loss 32 {l32:.4f}, 256-linear {l256:.4f}, 256-sqrt {l256s:.4f}; test acc "
          f"32 {100 * a32:.2f}%, 256-linear {100 * a256:.2f}%, 256-sqrt {100 * a256s:.2f}%")
    pairs = [(r2["loss"] - r1["loss"], 100 * (r2["final"] - r1["final"]))
             for r1, r2 in zip(base, runs[(256, "linear")])]
    both = sum(dl <= 0 and da < 0 for dl, da in pairs)
    print("  paired by seed, 256-linear minus 32 (train loss, test acc points): "
          + ", ".join(f"({dl:+.4f}, {da:+.2f})" for dl, da in pairs)
          + f"; seeds with a lower-or-equal train loss and a lower test accuracy: {both}/{len(pairs)}")
    o = out.setdefault(name, {})
    o["gen_gap_seeds"] = f"{both}/{len(pairs)}"
    o.update(mid=100 * mid, plateau=100 * plateau, bstar_mid=bstar["mid"], bstar_plateau=bstar["plateau"],
             h32_early=h32, c_mid=c["mid"], c_plateau=c["plateau"], h256_early=h256, loss32=l32, loss256=l256,
             acc32=100 * a32, acc256=100 * a256)
    if name == "digits":
        twice = [run(data, spec, 256, "linear", s, probe, epochs=2 * spec.epochs) for s in seeds]
        rm = sum(reached(r, mid) < math.inf for r in twice)
        rp = sum(reached(r, plateau) < math.inf for r in twice)
        accs = [100 * r["final"] for r in twice]
        one = runs[(256, "linear")]
        print(f"updates: fixed-256-linear over {2 * spec.epochs} epochs ({twice[0]['steps']} steps): final "
              f"{med(accs):.2f}% [{min(accs):.2f},{max(accs):.2f}], train loss {med([r['loss'] for r in twice]):.4f}; "
              f"reaches mid {rm}/{len(seeds)}, plateau {rp}/{len(seeds)} (over {spec.epochs} epochs: mid "
              f"{sum(reached(r, mid) < math.inf for r in one)}/{len(seeds)}, plateau "
              f"{sum(reached(r, plateau) < math.inf for r in one)}/{len(seeds)}, final "
              f"{med([100 * r['final'] for r in one]):.2f}%)")
        o.update(x2_mid=f"{rm}/{len(seeds)}", x2_plateau=f"{rp}/{len(seeds)}", acc256x2=med(accs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="shapes,digits,seq,cnn", help=f"comma-separated, of {','.join(SPECS)}")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per configuration (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: small data, 3 epochs, B in {32, 256}, 1 seed")
    ap.add_argument("--grid", default=",".join(map(str, GRID)),
                    help="the fixed B beside 32 (default 64,128,256,512; 256 is always run: h is logged on it)")
    args = ap.parse_args()
    names = [t for t in args.tasks.split(",") if t]
    bad = [t for t in names if t not in SPECS]
    if bad:
        raise SystemExit(f"adaptive_experiments: --tasks {','.join(bad)}: valid tasks are {','.join(SPECS)}")
    if args.seeds < 1:
        raise SystemExit(f"adaptive_experiments: --seeds {args.seeds}: must be at least 1")
    try:
        grid = tuple(sorted({int(b) for b in args.grid.split(",") if b} | {256}))
    except ValueError:
        raise SystemExit(f"adaptive_experiments: --grid {args.grid!r}: a comma-separated list of batch sizes") from None
    if any(b <= SMALL for b in grid):
        raise SystemExit(f"adaptive_experiments: --grid {args.grid!r}: every B must be above {SMALL}")
    torch.set_num_threads(1)
    seeds = list(range(1 if args.quick else args.seeds))
    out: dict = {}
    t0 = time.perf_counter()
    for name in names:
        task_section(name, seeds, args.quick, out, grid)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s (contended machine; no figure here is a time)")
    hs = {t: o["h32_early"] for t, o in out.items()}
    order_h = sorted(hs, key=lambda t: -hs[t])
    print(f"tasks by h32_early (high first): {', '.join(order_h)}; by B* (mid): "
          f"{', '.join(sorted(out, key=lambda t: -out[t]['bstar_mid']))}")
    cfit: dict[str, str] = {}
    for tname in ("mid", "plateau"):
        # B* = the largest grid B with B / 32 <= c h (the next doubling fails): c in [B*/32/h, 2 B*/32/h) per task
        # (a grid of doublings; B* = 32 or a gap in the grid: the bound is that of the next doubling all the same)
        lo, hi = 0.0, math.inf
        for o in out.values():
            b, h = o[f"bstar_{tname}"], o["h32_early"]
            if b >= max(grid) or not (h > 0 and math.isfinite(h)) or not b:
                continue                   # the largest grid B met: no upper bound from this task
            lo, hi = max(lo, b / SMALL / h), min(hi, 2 * b / SMALL / h)
        print(f"one constant c for the {tname} target (B* = the largest grid B with B/32 <= c h32_early): "
              + (f"c in [{lo:.2f}, {hi:.2f}) fits every task" if lo < hi else
                 f"none fits every task (the tasks ask c >= {lo:.2f} and c < {hi:.2f})"))
        cfit[tname] = f"{lo:.2f}-{hi:.2f}" if lo < hi else "none"
    fields = []
    for t, o in out.items():
        for k, v in o.items():
            fields.append(f"{t}_{k}={v:.4g}" if isinstance(v, float) else f"{t}_{k}={v}")
    print(" ".join(fields) + f" c_fit_mid={cfit['mid']} c_fit_plateau={cfit['plateau']} seeds={len(seeds)}",
          flush=True)



if __name__ == "__main__":
    main()
