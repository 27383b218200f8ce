"""A report and logs a user reads (issue 36, finding 9), on ONE real 2-rank mpirun run of examples/train_digits.py
(emulated, similarity policy, 2 epochs):

- the job's output: the EMULATES warning once (not once per rank), one evaluation line per epoch end (rank 0's);
- `hpc-jabas status RUN_DIR` reads the mpirun run directory (no chain);
- the report's figure (its axes and lines, not pixels): one panel per kind of data and none empty (no "iteration
  time" panel without calibration), the evaluation curve holding the epoch ends' results, the gamma line, the mix
  written at each job's start and a move labelled with its mix, legends outside the data;
- error hints name only options that exist. (A configuration error on 3 ranks is one line:
  tests/test_first_day_errors.py, the same bad GPU type on train_digits.py.)
"""
from __future__ import annotations

import ast
import json
import re
import subprocess

import pytest
from mpi_util import PY, ROOT, mpi_env

DIGITS = [PY, str(ROOT / "examples" / "train_digits.py"), "--emulate", "--epochs", "2", "--policy", "similarity",
          "--batch", "128", "--batch-min", "64", "--batch-max", "512", "--p", "4"]


def _mpirun(args: list[str], np_: int = 2) -> subprocess.CompletedProcess:
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_), *args]
    return subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=300, cwd=str(ROOT))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("report") / "run"
    p = _mpirun([*DIGITS, "--run-dir", str(d)])
    assert p.returncode == 0, p.stderr[-3000:]
    recs = [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return {"dir": d, "out": p.stdout + p.stderr, "recs": recs}


@pytest.mark.mpi
def test_warning_once_and_evaluation_in_the_log(run):
    lines = run["out"].splitlines()
    assert len([ln for ln in lines if "EMULATES" in ln]) == 1, run["out"][-3000:]
    ends = [r for r in run["recs"] if r.get("type") == "epoch_end"]
    said = [ln for ln in lines if re.search(r"epoch \d/2 end \(iteration \d+, B=\d+\): test_acc ", ln)]
    assert len(said) == 2 == len(ends), said
    for ln, r in zip(said, ends):
        assert f"epoch {r['epoch'] + 1}/2 end (iteration {r['it']}, B={r['B']}): test_acc {r['eval']['test_acc']:.4g}" \
            in ln and ln.startswith("hpc-jabas[0]"), (ln, r)


@pytest.mark.mpi
def test_status_reads_an_mpirun_run_directory(run, capsys):
    from hpc_jabas.cli.main import main
    assert main(["status", str(run["dir"])]) == 0
    out = capsys.readouterr().out
    its = [x for x in run["recs"] if x.get("type") == "iteration"]
    lines = out.splitlines()
    assert "2 rank(s) v100:2, 1 start(s), 0 resume(s)" in lines[0], out
    assert lines[1] == f"epochs done: 2 of 2, iterations: {len(its)}, B {its[0]['B']} -> {its[-1]['B']}", out
    assert lines[-1] == f"current: finished (epoch 2 of 2, iteration {len(its)})", out
    assert main(["status", str(run["dir"]), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    ends = [x for x in run["recs"] if x.get("type") == "epoch_end"]
    assert js["kind"] == "run" and js["world"] == 2 and js["eval"] == ends[-1]["eval"], js


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.mpi
def test_report_panels(run, tmp_path):
    import matplotlib.pyplot as plt

    from hpc_jabas.cli.report import figure
    recs = run["recs"]
    fig = figure(recs)
    axes = [a for a in fig.axes if a.get_label() in ("B", "lr", "statistics", "throughput", "evaluation",
                                                      "iteration time")]
    assert [a.get_label() for a in axes] == ["B", "lr", "statistics", "throughput", "evaluation"]   # no calibration
    for a in fig.axes:                           # no empty panel (twins included)
        assert any(len(ln.get_xdata()) > 0 for ln in a.get_lines()), a.get_label()
    ax = {a.get_label(): a for a in axes}
    ends = [r for r in recs if r.get("type") == "epoch_end"]
    acc = next(ln for a in fig.axes for ln in a.get_lines() if ln.get_label() == "test_acc")
    assert list(acc.get_xdata()) == [r["it"] for r in ends]
    assert list(acc.get_ydata()) == pytest.approx([r["eval"]["test_acc"] for r in ends])
    gamma = next(ln for ln in ax["statistics"].get_lines() if ln.get_label().startswith("gamma"))
    assert set(gamma.get_ydata()) == {0.1} and ax["statistics"].get_ylim()[0] <= 0.1   # the similarity default
    assert [t.get_text() for t in ax["B"].texts] == ["v100:2"]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    for a in fig.axes:
        leg = a.get_legend()
        if leg is not None:
            for b in axes:
                assert not _overlap(leg.get_window_extent(r), b.get_window_extent(r)), (a.get_label(), b.get_label())
    plt.close(fig)
    # a chain's moved job starts on another mix: a black line there, labelled with that mix
    k = ends[0]["it"]
    moved = next(r for r in recs if r.get("type") == "start")
    pos = recs.index(ends[0]) + 1
    spliced = recs[:pos] + [{**moved, "it": k, "gpu_types": ["a100", "v100"]}] + recs[pos:]
    fig = figure(spliced)
    b = next(a for a in fig.axes if a.get_label() == "B")
    assert [t.get_text() for t in b.texts] == ["v100:2", "-> a100:1+v100:1"]
    assert any(list(ln.get_xdata()) == [k, k] and ln.get_color() == "black" for ln in b.get_lines())
    plt.close(fig)


#: flags an error message names that are not hpc-jabas's: srun's, horovodrun's, and a format hint's placeholder
FOREIGN = {"--mpi", "--gloo", "--flag"}


def test_error_hints_name_only_options_that_exist():
    """Every --flag in a raised error's text is an option of hpc-jabas or of the training flags
    (hpc_jabas.add_arguments); no hint offers to drop ranks, which only `hpc-jabas plan --allow-drop` can."""
    import argparse

    import hpc_jabas
    from hpc_jabas.cli.main import build_parser
    flags: set[str] = set()

    def walk(p):
        for a in p._actions:
            flags.update(a.option_strings)
            if isinstance(a, argparse._SubParsersAction):
                for sp in a.choices.values():
                    walk(sp)
    walk(build_parser())
    ap = argparse.ArgumentParser()
    hpc_jabas.add_arguments(ap)
    walk(ap)
    assert {"--allow-drop", "--batch-min", "--time-min"} <= flags
    bad, drop = [], []
    for f in sorted((ROOT / "hpc_jabas").rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call):
                text = " ".join(c.value for c in ast.walk(n.exc) if isinstance(c, ast.Constant)
                                and isinstance(c.value, str))
                bad += [(f.name, n.lineno, m) for m in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)
                        if m not in flags | FOREIGN]
                if re.search(r"allow(ing)? dropping", text) and "--allow-drop" not in text:
                    drop.append((f.name, n.lineno))
    assert not bad and not drop, (bad, drop)
