"""The README's simulation section shows what its command gives: the table is the one the command prints
now (the simulation runs again here, with the README's own arguments), and the pictures it shows are the
files `hpc-jabas report` writes for a simulation, kept in docs/img/sim-a/."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from hpc_jabas.cli.main import main
from hpc_jabas.cli.simreport import PNGS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _simulate_block() -> tuple[list[str], str]:
    """(the README's `hpc-jabas simulate` arguments, the text block that follows that command's block)."""
    blocks = [(m.group(1), m.group(2), m.end()) for m in FENCED.finditer(README)]
    k = next(i for i, (lang, text, _) in enumerate(blocks) if lang == "bash" and "hpc-jabas simulate " in text)
    cmd = next(ln for ln in blocks[k][1].splitlines() if ln.startswith("hpc-jabas simulate "))
    lang, table, _ = blocks[k + 1]
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
        "the README's simulation table is stale: paste the table the command prints now")
    assert len(table.splitlines()) == 2 + 8                       # header, rule, the eight strategies


def test_the_readme_pictures_are_the_reports_files():
    shown = re.findall(r"!\[[^\]]*\]\((docs/img/sim-a/[^)]+)\)", README)
    assert [Path(p).name for p in shown] == list(PNGS), shown
    for p in shown:
        data = (ROOT / p).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, p
