"""Reading back a JSON-lines log hpc-jabas appends to (a run's ``metrics.jsonl``): every record, and a note for
every line that is not one, so that nothing is skipped silently.

The writer appends each record as one whole line in one ``write`` and, when it opens the log, sets a torn last
line aside (runtime/metrics.py). A log written before that, or one torn by a kill while it is read, can still
hold a line cut short; when a later record was appended to it (glued on the same line), that record is found
after the torn bytes and kept.
"""
from __future__ import annotations

import json
from typing import Any

_DEC = json.JSONDecoder()


def glued_record(line: str) -> tuple[int, Any] | None:
    """(where it starts, the record) of a whole JSON object that ends ``line`` after torn bytes; None if none."""
    end = len(line.rstrip())
    i = line.find("{", 1)
    while i >= 0:
        try:
            rec, j = _DEC.raw_decode(line, i)
        except ValueError:
            rec, j = None, -1
        if j == end and isinstance(rec, dict):
            return i, rec
        i = line.find("{", i + 1)
    return None


def parse(text: str, name: str = "log") -> tuple[list[Any], list[str]]:
    """(records, notes) of a JSON-lines text: one note per line that is not a whole record (``name`` and the
    line number in it): a torn line with a record glued after it (the record is kept), a torn last line of a
    writer cut short (left out) or any other line that is not JSON (left out). Blank lines are nothing."""
    recs: list[Any] = []
    notes: list[str] = []
    lines = text.split("\n")
    last_torn = not text.endswith("\n")
    for n, ln in enumerate(lines, 1):
        if not ln.strip():
            continue
        try:
            recs.append(json.loads(ln))
            continue
        except ValueError:
            pass
        glued = glued_record(ln)
        if glued is not None:
            recs.append(glued[1])
            notes.append(f"{name} line {n}: {glued[0]} torn bytes of a write cut short, then a record appended to "
                         "them: the record kept, the torn bytes left out")
        elif n == len(lines) and last_torn:
            notes.append(f"{name} line {n}: a torn last line ({len(ln)} characters, a write cut short or still "
                         "being written): left out")
        else:
            notes.append(f"{name} line {n} is not a JSON record ({len(ln)} characters): left out")
    return recs, notes
