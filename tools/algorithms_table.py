"""The Markdown table of the algorithms ``flare2 train --algo`` knows: the spaces each takes and its presets.

    python tools/algorithms_table.py

Reads every record (``flare2.zoo.registry``): the zoo's, and those of installed packages' ``flare2.algorithms``
entry points, so the table in the docs is the registry's, never a copy kept in step by hand.
"""

from __future__ import annotations

import argparse
import sys

from flare2.zoo.registry import lookup, names


def table() -> str:
    lines = ["| algorithm | observations | actions | presets (env ids, kinds of env) |", "|---|---|---|---|"]
    for name in names():
        record = lookup(name)
        ids = [f"`{env_id}`" for env_id in sorted(record.presets)]
        kinds = [f"{family} games" for family in sorted(record.family_presets)]
        presets = ", ".join(ids + kinds) or "none"
        lines.append(f"| `{name}` | {', '.join(record.observations)} | {', '.join(record.actions)} | {presets} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
