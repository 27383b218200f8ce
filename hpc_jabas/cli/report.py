"""`hpc-jabas report RUN_DIR`: the run's trajectory as a PNG (B, lr scale, statistics, throughput, and the
perf model's predicted vs measured iteration time at every calibration round).

`hpc-jabas report SIM_DIR` (the --out DIR of `hpc-jabas simulate`, holding simulation.json): the
simulation drawn like a run, as PNGs and a Markdown summary in SIM_DIR or --out DIR (cli/simreport.py)."""
from __future__ import annotations

import json
from pathlib import Path

from hpc_jabas.errors import ConfigError
from hpc_jabas.trust import check_file


def add_parser(sub):
    p = sub.add_parser("report", help="draw B, lr, gradient statistics and throughput of a run (or a simulation)")
    p.add_argument("run_dir", help="a run directory (metrics.jsonl) or a simulation's (simulation.json)")
    p.add_argument("--out", help="PNG path (default RUN_DIR/report.png); for a simulation a directory "
                                 "(default SIM_DIR)")
    p.set_defaults(func=run)
    return p


def load_metrics(run_dir: str | Path) -> list[dict]:
    d = Path(run_dir)
    f = d / "metrics.jsonl" if d.is_dir() else d
    if not d.exists():
        raise ConfigError(f"run directory {str(d)!r} does not exist; expected a run directory that holds "
                          "metrics.jsonl (or that file)")
    if not f.exists():
        raise ConfigError(f"no metrics at {str(f)!r}; give a run directory that holds metrics.jsonl")
    check_file(f, "metrics record")
    recs = []
    from hpc_jabas.core.textfile import read_text
    for ln in read_text(f, "metrics record", "a run's metrics.jsonl (JSON lines) or its run directory").splitlines():
        try:
            recs.append(json.loads(ln))
        except json.JSONDecodeError:
            continue          # a torn last line of a killed job: skip it, keep the rest
    return recs


def draw(recs: list[dict], out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = sorted((r for r in recs if r.get("type") == "iteration"), key=lambda r: r["it"])
    if not its:
        raise ConfigError("the run has no iteration records yet; nothing to draw")
    x = [r["it"] for r in its]
    fig, ax = plt.subplots(5, 1, figsize=(9, 12), sharex=True)
    ax[0].step(x, [r["B"] for r in its], where="post", color="tab:blue")
    ax[0].set_ylabel("global batch B")
    ax[1].plot(x, [r["lr_scale"] for r in its], color="tab:orange")
    ax[1].set_ylabel("lr scale")
    st = [(r["it"], r["stats"]) for r in its if r.get("stats")]
    dec = [r for r in recs if r.get("type") == "decision"]
    if st:
        ax[2].plot([i for i, _ in st], [s["similarity"] for _, s in st], "o-", label="similarity (halves)")
    bn = [(d["at_iteration"], d["stats"].get("b_noise")) for d in dec if d.get("stats", {}).get("b_noise")]
    if bn:
        a2 = ax[2].twinx()
        a2.plot([i for i, _ in bn], [v for _, v in bn], "s--", color="tab:green", label="B_noise")
        a2.set_ylabel("B_noise")
        a2.legend(loc="upper right")
    ax[2].set_ylabel("gradient similarity")
    if st:
        ax[2].legend(loc="upper left")
    ax[3].plot(x, [r.get("samples_per_s") or 0 for r in its], color="tab:red", lw=0.8)
    ax[3].set_ylabel("samples/s")
    pe = [r for r in recs if r.get("type") == "perf_error"]      # predicted vs measured (runtime/calibrate.py)
    if pe:
        px = [r["it"] for r in pe]
        ax[4].plot(px, [r["measured_s"] for r in pe], "k.-", label="measured")
        ax[4].plot(px, [r["predicted_s"] for r in pe], "-", color="tab:purple", label="predicted (calibrated)")
        ax[4].plot(px, [r["predicted_uncalibrated_s"] for r in pe], "--", color="tab:gray", label="predicted (profile)")
        ax[4].legend(loc="upper left", fontsize=8)
    ax[4].set_ylabel("iteration s")
    ax[4].set_xlabel("iteration")
    for r in recs:
        if r.get("type") in ("epoch_end", "resume"):
            for a in ax:
                a.axvline(r["it"], color="grey", lw=0.6, ls=":" if r["type"] == "epoch_end" else "-")
    fig.suptitle("hpc-jabas run: B, lr, statistics, throughput, perf-model error (dotted: epoch ends, solid: resumes)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def run(args) -> int:
    from hpc_jabas.cli import simreport
    if simreport.is_simulation(args.run_dir):
        paths = simreport.render(args.run_dir, args.out)
        doc = simreport.load(args.run_dir)
        print(f"wrote {', '.join(str(p) for p in paths)}: {len(doc['results'])} strategies")
        return 0
    recs = load_metrics(args.run_dir)
    out = Path(args.out) if args.out else Path(args.run_dir) / "report.png"
    if out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a directory; give a PNG file path, e.g. {str(out / 'report.png')!r}")
    try:
        draw(recs, out)
    except OSError as e:
        raise ConfigError(f"cannot write the report to {str(out)!r}: {e.strerror or e}") from None
    its = [r for r in recs if r.get("type") == "iteration"]
    Bs = sorted({r["B"] for r in its})
    print(f"wrote {out}: {len(its)} iterations, B from {Bs[0]} to {Bs[-1]}, "
          f"{sum(1 for r in recs if r.get('type') == 'decision')} decisions")
    return 0
