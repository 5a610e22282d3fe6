"""Learning curves of several runs side by side, as a plain-text table. Reads progress.csv files; stdlib only.

    python tools/compare_curves.py runs/mem_gru_s0 runs/mem_mlp_s0 --every 20000
    python tools/compare_curves.py runs/dqn_s*/ --column eval_return_mean
    python tools/compare_curves.py runs/c4_s0 --every 250000 --eval-won lookahead --digits 2

One row per env-step mark (every ``--every`` steps up to the longest run,
then each run's last row), one column per run (labelled with its directory
name). A cell holds the column's value in the run's last progress row at or
before the mark: what the run's progress line showed when it had taken that
many steps. "-" means no row yet (or the value was nan); a blank means the
run had ended before the mark.

``--eval-won PLAYER`` reads a self-play run's episodes.csv instead: at each
mark, the share of its last ``--window`` evaluation games against the fixed
player PLAYER (the team of those episodes) that the policy won (a return
above 0).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path


def read_curve(progress_csv: Path, column: str) -> list[tuple[float, float]]:
    """``(env_steps, value)`` for every row of a progress.csv, in order."""
    with open(progress_csv, newline="") as file:
        rows = list(csv.DictReader(file))
    if rows and column not in rows[0]:
        raise SystemExit(f"{progress_csv} has no column {column!r}; it has {sorted(rows[0])}")
    return [(float(row["env_steps"]), float(row[column] or "nan")) for row in rows]


def read_eval_wins(episodes_csv: Path, player: str, window: int) -> list[tuple[float, float]]:
    """``(env_steps, share won)`` at every evaluation game against ``player`` in an episodes.csv: the share of the
    last ``window`` of them (those so far, at first) whose return was above 0."""
    with open(episodes_csv, newline="") as file:
        games = [row for row in csv.DictReader(file) if row["eval"] == "1" and row["team"] == player]
    if not games:
        raise SystemExit(f"{episodes_csv} has no evaluation games against {player!r} (a run with --eval-every)")
    won = [float(row["return"]) > 0 for row in games]
    return [
        (float(row["env_steps"]), sum(won[max(0, index + 1 - window) : index + 1]) / min(index + 1, window))
        for index, row in enumerate(games)
    ]


def value_at(curve: list[tuple[float, float]], mark: float) -> float | None:
    """The value in the last row at or before ``mark`` env steps; None if the run ended before it."""
    if not curve or mark > curve[-1][0]:
        return None
    value = math.nan
    for steps, row_value in curve:
        if steps > mark:
            break
        value = row_value
    return value


def table(curves: dict[str, list[tuple[float, float]]], every: int, digits: int = 1) -> str:
    longest = max((curve[-1][0] for curve in curves.values() if curve), default=0.0)
    marks = [float(mark) for mark in range(every, int(longest) + 1, every)]
    labels = list(curves)
    widths = [max(len(label), 7) for label in labels]
    lines = ["env_steps".rjust(9) + "  " + "  ".join(label.rjust(width) for label, width in zip(labels, widths))]

    def cell(value: float | None, width: int) -> str:
        if value is None:
            return " " * width
        return ("-" if math.isnan(value) else f"{value:.{digits}f}").rjust(width)

    for mark in marks:
        cells = [cell(value_at(curves[label], mark), width) for label, width in zip(labels, widths)]
        lines.append(f"{int(mark):>9}  " + "  ".join(cells))
    finals = [curve[-1] if curve else None for curve in curves.values()]
    cells = [cell(final[1] if final else None, width) for final, width in zip(finals, widths)]
    lines.append("final".rjust(9) + "  " + "  ".join(cells))
    lines.append(
        "at steps".rjust(9)
        + "  "
        + "  ".join((str(int(final[0])) if final else "").rjust(w) for final, w in zip(finals, widths))
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run log directories (or progress.csv files)")
    parser.add_argument("--every", type=int, default=20_000, help="env steps between marks")
    parser.add_argument("--column", default="return_mean", help="progress.csv column to show")
    parser.add_argument("--digits", type=int, default=1, help="decimals shown (returns within [0, 1] want 2 or 3)")
    parser.add_argument(
        "--eval-won", metavar="PLAYER", help="show the share of evaluation games won against PLAYER (episodes.csv)"
    )
    parser.add_argument("--window", type=int, default=100, help="with --eval-won: the games each share is over")
    args = parser.parse_args(argv)
    if args.every < 1 or not 0 <= args.digits <= 9 or args.window < 1:
        parser.error("--every and --window must be >= 1 and --digits from 0 to 9")
    name = "episodes.csv" if args.eval_won else "progress.csv"
    curves: dict[str, list[tuple[float, float]]] = {}
    for run in args.runs:
        path = run if run.suffix == ".csv" else run / name
        if not path.is_file():
            print(f"{run}: no {name}", file=sys.stderr)
            return 1
        label = (run.parent if run.suffix == ".csv" else run).name or str(run)
        while label in curves:
            label += "'"
        curves[label] = (
            read_eval_wins(path, args.eval_won, args.window) if args.eval_won else read_curve(path, args.column)
        )
    print(table(curves, args.every, args.digits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
