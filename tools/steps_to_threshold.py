"""When did a run reach a return threshold? Reads progress.csv files.

    python tools/steps_to_threshold.py runs/a2c_s*/ --threshold 475

Prints, per run, the first progress row whose return_mean reached the
threshold (wall time and env steps), or that it never did.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path


def first_crossing(progress_csv: Path, threshold: float) -> dict[str, float] | None:
    with open(progress_csv, newline="") as file:
        for row in csv.DictReader(file):
            value = float(row["return_mean"])
            if not math.isnan(value) and value >= threshold:
                return {key: float(row[key]) for key in ("wall_time", "env_steps", "return_mean")}
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run log directories (or progress.csv files)")
    parser.add_argument("--threshold", type=float, default=475.0, help="return_mean to reach")
    args = parser.parse_args(argv)
    missed = 0
    for run in args.runs:
        path = run if run.suffix == ".csv" else run / "progress.csv"
        if not path.is_file():
            print(f"{run}: no progress.csv", file=sys.stderr)
            missed += 1
            continue
        crossing = first_crossing(path, args.threshold)
        if crossing is None:
            print(f"{run}: never reached return_mean {args.threshold}")
            missed += 1
        else:
            print(
                f"{run}: return_mean {crossing['return_mean']:.1f} at {int(crossing['env_steps'])} env steps, "
                f"{crossing['wall_time']:.1f} s"
            )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
