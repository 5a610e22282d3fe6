"""``flare2 plot RUN_DIR [RUN_DIR ...] -o curve.png``: return against env steps, from each run's episodes.

Runs of one configuration that differ only in their seed are drawn as one
curve, their mean, over the band between the lowest and the highest of them.
Runs of ``flare2 train`` are grouped by their train.json; other runs by their
directory name without a ``_s<N>`` or ``-seed<N>`` ending (or, for directories named
``s<N>``, by their parent's name). Evaluation returns
(``--eval-every``) are drawn dashed where a run has them. Needs the plot extra
(matplotlib).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
from pathlib import Path

import numpy as np

from flare2.errors import ConfigError
from flare2.runtime.manager.totals import EVAL_RETURN_WINDOW, RETURN_WINDOW
from flare2.runtime.run_files import TRAIN_FILE, check_output_file

_SEED_SUFFIX = re.compile(r"[_-](s|seed)\d+$")
_SEED_NAME = re.compile(r"(s|seed)\d+")
_POINTS = 200


def read_curves(run_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``return_mean`` and ``eval_return_mean`` of a run against env steps; for a multi-agent env's run, those of
    each team's agents (``return_mean:TEAM``).

    From episodes.csv, one point per finished episode: the mean return of the
    last 100 training (or 20 evaluation) episodes, as progress.csv reports it,
    at the episode's place between the two progress rows it came between. A
    short run has only a few progress rows; it has many episodes. A run
    without episodes.csv is read from its progress.csv rows.
    """
    if not (run_dir / "progress.csv").is_file():
        raise ConfigError(f"{run_dir} has no progress.csv: give the log dir of a run (its --log-dir)")
    curves = _episode_curves(run_dir / "episodes.csv") or _progress_curves(run_dir / "progress.csv")
    if not any(column.startswith("return_mean") for column in curves):
        raise ConfigError(
            f"{run_dir / 'progress.csv'} has no return yet: the run ended before its first finished "
            "episodes were reported"
        )
    return curves


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file))


def _progress_curves(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    curves = {}
    rows = _rows(path)
    for column in ("return_mean", "eval_return_mean"):
        points = [(float(row["env_steps"]), float(row[column])) for row in rows if row.get(column) not in (None, "")]
        points = [(steps, value) for steps, value in points if math.isfinite(value)]
        if points:
            curves[column] = (np.array([p[0] for p in points]), np.array([p[1] for p in points]))
    return curves


def _episode_curves(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    if not path.is_file():
        return {}
    try:
        episodes = [
            (float(row["env_steps"]), float(row["return"]), row["eval"] == "1", row.get("team") or "")
            for row in _rows(path)
        ]
    except (KeyError, TypeError, ValueError):
        return {}  # not as flare2 writes it: progress.csv instead
    curves = {}
    # The agents of a multi-agent env: a curve per team, of the returns of its agents.
    for team in sorted({team for *_, team in episodes}):
        for column, evaluation, window in (
            ("return_mean", False, RETURN_WINDOW),
            ("eval_return_mean", True, EVAL_RETURN_WINDOW),
        ):
            chosen = [(steps, value) for steps, value, is_eval, of in episodes if is_eval == evaluation and of == team]
            if chosen:
                curves[f"{column}:{team}" if team else column] = _running_mean(chosen, window)
    return curves


def _running_mean(chosen: list[tuple[float, float]], window: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean of the last ``window`` returns at each episode, against its env steps."""
    steps = _spread(np.array([steps for steps, _ in chosen]))
    returns = np.array([value for _, value in chosen])
    totals = np.concatenate([[0.0], np.cumsum(returns)])
    counts = np.minimum(np.arange(1, len(returns) + 1), window)
    ends = np.arange(1, len(returns) + 1)
    return steps, (totals[ends] - totals[ends - counts]) / counts


def _spread(row_steps: np.ndarray) -> np.ndarray:
    """Episodes logged with the env steps of the progress row that reported them, spread evenly over the steps
    since the row before: the k-th of n episodes of a row at S (the one before at P) sits at P + k (S - P) / n."""
    spread = row_steps.copy()
    start = 0
    previous = 0.0
    while start < len(row_steps):
        end = start
        while end < len(row_steps) and row_steps[end] == row_steps[start]:
            end += 1
        count = end - start
        spread[start:end] = previous + (row_steps[start] - previous) * np.arange(1, count + 1) / count
        previous = row_steps[start]
        start = end
    return spread


def group_key(run_dir: Path) -> str:
    """Runs with the same key are seeds of one configuration; the key is also the curve's label."""
    train_file = run_dir / TRAIN_FILE
    if train_file.is_file():
        settings = json.loads(train_file.read_text(encoding="utf-8"))
        settings["run"] = {key: value for key, value in settings.get("run", {}).items() if key != "seed"}
        label = f"{settings.get('algo')} on {settings.get('env')}"
        return f"{label}\0{json.dumps(settings, sort_keys=True)}"
    run_dir = run_dir.resolve()
    if _SEED_NAME.fullmatch(run_dir.name):
        return run_dir.parent.name  # runs/ppo/s0, runs/ppo/s1...
    return _SEED_SUFFIX.sub("", run_dir.name)


def plot(run_dirs: list[Path], output: Path, *, title: str | None = None) -> list[str]:
    """Draw the runs into ``output``; returns one line per curve (label, seeds, final mean and spread)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("flare2 plot needs the plot extra: python -m pip install -e '.[plot]'") from None
    groups: dict[str, list[dict]] = {}
    first_dirs: dict[str, Path] = {}
    for run_dir in run_dirs:
        key = group_key(run_dir)
        groups.setdefault(key, []).append(read_curves(run_dir))
        first_dirs.setdefault(key, run_dir)
    labels = {key: key.split("\0")[0] for key in groups}
    if len(set(labels.values())) < len(labels):
        # Two configurations of one algorithm and env: tell them apart by the directory of their first run.
        labels = {key: f"{label} ({first_dirs[key].name})" for key, label in labels.items()}
    figure, axes = plt.subplots(figsize=(8, 5))
    lines = []
    for key, runs in groups.items():
        for column in sorted({column for run in runs for column in run}, key=lambda c: (c.startswith("eval"), c)):
            curves = [run[column] for run in runs if column in run]
            kind, _, team = column.partition(":")
            evaluation = kind == "eval_return_mean"
            style = "--" if evaluation else "-"
            steps, mean, low, high = _band(curves)
            name = labels[key] + (f", team {team}" if team else "") + (" (evaluation)" if evaluation else "")
            seeds = f"{len(curves)} seeds" if len(curves) > 1 else "1 run"
            (line,) = axes.plot(steps, mean, style, label=f"{name}, {seeds}")
            if len(curves) > 1:
                axes.fill_between(steps, low, high, color=line.get_color(), alpha=0.2)
            lines.append(
                f"{name}: {seeds}, last mean {mean[-1]:.1f} (lowest {low[-1]:.1f}, highest {high[-1]:.1f}) "
                f"at {steps[-1]:,.0f} env steps"
            )
    axes.set_xlabel("env steps")
    axes.set_ylabel("mean return (last 100 episodes)")
    axes.set_title(title or "return against env steps")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return lines


def _band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Mean, lowest and highest of the curves on a common grid of steps (up to where the shortest one ends)."""
    if len(curves) == 1:
        steps, values = curves[0]
        return steps, values, values, values
    end = min(steps[-1] for steps, _ in curves)
    start = max(steps[0] for steps, _ in curves)
    grid = np.linspace(start, end, _POINTS) if end > start else np.array([end])
    values = np.stack([np.interp(grid, steps, returns) for steps, returns in curves])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="flare2 plot", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("runs", nargs="+", type=Path, help="log dirs of runs")
    parser.add_argument("-o", "--output", type=Path, default=Path("curve.png"), help="the image (default: %(default)s)")
    parser.add_argument("--title", default=None, help="the figure's title")
    args = parser.parse_args(argv)
    try:
        check_output_file(args.output, "-o")
        lines = plot(args.runs, args.output, title=args.title)
    except ConfigError as exc:
        parser.error(str(exc))
    for line in lines:
        print(line)
    print(f"wrote {args.output}")
    return 0
