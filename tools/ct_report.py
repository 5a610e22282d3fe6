"""Per CT of one or more runs: how requests batched, and how each cost moved from the start to the end.

    python tools/ct_report.py runs/multi_ct_s0 runs/multi_ct_s1

Reads LOG_DIR/cts.csv and LOG_DIR/learn.csv. A cost's start and end are the
means of its first and last fifth of rows (learn.csv holds one row per
progress report, each the mean over the learn calls since the previous one).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def weighted_mean(pairs: list[tuple[float, int]]) -> float:
    total = sum(count for _, count in pairs)
    return sum(mean * count for mean, count in pairs) / total if total else math.nan


def fifths(values: list[float]) -> tuple[float, float]:
    part = max(1, len(values) // 5)
    return statistics.fmean(values[:part]), statistics.fmean(values[-part:])


def report(log_dir: Path) -> list[str]:
    lines = [str(log_dir)]
    batching: dict[str, dict[str, list[tuple[float, int]]]] = defaultdict(lambda: {"predict": [], "learn": []})
    for row in read_rows(log_dir / "cts.csv"):
        for kind in ("predict", "learn"):
            count = int(row[f"{kind}_batches" if kind == "predict" else "learn_calls"])
            if count:
                batching[row["ct"]][kind].append((float(row[f"{kind}_batch_mean"]), count))
    costs: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in read_rows(log_dir / "learn.csv"):
        costs[(row["ct"], row["cost"])].append(float(row["value"]))
    for ct, kinds in batching.items():
        lines.append(
            f"  {ct}: predict batch mean {weighted_mean(kinds['predict']):.2f} over "
            f"{sum(n for _, n in kinds['predict'])} batches, learn batch mean "
            f"{weighted_mean(kinds['learn']):.2f} over {sum(n for _, n in kinds['learn'])} calls"
        )
        for (cost_ct, cost), values in costs.items():
            if cost_ct == ct:
                start, end = fifths(values)
                lines.append(f"    {cost}: {start:.4g} -> {end:.4g}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run log directories")
    args = parser.parse_args(argv)
    for log_dir in args.runs:
        if not (log_dir / "cts.csv").is_file():
            parser.error(f"{log_dir} has no cts.csv: give the --log-dir of a run")
        print("\n".join(report(log_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
