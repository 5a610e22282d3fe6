"""The ``flare2`` command."""

from __future__ import annotations

import argparse
import sys

from flare2 import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flare2", description="flare2: a reinforcement-learning runtime.")
    parser.add_argument("--version", action="version", version=f"flare2 {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
