"""The documents whose ``bash`` and ``python`` blocks run as a test (tests/test_readme.py), in this order, in one
shell: the README, then the documents it points to for details. A later document's blocks run in the shell the
earlier ones left (the README activates ``.venv`` and starts the local Slurm cluster). A document in
:data:`WHEN_PRESENT` joins once it exists; a document without runnable blocks adds nothing until it has one. The
blocks of a document in :data:`ELSEWHERE` are run by the test named there, as the reader they are written for.

A block marked ``<!-- readme-test: skip (why) -->`` on the line right before its fence is the only kind that
does not run. Other tests read the same documents: tests/test_public_api.py (the Python blocks import nothing
deeper than ``hpc_jabas``), tests/test_simulate_readme.py (docs/simulator.md's table and pictures).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: run in this order, every one of them (the README's own blocks first)
ALWAYS = ("README.md", "slurm/local/README.md", "examples/README.md", "docs/simulator.md", "docs/adaptive.md",
          "docs/config.md", "docs/training.md", "docs/slurm.md", "docs/toolchain.md")
#: run after those, once they exist
WHEN_PRESENT = ("docs/porting.md",)
#: documents whose blocks another test runs, in the set-up they are written for (not in the README's shell)
ELSEWHERE = {"docs/cluster.md": "tests/test_nonroot.py"}      # as a new user who is not root
SHELL, PYTHON = ("bash", "sh", "shell"), ("python", "py")
DATA = ("toml", "text", "json", "console-output", "diff", "udiff")
SKIP = re.compile(r"^\s*<!--\s*readme-test:\s*skip\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")


def executed(root: Path = ROOT) -> list[str]:
    """The documents whose blocks run, in order (paths relative to ``root``)."""
    return [*ALWAYS, *(d for d in WHEN_PRESENT if (root / d).is_file())]


@dataclass
class Block:
    doc: str
    line: int          # 1-based line of the opening fence
    lang: str
    text: str
    skip: str | None   # the reason, for a marked block

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in SHELL + PYTHON and self.skip is None


def blocks(doc: str, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of ``doc``, each with the skip marker (if any) on the last non-blank line before it."""
    lines = (root / doc).read_text().splitlines()
    out: list[Block] = []
    pending: str | None = None
    i = 0
    while i < len(lines):
        ln = lines[i]
        m_skip = SKIP.match(ln)
        m = FENCE.match(ln)
        if m_skip:
            pending = m_skip.group(1).strip("() ") or "marked"
        elif m:
            start, body = i, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append(Block(doc, start + 1, m.group(1).lower(), "\n".join(body) + "\n", pending))
            pending = None
        elif ln.strip():
            pending = None          # a marker counts only right before a fence
        i += 1
    return out


def all_blocks(root: Path = ROOT) -> list[Block]:
    """Every fenced block of every executed document, in run order."""
    return [b for d in executed(root) for b in blocks(d, root)]
