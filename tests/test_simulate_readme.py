"""docs/simulator.md's first simulation (moved there from the README, and run by tests/test_readme.py) shows
what its command gives: the table is the one the command prints now (the simulation runs again here, with the
document's own arguments), and the pictures it shows are the files `hpc-jabas report` writes for a simulation,
kept in docs/img/sim-a/; and the GNMT-like job's figures in docs/simulator.md are what the simulation gives
now."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from hpc_jabas.cli.main import main
from hpc_jabas.cli.simreport import PNGS

ROOT = Path(__file__).resolve().parents[1]
SIMULATOR = ROOT / "docs/simulator.md"
README = SIMULATOR.read_text()          # the document that shows the simulation (the README points to it)
FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _simulate_block() -> tuple[list[str], str]:
    """(the document's `hpc-jabas simulate` arguments, the text block that follows that command's block)."""
    blocks = [(m.group(1), m.group(2)) for m in FENCED.finditer(README)]
    k = next(i for i, (lang, text) in enumerate(blocks) if lang == "bash" and "hpc-jabas simulate " in text)
    cmd = next(ln for ln in blocks[k][1].splitlines() if ln.startswith("hpc-jabas simulate "))
    lang, table = blocks[k + 1]
    assert lang == "text", "the simulate block is followed by its table"
    return shlex.split(cmd)[2:], table


def test_the_readme_table_is_what_the_simulation_prints_now(tmp_path, monkeypatch):
    args, table = _simulate_block()
    out = tmp_path / "sim"
    i = args.index("--out")
    args[i + 1] = str(out)
    monkeypatch.chdir(ROOT)
    assert main(["simulate", *args]) == 0
    assert (out / "table.txt").read_text().rstrip("\n") == table.rstrip("\n"), (
        "docs/simulator.md's simulation table is stale: paste the table the command prints now")
    assert len(table.splitlines()) == 2 + 8                       # header, rule, the eight strategies


def test_the_readme_pictures_are_the_reports_files():
    shown = re.findall(r"!\[[^\]]*\]\((img/sim-a/[^)]+)\)", README)       # relative to docs/
    assert [Path(p).name for p in shown] == list(PNGS), shown
    for p in shown:
        data = (SIMULATOR.parent / p).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, p


def _gnmt_rows() -> list[list[str]]:
    """The cells of docs/simulator.md's GNMT table (two rows: with and without the queue waits)."""
    doc = (ROOT / "docs/simulator.md").read_text()
    part = doc[doc.index("### A GNMT-like job"):]
    rows = [ln for ln in part.splitlines() if ln.startswith("| `examples/sim/cluster_a.toml`") or
            ln.startswith("| the same without queue waits")]
    assert len(rows) == 2, rows
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows]


def test_the_gnmt_figures_in_docs_are_what_the_simulation_gives_now(tmp_path):
    from hpc_jabas.core.sim.simconfig import load_cluster, load_job
    from hpc_jabas.core.sim.simulate import Simulation
    text = (ROOT / "examples" / "sim" / "cluster_a.toml").read_text()
    nowait = tmp_path / "cluster_a_nowait.toml"
    nowait.write_text("".join(ln for ln in text.splitlines(True) if not ln.lstrip().startswith("wait = ")))
    assert "wait = " in text and "wait = " not in nowait.read_text()
    job = load_job(str(ROOT / "examples" / "sim" / "job_gnmt.toml"))
    for cells, cluster in zip(_gnmt_rows(), (ROOT / "examples" / "sim" / "cluster_a.toml", nowait), strict=True):
        res = Simulation(load_cluster(str(cluster)), job).compare(["simigrad", "jabas"])
        sg, jb = res["simigrad"].totals, res["jabas"].totals
        assert cells[1] == f"{sg['time_s'] / 3600:.2f} h" and cells[2] == f"{jb['time_s'] / 3600:.2f} h", cells
        assert cells[3].startswith(f"x{jb['time_s'] / sg['time_s']:.2f} "), cells
        assert cells[4] == f"{jb['restarts']}, {jb['queue_wait_s'] / 3600:.2f} h".replace(", 0.00 h", ", 0 h"), cells


def test_the_gnmt_baselines_run_one_micro_batch_of_64_per_gpu(tmp_path):
    """Plain Horovod's epoch at B0 on the GNMT job is ceil(N / B0) iterations of the slowest GPU's one micro-batch
    of 64 plus the allreduce (job_gnmt.toml pins micro_batch = 64: unset, the baselines would plan in b = 1), and
    LB-BSP's speed split gives the same 16 micro-batches at B0."""
    import math

    from hpc_jabas.core.sim.simconfig import load_cluster, load_job
    from hpc_jabas.core.sim.simulate import Simulation, build_model
    cl = load_cluster(str(ROOT / "examples" / "sim" / "cluster_a.toml"))
    job = load_job(str(ROOT / "examples" / "sim" / "job_gnmt.toml"))
    job.epochs = 1
    assert job.micro_batch == 64 and job.batch == 1024 and sum(cl.capacity.values()) == 16
    m = build_model(job, cl.types)
    it = math.ceil(job.samples / job.batch)
    want = it * (max(m.t_micro(g, 64) for g in cl.types) + m.allreduce_tail(16))
    sim = Simulation(cl, job)
    for name in ("static", "lbbsp"):
        e = sim.run(name).epochs[0]
        assert e["iterations"] == it and abs(e["time_s"] - want) <= 1e-3 * want, (name, e["time_s"], want)
