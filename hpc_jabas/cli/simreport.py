"""`hpc-jabas report SIM_DIR`: a simulation (`hpc-jabas simulate ... --out SIM_DIR`) drawn like a run.

Reads SIM_DIR/simulation.json and writes, into SIM_DIR (or --out DIR):

- ``b_lr.png``: every strategy's global batch B and lr scale over simulated time (the first job's queue
  wait included: a line starts when its job starts);
- ``allocation.png``: per strategy, the GPUs of each partition in every epoch (moves marked);
- ``cost.png``: the cost of every epoch, and the cumulative cost over simulated time;
- ``throughput.png``: per strategy, the samples/s each GPU type delivers in every epoch (the epoch's
  samples/s times the type's share of each batch, ``Simulation.type_shares``);
- the Markdown summary (``SUMMARY``): the comparison (totals relative to the SimiGrad row) and the pictures.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc_jabas.errors import ConfigError

PNGS = ("b_lr.png", "allocation.png", "cost.png", "throughput.png")
SUMMARY = "summary" + ".md"      # written, not a document of the repository: spelt in two for the docs check
BASE = "simigrad"


def is_simulation(path: str | Path) -> bool:
    p = Path(path)
    return (p / "simulation.json").is_file() and not (p / "metrics.jsonl").exists() if p.is_dir() \
        else p.name.endswith(".json") and p.is_file()


def load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    f = p / "simulation.json" if p.is_dir() else p
    from hpc_jabas.core.config.textfile import read_json
    doc = read_json(f, "simulation", "the simulation.json in the --out DIR of hpc-jabas simulate")
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict) or not doc["results"]:
        raise ConfigError(f"{str(f)!r} has no simulation results; give the --out DIR of hpc-jabas simulate")
    for n, r in doc["results"].items():
        if not r.get("epochs"):
            raise ConfigError(f"{str(f)!r}: strategy {n!r} has no epochs; nothing to draw")
    return doc


def _mix(label: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in label.split("+"):
        if ":" in part:
            k, v = part.rsplit(":", 1)
            out[k] = int(v)
    return out


def _grid(plt: Any, n: int, height: float = 2.2) -> tuple[Any, list[Any]]:
    cols = 2 if n > 1 else 1
    rows = math.ceil(n / cols)
    fig, ax = plt.subplots(rows, cols, figsize=(11, 0.6 + height * rows), squeeze=False)
    flat = [a for row in ax for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def draw(doc: dict[str, Any], out: Path) -> list[Path]:
    """The four pictures (PNGS) of a simulation's results into ``out``: B and lr over time, the allocation
    per epoch, the cost per epoch and cumulated, the throughput per GPU type; their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = doc["results"]
    colors = {n: f"C{i % 10}" for i, n in enumerate(res)}
    out.mkdir(parents=True, exist_ok=True)
    title = f"{doc.get('cluster', 'cluster')} / {doc.get('job', 'job')}"
    paths = []
    for png, picture in zip(PNGS, (_batch_and_lr, _allocation, _cost, _throughput)):
        fig = picture(plt, res, colors, title)
        fig.tight_layout()
        paths.append(out / png)
        fig.savefig(paths[-1], dpi=80)
        plt.close(fig)
    return paths


def _over_time(fig: Any, ax: Any, title: str, top: str, bottom: str) -> Any:
    """A two-panel figure's labels: the top panel's y label and the runs' legend; the bottom panel over
    simulated time."""
    ax[0].set_ylabel(top)
    ax[0].legend(fontsize=8, ncol=2)
    ax[1].set_xlabel("simulated time (h)")
    ax[1].set_ylabel(bottom)
    fig.suptitle(title)
    return fig


def _batch_and_lr(plt: Any, res: dict[str, Any], colors: dict[str, str], title: str) -> Any:
    """B and lr over simulated time."""
    fig, ax = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for n, r in res.items():
        tl = r.get("timeline") or [[0.0, 0, r["epochs"][0]["B_start"], r["epochs"][0]["lr_scale"]]]
        end = r["totals"]["time_s"] / 3600
        xs = [p[0] / 3600 for p in tl] + [end]
        ax[0].step(xs, [p[2] for p in tl] + [tl[-1][2]], where="post", color=colors[n], label=n, lw=1.2)
        ax[1].step(xs, [p[3] for p in tl] + [tl[-1][3]], where="post", color=colors[n], lw=1.2)
    ax[0].set_yscale("log", base=2)
    return _over_time(fig, ax, f"{title}: B and lr over time", "global batch B", "lr scale")


def _per_run(plt: Any, res: dict[str, Any], of: Callable[[dict[str, Any]], dict[str, Any]], ylabel: str,
             draw: Callable[[Any, list[int], str, list[Any], str], None]) -> tuple[Any, list[Any]]:
    """One panel per run, one colour per key that ``of(epoch)`` maps to a value (the keys of every run's epochs):
    ``draw(panel, epochs, key, values, colour)`` for each key with a non-zero value in the run."""
    keys = sorted({k for r in res.values() for e in r["epochs"] for k in of(e)})
    colour = {k: f"C{i % 10}" for i, k in enumerate(keys)}
    fig, axs = _grid(plt, len(res))
    for a, n in zip(axs, res):
        eps = res[n]["epochs"]
        x = [e["epoch"] for e in eps]
        for k in keys:
            ys = [of(e).get(k, 0) for e in eps]
            if any(ys):
                draw(a, x, k, ys, colour[k])
        a.set_ylabel(ylabel)
        a.set_xticks(x)
    return fig, axs


def _allocation(plt: Any, res: dict[str, Any], colors: dict[str, str], title: str) -> Any:
    """GPUs per partition and epoch, one panel per run; dashed: a move after the epoch."""
    bottoms: dict[int, list[int]] = {}

    def stack(a: Any, x: list[int], part: str, h: list[Any], c: str) -> None:
        b = bottoms.setdefault(id(a), [0] * len(x))
        a.bar(x, h, bottom=b, color=c, width=0.9, label=part)
        bottoms[id(a)] = [u + v for u, v in zip(b, h)]
    fig, axs = _per_run(plt, res, lambda e: _mix(e["mix"]), "GPUs", stack)
    for a, n in zip(axs, res):
        for e in res[n]["epochs"]:
            if e.get("restart"):
                a.axvline(e["epoch"] + 0.5, color="k", lw=0.8, ls="--")
        k = res[n]["totals"]["restarts"]
        a.set_title(f"{n}: {k} move{'' if k == 1 else 's'}", fontsize=9)
        a.legend(fontsize=6, loc="upper left", ncol=4)
    fig.suptitle(f"{title}: allocation per epoch (dashed: a move after the epoch)")
    return fig


def _cost(plt: Any, res: dict[str, Any], colors: dict[str, str], title: str) -> Any:
    """The cost of each epoch, and the cumulative cost over simulated time."""
    fig, ax = plt.subplots(2, 1, figsize=(11, 7))
    for n, r in res.items():
        eps = r["epochs"]
        ax[0].plot([e["epoch"] for e in eps], [e["cost"] for e in eps], ".-", color=colors[n], label=n, lw=1)
        cum, c = [0.0], 0.0
        for e in eps:
            c += e["cost"]
            cum.append(c)
        ax[1].step([0.0] + [e["wall_s"] / 3600 for e in eps], cum, where="post", color=colors[n], lw=1.2)
    ax[0].set_xlabel("epoch")
    ax[0].set_xticks(sorted({e["epoch"] for r in res.values() for e in r["epochs"]}))
    return _over_time(fig, ax, f"{title}: cost per epoch (restarts' cost in the totals only)", "cost of the epoch",
                      "cumulative cost (epochs)")


def _throughput(plt: Any, res: dict[str, Any], colors: dict[str, str], title: str) -> Any:
    """Samples per second per GPU type and epoch (dashed: all), one panel per run."""
    fig, axs = _per_run(plt, res, lambda e: e.get("by_type", {}), "samples/s",
                        lambda a, x, g, ys, c: a.plot(x, ys, ".-", color=c, label=g, lw=1))
    for a, n in zip(axs, res):
        eps = res[n]["epochs"]
        a.plot([e["epoch"] for e in eps], [e.get("samples_per_s", 0.0) for e in eps], "k--", lw=0.8, label="all")
        a.set_title(n, fontsize=9)
        a.legend(fontsize=6, loc="upper left", ncol=3)
    fig.suptitle(f"{title}: throughput per GPU type and epoch")
    return fig


def summary(doc: dict[str, Any]) -> str:
    res = doc["results"]
    base = res.get(BASE, {}).get("totals")
    lines = [f"# Simulation: {doc.get('job', 'job')} on {doc.get('cluster', 'cluster')}", "",
             f"{doc.get('epochs', '?')} epochs, seed {doc.get('seed', '?')}. Totals (queue waits and restarts "
             f"included); x: relative to the {BASE} row." if base else
             f"{doc.get('epochs', '?')} epochs, seed {doc.get('seed', '?')}. Totals (queue waits and restarts "
             "included).", "",
             "| strategy | time h | cost | GPU-h | restarts | queue wait h | epochs | final mix |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(n: str, k: str, scale: float = 1.0, fmt: str = ".2f") -> str:
        v = float(res[n]["totals"][k])
        s = format(v / scale, fmt)
        if base and float(base[k]):
            s += f" (x{v / float(base[k]):.2f})"
        return s
    for n, r in res.items():
        tt = r["totals"]
        lines.append(f"| {n} | {cell(n, 'time_s', 3600)} | {cell(n, 'cost')} | {cell(n, 'gpu_hours', fmt='.1f')} | "
                     f"{tt['restarts']} | {float(tt['queue_wait_s']) / 3600:.2f} | {tt['epochs']} | "
                     f"{tt['final_mix']} |")
    lines.append("")
    for png, what in zip(PNGS, ("B and lr over time", "allocation per epoch", "cost per epoch",
                                "throughput per GPU type")):
        lines += [f"![{what}]({png})", ""]
    return "\n".join(lines)


def render(sim_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    doc = load(sim_dir)
    src = Path(sim_dir)
    out = Path(out_dir) if out_dir else (src if src.is_dir() else src.parent)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; for a simulation give a directory for the PNGs")
    try:
        paths = draw(doc, out)
        (out / SUMMARY).write_text(summary(doc) + "\n")
    except OSError as e:
        raise ConfigError(f"cannot write the report to {str(out)!r}: {e.strerror or e}") from None
    return paths + [out / SUMMARY]
