"""When did a run reach a return threshold? Reads progress.csv files.

    python tools/steps_to_threshold.py runs/a2c_s*/ --threshold 475
    python tools/steps_to_threshold.py runs/dqn_s*/ --threshold 475 --column eval_return_mean

Prints, per run, the first progress row whose return_mean reached the
threshold (wall time and env steps), or that it never did.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path


def first_crossing(
    progress_csv: Path, threshold: float, column: str = "return_mean", *, min_episodes: int = 0
) -> dict[str, float] | None:
    """The first progress row whose ``column`` reached ``threshold`` (with ``min_episodes`` finished by then, 100
    for a full window as --stop-return asks), as its wall time, env steps and value; None if no row did."""
    with open(progress_csv, newline="") as file:
        for row in csv.DictReader(file):
            value = float(row.get(column) or "nan")
            episodes = float(row.get("episodes") or "nan")
            if not math.isnan(value) and value >= threshold and not episodes < min_episodes:
                return {"wall_time": float(row["wall_time"]), "env_steps": float(row["env_steps"]), column: value}
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run log directories (or progress.csv files)")
    parser.add_argument("--threshold", type=float, default=475.0, help="value to reach")
    parser.add_argument(
        "--column",
        default="return_mean",
        help="progress.csv column: return_mean (training episodes) or eval_return_mean (greedy evaluation)",
    )
    args = parser.parse_args(argv)
    missed = 0
    for run in args.runs:
        path = run if run.suffix == ".csv" else run / "progress.csv"
        if not path.is_file():
            print(f"{run}: no progress.csv", file=sys.stderr)
            missed += 1
            continue
        crossing = first_crossing(path, args.threshold, args.column)
        if crossing is None:
            print(f"{run}: never reached {args.column} {args.threshold}")
            missed += 1
        else:
            print(
                f"{run}: {args.column} {crossing[args.column]:.1f} at {int(crossing['env_steps'])} env steps, "
                f"{crossing['wall_time']:.1f} s"
            )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
