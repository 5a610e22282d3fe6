"""The files and lines a run's statistics become (the manager counts them in ``flare2.runtime.manager.totals``)."""

from __future__ import annotations

import csv
import json
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flare2.runtime.config import RunConfig
from flare2.runtime.manager.totals import EVAL_RETURN_WINDOW, RunTotals

logger = logging.getLogger("flare2.progress")

PROGRESS_COLUMNS = (
    "wall_time",
    "env_steps",
    "episodes",
    "return_mean",
    "steps_per_s",
    "batch_size_mean",
    "learn_steps",
    "agents",
    "remote_agents",
    "rejected_requests",
    "max_predict_wait_ms",
    "restarts",
    "dropped_messages",
    "remote_dropped",
    "remote_rejoins",
    "remote_env_steps",
    "remote_episodes",
    "eval_env_steps",
    "eval_episodes",
    "eval_return_mean",
    "envs",
    "policy_lag_mean",
    "predict_rtt_p50_ms",
    "predict_rtt_p99_ms",
    "closed_connections",
    "compute_restarts",
    "learned_rows",
)
CT_COLUMNS = (
    "wall_time",
    "ct",
    "predict_batches",
    "predict_batch_mean",
    "learn_calls",
    "learn_batch_mean",
    "predict_s",
    "learn_s",
)
"""cts.csv: per CT, the batches since the last row and their mean size (requests per forward pass or learn call),
and the seconds spent in predict() and in learn() since the last row (the compute side's split)."""


def compute_report_interval_s(progress_interval_s: float) -> float:
    """How often the CDPs' figures (batches, learn costs) are reported: at least once per progress row, so each row
    sees fresh batching figures."""
    return min(1.0, progress_interval_s / 2)


def duration_text(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h07m``: a duration as a person reads it."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def summary_line(outcome: str, totals: RunTotals, log_dir: Path) -> str:
    """The run's last line: how it ended, what it did, and where its logs and checkpoints are."""
    checkpoints = log_dir / "checkpoints"
    # Files of an earlier run in the same log dir are not this run's. A second's slack: file times come from the
    # kernel's coarse clock.
    written = any(file.stat().st_mtime >= totals.started_at - 1.0 for file in checkpoints.glob("*.pt"))
    saved = f"checkpoints in {checkpoints}" if written else "no checkpoint written"
    returns = (
        f"mean return last {totals.return_mean:.1f}, best {totals.best_return_mean:.1f}"
        if totals.episodes
        else "no episode ended"
    )
    return (
        f"{outcome}: {totals.env_steps} env steps, {totals.episodes} episodes in "
        f"{duration_text(time.monotonic() - totals.started)}; {returns}; {saved}; logs in {log_dir}"
    )


def _board_writer(log_dir: Path, purge_step: int) -> Any:
    """A TensorBoard writer in ``log_dir``; TensorBoard hides the events earlier writers there put at ``purge_step``
    or later, so each step of the curve shows once."""
    # torch and tensorboard only for runs that ask for events
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(log_dir), purge_step=purge_step)


@contextmanager
def wandb_logging(config: RunConfig) -> Iterator[None]:
    """With ``wandb_project``, a W&B run for the run's whole length that takes every scalar the TensorBoard writers
    made inside write (W&B's TensorBoard sync). It starts before the run's processes do, because logging in and
    reaching W&B's server may take a while and nothing may wait on the manager meanwhile; it is finished after the
    last event is written. A W&B that will not start is logged and the run goes on."""
    run = _start_wandb(config) if config.wandb_project is not None else None
    try:
        yield
    finally:
        if run is not None:
            run.finish()


def _start_wandb(config: RunConfig) -> Any:
    """A W&B run named after the log dir, with the run's settings as its config; None, with the reason logged."""
    import wandb

    from flare2.runtime.run_files import TRAIN_FILE, run_record

    log_dir = Path(config.log_dir)  # made by run_logs_and_signals, entered first
    settings = run_record(config, {})
    train_file = log_dir / TRAIN_FILE  # flare2 train's settings name the algorithm's hyperparameters
    if train_file.is_file():
        settings["train"] = json.loads(train_file.read_text(encoding="utf-8"))
    try:
        return wandb.init(
            project=config.wandb_project, name=log_dir.name, dir=str(log_dir), config=settings, sync_tensorboard=True
        )
    except Exception as exc:  # noqa: BLE001 - no login, no network: W&B's own message says which
        logger.error(
            "--wandb: W&B did not start (%s: %s); the run goes on with its TensorBoard events in %s. "
            "Run wandb login first, or set WANDB_MODE=offline and wandb sync later",
            type(exc).__name__,
            exc,
            log_dir,
        )
        return None


def _has_header(path: Path, columns: tuple[str, ...]) -> bool:
    try:
        with open(path, newline="", encoding="utf-8") as file:
            return tuple(next(csv.reader(file), ())) == columns
    except OSError:
        return False


class ProgressLog:
    """Writes progress.csv (a row per report), learn.csv (a row per cost), episodes.csv (a row per episode)
    and cts.csv (a row per CT and report: how its requests batched since the last report).

    Each report also logs a progress line.
    """

    def __init__(
        self,
        log_dir: str | Path,
        *,
        start_steps: int = 0,
        append: bool = False,
        max_steps: int | None = None,
        tensorboard: bool = False,
    ) -> None:
        """``append`` continues the files of a resumed run in the same directory; ``start_steps`` is where it resumed.

        With ``max_steps``, each progress line tells how far the run is and when it will end at the pace so far.
        With ``tensorboard``, each report also goes to TensorBoard event files in the log dir.
        """
        self.dir = Path(log_dir)
        self._max_steps = max_steps
        self._ending = False
        self._start_steps = start_steps
        self._start_time = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        progress_path, learn_path = self.dir / "progress.csv", self.dir / "learn.csv"
        append = append and _has_header(progress_path, PROGRESS_COLUMNS)
        mode = "a" if append else "w"
        # Open for the log's life, closed by close() (the Manager calls it however the run ends).
        self._progress_file = open(progress_path, mode, newline="", encoding="utf-8")  # noqa: SIM115
        self._progress = csv.writer(self._progress_file)
        self._learn_file = open(learn_path, mode, newline="", encoding="utf-8")  # noqa: SIM115
        self._learn = csv.writer(self._learn_file)
        self._episodes_file = open(self.dir / "episodes.csv", mode, newline="", encoding="utf-8")  # noqa: SIM115
        self._episodes = csv.writer(self._episodes_file)
        self._cts_file = open(self.dir / "cts.csv", mode, newline="", encoding="utf-8")  # noqa: SIM115
        self._cts = csv.writer(self._cts_file)
        if not append:
            self._progress.writerow(PROGRESS_COLUMNS)
            self._learn.writerow(("wall_time", "ct", "learn_steps", "cost", "value"))
            self._episodes.writerow(("wall_time", "env_steps", "return", "length", "eval", "team"))
            self._cts.writerow(CT_COLUMNS)
        self._last_time = time.monotonic()
        self._last_steps = start_steps
        self._last_rows = 0.0
        self._last_batches = 0.0
        self._last_ct_counts: dict[str, tuple[float, ...]] = {}
        self._last_lag = (0.0, 0.0)
        # A resumed run's events hide those an earlier run wrote after its checkpoint; a fresh run's hide them all.
        self._board = _board_writer(self.dir, purge_step=start_steps + 1 if append else 0) if tensorboard else None

    def report(self, totals: RunTotals, *, agents: int, remote_agents: int = 0, envs: int = 0) -> dict[str, Any]:
        now = time.monotonic()
        rows, batches = totals.ct_total("predict_rows"), totals.ct_total("predict_batches")
        elapsed = max(now - self._last_time, 1e-9)
        row = {
            "wall_time": round(now - totals.started, 3),
            "env_steps": totals.env_steps,
            "episodes": totals.episodes,
            "return_mean": round(totals.return_mean, 3),
            "steps_per_s": round((totals.env_steps - self._last_steps) / elapsed, 1),
            "batch_size_mean": round((rows - self._last_rows) / (batches - self._last_batches), 3)
            if batches > self._last_batches
            else float("nan"),
            "learn_steps": int(totals.ct_total("learn_calls")),
            "agents": agents,
            "remote_agents": remote_agents,
            "rejected_requests": int(totals.ct_total("rejected")),
            "max_predict_wait_ms": round(totals.max_predict_wait_ms, 3),
            "restarts": totals.restarts,
            "dropped_messages": totals.dropped_messages,
            "remote_dropped": totals.remote_dropped,
            "remote_rejoins": totals.remote_rejoins,
            "remote_env_steps": totals.remote_env_steps,
            "remote_episodes": totals.remote_episodes,
            "eval_env_steps": totals.eval_env_steps,
            "eval_episodes": totals.eval_episodes,
            "eval_return_mean": round(totals.eval_return_mean, 3),
            "envs": envs,
            "policy_lag_mean": round(self._policy_lag_mean(totals), 3),
            "predict_rtt_p50_ms": round(totals.round_trips.quantile(0.5), 3),
            "predict_rtt_p99_ms": round(totals.round_trips.quantile(0.99), 3),
            "closed_connections": totals.closed_connections + int(totals.ct_total("closed_connections")),
            "compute_restarts": totals.compute_restarts,
            "learned_rows": int(totals.ct_total("learned_rows")),
        }
        totals.max_predict_wait_ms = 0.0
        totals.round_trips.take()
        if not totals.best_return_mean >= row["return_mean"]:  # NaN compares False both ways
            totals.best_return_mean = row["return_mean"]
        self._last_time, self._last_steps, self._last_rows, self._last_batches = now, totals.env_steps, rows, batches
        self._progress.writerow([row[column] for column in PROGRESS_COLUMNS])
        self._progress_file.flush()
        costs_text = []
        several = len(totals.ct_reports) > 1
        for ct, report in totals.ct_reports.items():
            for cost, value in report.get("costs", {}).items():
                self._learn.writerow((row["wall_time"], ct, report.get("learn_calls", 0), cost, value))
                costs_text.append(f"{ct + '/' if several else ''}{cost} {value:.3g}")
        self._learn_file.flush()
        if self._board is not None:
            self._write_board(self._board, row, totals)
        self._write_ct_rows(row["wall_time"], totals)
        for episode_return, length, evaluation, team in totals.take_finished():
            self._episodes.writerow((row["wall_time"], row["env_steps"], episode_return, length, int(evaluation), team))
        self._episodes_file.flush()
        eval_text = f" | eval {row['eval_return_mean']:.1f} ({totals.eval_episodes} ep)" if totals.eval_episodes else ""
        if totals.recent_eval_by_team:
            won = ", ".join(f"{team} {rate:.0%}" for team, rate in totals.eval_win_rates().items())
            eval_text = f" | eval won against {won} (last {EVAL_RETURN_WINDOW} games each)"
        logger.info(
            "steps %d%s | %.0f steps/s | episodes %d | return %.1f%s | batch %.2f | learn %d (lag %.2f) | "
            "agents %d local, "
            "%d remote, %d envs | restarts %d%s%s",
            row["env_steps"],
            self._budget_text(totals.env_steps, now),
            row["steps_per_s"],
            row["episodes"],
            row["return_mean"],
            eval_text,
            row["batch_size_mean"],
            row["learn_steps"],
            row["policy_lag_mean"],
            agents,
            remote_agents,
            envs,
            row["restarts"],
            f" (compute process {totals.compute_restarts})" if totals.compute_restarts else "",
            (" | " + " ".join(costs_text)) if costs_text else "",
        )
        return row

    @staticmethod
    def _write_board(board: Any, row: dict[str, Any], totals: RunTotals) -> None:
        """Every number of the progress row and every cost, against env steps; NaN (nothing to report yet) left out."""
        step = row["env_steps"]
        for column in PROGRESS_COLUMNS:
            if column not in ("wall_time", "env_steps") and math.isfinite(row[column]):
                board.add_scalar(f"progress/{column}", row[column], step)
        for ct, report in totals.ct_reports.items():
            for cost, value in report.get("costs", {}).items():
                board.add_scalar(f"learn/{ct}/{cost}", value, step)
        board.flush()

    def run_ends(self) -> None:
        """The run is stopping: the rows still to come tell no time left."""
        self._ending = True

    def _budget_text(self, env_steps: int, now: float) -> str:
        """What follows the step count, e.g. ``of 100000 (12%, ETA 1m05s)``: the share of ``max_steps`` done and
        the time left at the pace since this log started."""
        if self._max_steps is None:
            return ""
        done = env_steps - self._start_steps
        left = self._max_steps - env_steps
        eta = (
            f", ETA {duration_text(left * (now - self._start_time) / done)}"
            if done > 0 and left > 0 and not self._ending
            else ""
        )
        return f" of {self._max_steps} ({min(env_steps / self._max_steps, 1.0):.0%}{eta})"

    def _policy_lag_mean(self, totals: RunTotals) -> float:
        """Mean policy lag (learner version minus the version that acted) of the steps learned since the last row."""
        lag_sum, lag_steps = totals.ct_total("policy_lag_sum"), totals.ct_total("policy_lag_steps")
        before_sum, before_steps = self._last_lag
        self._last_lag = (lag_sum, lag_steps)
        return (lag_sum - before_sum) / (lag_steps - before_steps) if lag_steps > before_steps else float("nan")

    def _write_ct_rows(self, wall_time: float, totals: RunTotals) -> None:
        for ct in totals.ct_reports:
            keys = (
                "predict_rows",
                "predict_batches",
                "learned_requests",
                "learn_calls",
                "predict_seconds",
                "learn_seconds",
            )
            activity = totals.ct_activity(ct)
            counts = tuple(activity[key] for key in keys)
            rows, batches, learned_requests, learn_calls, predict_s, learn_s = (
                now - before for now, before in zip(counts, self._last_ct_counts.get(ct, (0.0,) * len(keys)))
            )
            self._last_ct_counts[ct] = counts
            self._cts.writerow(
                (
                    wall_time,
                    ct,
                    int(batches),
                    round(rows / batches, 3) if batches else float("nan"),
                    int(learn_calls),
                    round(learned_requests / learn_calls, 3) if learn_calls else float("nan"),
                    round(predict_s, 3),
                    round(learn_s, 3),
                )
            )
        self._cts_file.flush()

    def close(self) -> None:
        if self._board is not None:
            self._board.close()
        self._cts_file.close()
        self._progress_file.close()
        self._learn_file.close()
        self._episodes_file.close()
