"""The Manager: the one orchestration of a run, on one of two schedules.

``Manager(config).run()`` runs a :class:`RunConfig` to its end and returns the
exit code. What a run does is decided here, once for both modes: the run's
logs and signal handling, its budget (steps, episodes, a target return), the
progress rows, the ``--checkpoint-every`` schedule, ``--resume`` (the counters
a checkpoint kept), the summary line and the exit code.

Where the compute side and the agents execute is the *schedule's*
(:mod:`flare2.runtime.manager.schedule` tells the call order):

- :class:`~flare2.runtime.manager.parallel.ParallelSchedule`: the compute
  process and agent processes over sockets, supervised; the default;
- :class:`~flare2.runtime.manager.serial.SerialSchedule` (``--serial``): one
  agent and the CDPs in this thread, the same Agent, helper, CDP and
  ComputationTask code, for debuggers and as the baseline that the parallel
  runtime must beat.

Both call :meth:`Manager.tick` as they play, and it tells them when to stop.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from pathlib import Path
from typing import Any

from flare2.errors import ConfigError, FlareError, RunFailed
from flare2.runtime import exit_codes
from flare2.runtime.checkpoints import (
    CheckpointSchedule,
    resume_checkpoint_path,
    resuming_in_place,
)
from flare2.runtime.config import RunConfig
from flare2.runtime.manager.parallel import ParallelSchedule
from flare2.runtime.manager.progress import ProgressLog, summary_line, wandb_logging
from flare2.runtime.manager.schedule import Schedule
from flare2.runtime.manager.totals import RunTotals
from flare2.runtime.processes import refuse_start_in_a_spawned_child
from flare2.runtime.run_files import make_log_dir, record_run, replaces_a_run, run_logs_and_signals

logger = logging.getLogger(__name__)


class Manager:
    """Runs one :class:`RunConfig` to its budget: ``Manager(config).run()`` returns the exit code."""

    def __init__(self, config: RunConfig) -> None:
        refuse_start_in_a_spawned_child("Manager(config).run()")
        self.config = config
        self.log_dir = Path(config.log_dir)
        self.totals = RunTotals()
        self.next_row_at = math.inf
        self._stop_signal: int | None = None
        self._progress: ProgressLog | None = None
        self._checkpoints = CheckpointSchedule(config)
        self.schedule: Schedule
        if config.serial:
            # Imported here: the serial schedule loads torch, which a parallel manager never does.
            from flare2.runtime.manager.serial import SerialSchedule

            self.schedule = SerialSchedule(config, self)
        else:
            self.schedule = ParallelSchedule(config, self)

    def run(self) -> int:
        """Start the run, take it to its end and return the process exit code."""
        try:
            make_log_dir(self.log_dir)
        except ConfigError as exc:
            logger.error("%s", exc)
            return exit_codes.CONFIG_ERROR
        replaces = replaces_a_run(self.config)
        with run_logs_and_signals(self.log_dir, self._on_signal), wandb_logging(self.config):
            if replaces:
                logger.warning(
                    "%s holds the files of an earlier run: this run replaces them (give --log-dir another folder to "
                    "keep both)",
                    self.log_dir,
                )
            try:
                code = self._run()
            except FlareError as exc:
                logger.error("%s", exc)
                code = exit_codes.CONFIG_ERROR
            finally:
                if self._progress is not None:
                    self._progress.close()
            logger.info("%s", summary_line(exit_codes.outcome(code), self.totals, self.log_dir))
            return code

    def _run(self) -> int:
        if self.config.resume_dir:
            # A missing checkpoint ends the run before anything starts.
            for ct in self.config.cts:
                resume_checkpoint_path(self.config.resume_dir, ct.name)
        with self.schedule.open():
            try:
                self.schedule.start()
                return self.schedule.run()
            except RunFailed as exc:
                logger.error("%s", exc)
                return exc.exit_code
            finally:
                if self._progress is not None:
                    self._progress.run_ends()
                self.schedule.shutdown()
                # The last row: what the agents and the compute side reported as they stopped.
                self._report_progress()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_signal = signum

    # ---- what a schedule calls -------------------------------------------------------

    def compute_is_up(self, cts: dict[str, Any], counters: dict[str, Any]) -> None:
        """The CTs serve: record the run's settings, continue a resumed run's counters, start the tables and clocks."""
        config = self.config
        record_run(config, cts)
        if counters:
            self.totals.resume_from(counters)
            logger.info(
                "resumed from %s: %d env steps, %d episodes, return_mean %.1f",
                config.resume_dir,
                self.totals.env_steps,
                self.totals.episodes,
                self.totals.return_mean,
            )
        self._progress = ProgressLog(
            self.log_dir,
            start_steps=self.totals.env_steps,
            append=bool(counters) and resuming_in_place(config),
            max_steps=config.max_steps,
            tensorboard=config.board,
        )
        now = time.monotonic()
        self._checkpoints.start(now, self.totals.env_steps)
        self.next_row_at = now + config.progress_interval_s

    def tick(self) -> int | None:
        """The budget, a stop signal, a progress row, a checkpoint: each looked at; the exit code once the run must
        stop (None: play on)."""
        config, totals = self.config, self.totals
        if totals.budget_reached(config):
            logger.info(
                "budget reached: %d env steps, %d episodes, return_mean %.1f",
                totals.env_steps,
                totals.episodes,
                totals.return_mean,
            )
            if self.schedule.stops_gradually and self._progress is not None:
                # A row as the run stops, before the episodes that end while the agents stop change the means.
                self._progress.run_ends()
                self._report_progress()
            return exit_codes.OK
        if self._stop_signal is not None:
            logger.warning("stopping on %s", signal.Signals(self._stop_signal).name)
            return exit_codes.stopped_by(self._stop_signal)
        now = time.monotonic()
        if now >= self.next_row_at:
            self.next_row_at = now + config.progress_interval_s
            self._report_progress()
        if self.schedule.ready_to_checkpoint and self._checkpoints.take_due(now, totals.env_steps):
            self.schedule.checkpoint(totals.counters())
        return None

    def _report_progress(self) -> None:
        if self._progress is not None:
            agents, remote_agents, envs = self.schedule.agent_counts()
            self._progress.report(self.totals, agents=agents, remote_agents=remote_agents, envs=envs)
