"""Benchmark figures that cannot drift (issue 59, item 8): every benchmark figure README.md and docs/*.md quote is
one of bench/RESULTS.md's current results, so a rerun that changes a figure fails the stale sentence.

The rule (bench/RESULTS.md's head says it too):
- The current results are the "Current results" table of bench/RESULTS.md: one row per benchmark (and per flag
  variant), holding its latest run's last line (``key=value`` figures) and, beside it, that run's spreads,
  intervals, goals and notes. Earlier runs' figures live in the run log below the table; a clause of a row that
  names another run's tree ("the run before, 98c8ade: 1.080"; clauses end at ";") is not a current figure.
- A paragraph (or list item) of README.md or docs/*.md that names a benchmark (``bench.NAME``, ``bench/NAME.py``)
  quotes only current figures of the benchmarks it names: each decimal number in it (and each integer of ms, x
  or %; whole seconds are too often settings, timeouts and limits) equals a number of one of their rows at the
  decimals it shows (a percentage: the row's fraction x 100 too). ``key=value`` in backticks must be that key's
  value in a row.
- Not checked, because they are not current results: a number after "goal" (the goal), a setting written as a
  ratio (``1 : 0.5 : 0.25``), a confidence level ("90% bootstrap intervals"), code in backticks other than
  ``key=value``, and a sentence pinned to a run of the log by naming its tree (a commit, e.g. "tree 6d57328") or
  its date ("2026-12-06"): its figures are that run's, true for good. A sentence that states how things are today
  names neither, and is checked.
- Pages with known stale figures that another change rewrites are listed in ``PENDING``; the list may only shrink
  (a listed page that passes fails the test, so it is taken off).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/RESULTS.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCHES = {p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__"}

ROW = re.compile(r"^\|\s*`bench\.([a-z_]+)(?: [^`]*)?`\s*\|(.*)$")
NUMBER = re.compile(r"(?<![\w.])(\d+(?:,\d{3})*(?:\.\d+)?)(%|x\b| ?ms\b| s\b)?")
KEYVAL = re.compile(r"`([a-z][a-z0-9_]*)=([-\d.]+|inf)`")
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`*\[])")
NAMED = re.compile(r"bench[./]([a-z_]+)")
PINNED = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b|\b20\d\d-\d\d-\d\d\b")
SKIP = [re.compile(r"\bgoals? (?:of )?[\d.]+"),                       # a goal
        re.compile(r"\d+% (?:bootstrap )?(?:confidence )?intervals?"),  # a confidence level
        re.compile(r"\d+(?:\.\d+)?(?: : \d+(?:\.\d+)?)+"),             # a setting: a ratio of speeds
        re.compile(r"`(?![a-z][a-z0-9_]*=)[^`]*`")]                  # code that is not key=value


def current_rows(text: str) -> dict[str, list[str]]:
    """benchmark module -> the text of its current rows (its flag variants' rows too)."""
    head = text[text.index("## Current results"):text.index("## Run log")]
    rows: dict[str, list[str]] = {}
    for line in head.splitlines():
        m = ROW.match(line)
        if m:
            rows.setdefault(m.group(1), []).append(m.group(2))
    return rows


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph and each list item."""
    out: list[tuple[int, str]] = []
    start, cur = 0, []
    for i, line in enumerate([*text.splitlines(), ""], 1):
        if not line.strip() or line.lstrip().startswith(("- ", "* ", "|", "#")) and cur:
            if cur:
                out.append((start, " ".join(cur)))
            cur = []
            if not line.strip():
                continue
        if not cur:
            start = i
        cur.append(line.strip())
    return out


def _value(text: str) -> float:
    return float(text.replace(",", ""))


def matches(quoted: str, unit: str, pool: list[float]) -> bool:
    """Whether the quoted figure is one of ``pool`` at the decimals it shows (a percentage: x 100 too)."""
    dec = len(quoted.split(".")[1]) if "." in quoted else 0
    v = _value(quoted)
    for x in pool:
        if abs(round(x, dec) - v) < 1e-9 or (unit == "%" and abs(round(100 * x, dec) - v) < 1e-9):
            return True
    return False


def stale_figures(pages: list[Path], rows: dict[str, list[str]], root: Path = ROOT) -> list[str]:
    """Every quote of a figure that is not among the current results of the benchmarks its paragraph names."""
    bad = []
    for page in pages:
        for line, para in paragraphs(page.read_text()):
            named = sorted({n for n in NAMED.findall(para) if n in BENCHES})
            if not named:
                continue
            where = f"{page.relative_to(root)}:{line}"
            missing = [n for n in named if n not in rows]
            if missing:
                bad.append(f"{where}: bench.{missing[0]} has no row in bench/RESULTS.md's current results")
                continue
            # a row's clause that names another run's tree ("the run before, 98c8ade: 1.080") is not current
            text = " ".join(c for n in named for r in rows[n] for c in re.split(r"[;|]", r) if not PINNED.search(c))
            pool = [_value(x) for x, _ in NUMBER.findall(text)]
            kv = dict(re.findall(r"\b([a-z][a-z0-9_]*)=([-\d.]+|inf)", text))
            body = " ".join(s for s in SENTENCE.split(para) if not PINNED.search(s))   # pinned: a run's figures
            for k, v in KEYVAL.findall(body):
                if k not in kv or (v != kv[k] and not (v != "inf" and kv[k] != "inf"
                                                       and matches(v, "", [float(kv[k])]))):
                    bad.append(f"{where}: `{k}={v}` is not in the current row (it says {k}={kv.get(k)})")
            for rx in SKIP:
                body = rx.sub(" ", body)
            for m in NUMBER.finditer(body):
                q, unit = m.group(1), (m.group(2) or "").strip()
                if "." not in q and unit in ("", "s"):
                    continue                     # a count (seeds, GPUs, epochs) or whole seconds: a setting
                if not matches(q, unit, pool):
                    bad.append(f"{where}: {q}{unit} is not a figure of the current row of "
                               f"{', '.join('bench.' + n for n in named)}")
    return bad


#: pages with stale figures known on 2026-12-07, each rewritten by another change: they may only leave the list
PENDING = {
    "docs/adaptive.md": "its figures quote earlier runs unpinned; its adaptive figures are being rewritten",
    "docs/formulas.md": "sections 3-4 quote earlier runs of bench/adaptive_tta.py unpinned",
    "docs/training.md": "quotes earlier runs of bench/perfmodel_error.py and bench/adaptive_tta.py unpinned",
}


def test_every_quoted_benchmark_figure_is_a_current_result():
    bad = stale_figures(PAGES, current_rows(RESULTS.read_text()))
    now = [b for b in bad if b.split(":")[0] not in PENDING]
    assert not now, "stale or unknown benchmark figures (the rule: tests/test_figures.py's docstring):\n" + \
        "\n".join(now)
    fixed = sorted(set(PENDING) - {b.split(":")[0] for b in bad})
    assert not fixed, f"{fixed} quote only current figures now: take them off PENDING"


def test_every_benchmark_has_one_current_row_per_variant():
    rows = current_rows(RESULTS.read_text())
    assert set(rows) <= BENCHES and {"straggler", "adaptive_tta", "overhead", "measure_cost"} <= set(rows)
    for name, rs in rows.items():
        assert all(re.search(r"[a-z_]+=", r) or "no run" in r for r in rs), name


@pytest.fixture
def page(tmp_path):
    """A page with ``text`` checked against one made-up row of bench.overhead: its complaints."""
    rows = {"overhead": ["`fit_vs_ddp=1.150 goodput=0.262` (min/max 1.021-1.343; goal 1.05; the run before, "
                         "98c8ade: 1.080) | 2026 | abc1234 |"]}

    def check(text: str) -> list[str]:
        p = tmp_path / "page.txt"
        p.write_text(text)
        return stale_figures([p], rows, root=tmp_path)
    return check


def test_the_check_sees_a_stale_figure_and_passes_current_ones(page):
    assert page("`bench.overhead`: fit at 1.15 of DDP (1.021-1.343), 26.2% of it; goal 1.05.\n") == []
    assert page("`bench.overhead`: `fit_vs_ddp=1.150`, speeds 1 : 0.5 : 0.25, `lr = 0.3`.\n") == []
    assert page("bench.overhead ran on tree 6d57328: 1.070. Now 1.07, with 90% bootstrap intervals.\n") == [
        "page.txt:1: 1.07 is not a figure of the current row of bench.overhead"]
    assert page("The overhead (bench/overhead.py) was\nmeasured at 1.07-1.08 of DDP.\n") == [
        "page.txt:1: 1.07 is not a figure of the current row of bench.overhead",
        "page.txt:1: 1.08 is not a figure of the current row of bench.overhead"]
    assert page("bench.overhead on tree 6d57328: `fit_vs_ddp=1.080`.\n") == []
    assert page("`bench.overhead`: `fit_vs_ddp=1.080`.\n") == [
        "page.txt:1: `fit_vs_ddp=1.080` is not in the current row (it says fit_vs_ddp=1.150)",
        "page.txt:1: 1.080 is not a figure of the current row of bench.overhead"]
    assert page("bench.overhead: 52.0 s, 30 s by default.\n\nAn unrelated 9.99 paragraph.\n") == [
        "page.txt:1: 52.0s is not a figure of the current row of bench.overhead"]
    assert page("bench.planner_speed: 0.46 ms.\n") == [
        "page.txt:1: bench.planner_speed has no row in bench/RESULTS.md's current results"]
