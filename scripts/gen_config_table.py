"""Regenerate the configuration table in docs/config.md from the config's fields.

    .venv/bin/python scripts/gen_config_table.py            # rewrite docs/config.md
    .venv/bin/python scripts/gen_config_table.py --check    # exit 1 if docs/config.md's table is stale

The table sits between the two markers below; everything outside them is left as it is. The rows come from the
keys' one definition (``hpc_jabas.core.config.sections.all_fields()``: JobConfig's fields, each with its section as
metadata, then AutoscaleConfig's): one per key, with its section, key, type, default and meaning.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc_jabas.core.config.schema import default_text, type_name  # noqa: E402
from hpc_jabas.core.config.sections import all_fields  # noqa: E402
from hpc_jabas.errors import ConfigError  # noqa: E402

README_START = "<!-- config-reference:start (generated: scripts/gen_config_table.py) -->"
README_END = "<!-- config-reference:end -->"


def config_reference() -> str:
    """Markdown table of every key: section, key, type, default, help (docs/config.md's table)."""
    rows = ["| section | key | type | default | meaning |", "|---|---|---|---|---|"]
    for s, f, tp in all_fields():
        m = f.metadata
        kind = type_name(tp) if not m["choices"] else " / ".join(f"`{c}`" for c in m["choices"])
        shown = m["shown"] if f.default is None else None
        default = shown or f"`{default_text(f)}`"
        rows.append(f"| `[{s}]` | `{f.name}` | {kind.replace('|', '&#124;')} | {default} | "
                    f"{m['help'].replace('|', '&#124;')} |")
    return "\n".join(rows) + "\n"


def replace_reference(text: str) -> str:
    """``text`` (docs/config.md) with the table between the reference markers regenerated."""
    head, sep, rest = text.partition(README_START)
    _, sep2, tail = rest.partition(README_END)
    if not sep or not sep2:
        raise ConfigError(f"README has no {README_START!r} ... {README_END!r} markers")
    return f"{head}{README_START}\n{config_reference()}{README_END}{tail}"


#: the document that holds the table
TARGET = ROOT / "docs/config.md"


def update_readme(path: str | Path = TARGET) -> bool:
    """Rewrite the configuration table in the document at ``path`` (docs/config.md); True if it changed."""
    p = Path(path)
    text = p.read_text()
    new = replace_reference(text)
    if new != text:
        p.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("readme", nargs="?", default=str(TARGET), help="the document (default: docs/config.md)")
    ap.add_argument("--check", action="store_true", help="only say whether the table is stale (exit code 1)")
    args = ap.parse_args(argv)
    try:
        if args.check:
            text = Path(args.readme).read_text()
            stale = replace_reference(text) != text
            print(f"{args.readme}: configuration table is {'stale' if stale else 'up to date'}")
            return int(stale)
        print(f"{args.readme}: {'rewritten' if update_readme(args.readme) else 'already up to date'}")
    except (ConfigError, OSError) as e:
        print(f"gen_config_table: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
