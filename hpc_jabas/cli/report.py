"""`hpc-jabas report RUN_DIR`: the run's trajectory as a PNG: B (each job's mix written at its start, a move
labelled with the mix it moved to), lr scale, gradient statistics (with the similarity policy's gamma), throughput,
the evaluation at every epoch end (test loss, accuracy) and, when calibrated, the perf model's predicted vs measured
iteration time. A panel the run has no data for is left out.

`hpc-jabas report SIM_DIR` (the --out DIR of `hpc-jabas simulate`, holding simulation.json): the
simulation drawn like a run, as PNGs and a Markdown summary in SIM_DIR or --out DIR (cli/simreport.py)."""
from __future__ import annotations

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
    from hpc_jabas.core.config import jsonl
    from hpc_jabas.core.config.textfile import read_text
    from hpc_jabas.log import get_logger
    text = read_text(f, "metrics record", "a run's metrics.jsonl (JSON lines) or its run directory")
    recs, notes = jsonl.parse(text, str(f))      # a line that is not a record is said, not skipped silently
    for n in notes:
        get_logger(__name__).warning("%s", n)
    return recs


#: the panels a report may have, in order (a panel without data is left out: no empty panel)
PANELS = ("B", "lr", "statistics", "throughput", "evaluation", "iteration time")


def _mixes(recs: list[dict]) -> list[tuple[int, str, bool]]:
    """(iteration, mix label, resumed) of every job of the run, from its ``start`` records (the GPU types of its
    ranks; a chain's jobs each write one): a moved job starts on another mix than the job before it."""
    from collections import Counter

    from hpc_jabas.core.autoscale.scaler import mix_label
    out: list[tuple[int, str, bool]] = []
    resumes = {r.get("it") for r in recs if r.get("type") == "resume"}
    for r in recs:
        if r.get("type") == "start" and r.get("gpu_types"):
            out.append((int(r.get("it") or 0), mix_label(Counter(r["gpu_types"])), r.get("it") in resumes))
    return out


def _eval_series(recs: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(iteration, value)] from the ``epoch_end`` records' evaluation (a dict of metrics, or one
    number: "eval"); the sample count is not a metric."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in recs:
        if r.get("type") != "epoch_end" or r.get("eval") is None:
            continue
        ev = r["eval"] if isinstance(r["eval"], dict) else {"eval": r["eval"]}
        for k, v in ev.items():
            if k != "count" and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(k, []).append((int(r["it"]), float(v)))
    return out


def _test(key: str) -> str:
    """An evaluation metric's name as drawn: "test loss", "test_acc" stays."""
    return key if key.lower().startswith("test") else f"test {key}"


def _legend(ax, *more):
    """One legend for a panel (and its twin axis), outside the plot area on the right: never over the data."""
    hs, ls = [], []
    for a in (ax, *more):
        h, lab = a.get_legend_handles_labels()
        hs += h
        ls += lab
    if hs:
        ax.legend(hs, ls, loc="upper left", bbox_to_anchor=(1.09 if more else 1.01, 1.0), borderaxespad=0.0,
                  fontsize=8, frameon=False)


def _series(recs: list[dict]) -> dict:
    """What the panels draw, read from the records once: the iterations (sorted), the job's config, the
    similarity and B_noise points, the throughput, the evaluation metrics and the perf model's errors."""
    its = sorted((r for r in recs if r.get("type") == "iteration"), key=lambda r: r["it"])
    if not its:
        raise ConfigError("the run has no iteration records yet; nothing to draw")
    start = next((r for r in recs if r.get("type") == "start"), {})
    dec = [r for r in recs if r.get("type") == "decision"]
    return {
        "its": its,
        "cfg": start.get("config") or {},
        "st": [(r["it"], r["stats"]) for r in its if r.get("stats") and r["stats"].get("similarity") is not None],
        "bn": [(d["at_iteration"], d["stats"].get("b_noise")) for d in dec if (d.get("stats") or {}).get("b_noise")],
        "sps": [(r["it"], r["samples_per_s"]) for r in its if r.get("samples_per_s")],
        "ev": _eval_series(recs),
        "pe": [r for r in recs if r.get("type") == "perf_error"],     # predicted vs measured (runtime/calibrate.py)
    }


def _statistics_panel(a, st: list, bn: list, cfg: dict) -> None:
    """The similarity of the halves (with the similarity policy's gamma line) and B_noise, on a twin axis when
    both are there."""
    twins = []
    if st:
        a.plot([i for i, _ in st], [s["similarity"] for _, s in st], "o-", ms=3, label="similarity (halves)")
        if cfg.get("policy") == "similarity" and cfg.get("gamma") is not None:
            a.axhline(float(cfg["gamma"]), color="tab:gray", ls="--", lw=1.0,
                      label=f"gamma = {float(cfg['gamma']):g} (grow below, shrink above)")
        a.set_ylabel("gradient similarity")
    if bn:
        a2 = a.twinx() if st else a
        a2.plot([i for i, _ in bn], [v for _, v in bn], "s--", ms=3, color="tab:green", label="B_noise")
        a2.set_ylabel("B_noise")
        if a2 is not a:
            twins.append(a2)
    _legend(a, *twins)


def _evaluation_panel(a, ev: dict[str, list[tuple[int, float]]]) -> None:
    """The epoch ends' evaluation: losses (and other metrics) on the left, accuracies on a twin axis."""
    acc = {k: v for k, v in ev.items() if "acc" in k.lower()}
    rest = {k: v for k, v in ev.items() if k not in acc}
    for k, v in rest.items():
        a.plot([i for i, _ in v], [y for _, y in v], "o-", ms=4, label=_test(k))
    if rest:
        a.set_ylabel("/".join(_test(k) for k in rest))
    twins = []
    if acc:
        a2 = a.twinx() if rest else a
        for k, v in acc.items():
            a2.plot([i for i, _ in v], [y for _, y in v], "^-", ms=4, color="tab:green", label=_test(k))
        a2.set_ylabel("/".join(_test(k) for k in acc))
        if a2 is not a:
            twins.append(a2)
    _legend(a, *twins)


def _iteration_time_panel(a, pe: list[dict]) -> None:
    """The calibrated perf model's predicted iteration time against the measured one (and the profile's)."""
    px = [r["it"] for r in pe]
    a.plot(px, [r["measured_s"] for r in pe], "k.-", label="measured")
    a.plot(px, [r["predicted_s"] for r in pe], "-", color="tab:purple", label="predicted (calibrated)")
    a.plot(px, [r["predicted_uncalibrated_s"] for r in pe], "--", color="tab:gray", label="predicted (profile)")
    a.set_ylabel("iteration s")
    _legend(a)


def _marks(recs: list[dict], ax: dict) -> None:
    """Epoch ends (dotted) and resumes (solid) on every panel; each job's mix written at the top of the B panel
    at its start, a move (another mix than the job before) a black line on every panel and "-> MIX"."""
    for r in recs:
        if r.get("type") in ("epoch_end", "resume"):
            for a in ax.values():
                a.axvline(r["it"], color="grey", lw=0.6, ls=":" if r["type"] == "epoch_end" else "-")
    prev = None
    for it, label, resumed in _mixes(recs):
        if label == prev and resumed:
            continue                             # a requeue on the same mix: its resume line says it
        text = label if prev is None else f"-> {label}"
        if prev is not None:
            for a in ax.values():
                a.axvline(it, color="black", lw=1.0)
        ax["B"].annotate(text, xy=(it, 1.0), xycoords=("data", "axes fraction"), xytext=(2, 2),
                         textcoords="offset points", fontsize=8, va="bottom", ha="left")
        prev = label


def figure(recs: list[dict]):
    """The report's matplotlib Figure: one panel per kind of data the run has (:data:`PANELS`; each axis
    has the panel's name as its ``label``), epoch ends dotted, resumes solid, each job's mix written at its start
    ("-> MIX" at a move)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = _series(recs)
    its = d["its"]
    x = [r["it"] for r in its]
    have = {"B": True, "lr": True, "statistics": bool(d["st"] or d["bn"]), "throughput": bool(d["sps"]),
            "evaluation": bool(d["ev"]), "iteration time": bool(d["pe"])}
    names = [n for n in PANELS if have[n]]
    fig, axs = plt.subplots(len(names), 1, figsize=(11, 2.3 * len(names) + 0.8), sharex=True, squeeze=False)
    ax = dict(zip(names, axs[:, 0]))
    for n, a in ax.items():
        a.set_label(n)
    ax["B"].step(x, [r["B"] for r in its], where="post", color="tab:blue", label="B")
    ax["B"].set_ylabel("global batch B")
    ax["lr"].plot(x, [r["lr_scale"] for r in its], color="tab:orange", label="lr scale")
    ax["lr"].set_ylabel("lr scale")
    if "statistics" in ax:
        _statistics_panel(ax["statistics"], d["st"], d["bn"], d["cfg"])
    if "throughput" in ax:
        sps = d["sps"]
        ax["throughput"].plot([i for i, _ in sps], [v for _, v in sps], color="tab:red", lw=0.8, label="samples/s")
        ax["throughput"].set_ylabel("samples/s")
    if "evaluation" in ax:
        _evaluation_panel(ax["evaluation"], d["ev"])
    if "iteration time" in ax:
        _iteration_time_panel(ax["iteration time"], d["pe"])
    axs[-1, 0].set_xlabel("iteration")
    _marks(recs, ax)
    fig.suptitle(f"hpc-jabas run: {', '.join(names)} (dotted: epoch ends; solid: resumes; black: moves)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def draw(recs: list[dict], out: Path) -> Path:
    import matplotlib.pyplot as plt
    fig = figure(recs)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return out


def run(args) -> int:
    from hpc_jabas.cli import simreport
    from hpc_jabas.cli.extras import require
    require("report", "hpc-jabas report")
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
