"""Where checkpoints live and when periodic ones are due: the one place for the manager and for ``--serial``."""

from __future__ import annotations

import os
from pathlib import Path

from flare2.errors import ConfigError
from flare2.runtime.config import RunConfig


def checkpoint_path(directory: str | os.PathLike, ct_name: str) -> Path:
    return Path(directory) / f"{ct_name}.pt"


def resume_checkpoint_path(resume_dir: str | os.PathLike, ct_name: str) -> Path:
    """The checkpoint of ``ct_name`` in a run's log directory or in its checkpoints/ folder."""
    for directory in (Path(resume_dir) / "checkpoints", Path(resume_dir)):
        if checkpoint_path(directory, ct_name).is_file():
            return checkpoint_path(directory, ct_name)
    raise ConfigError(
        f"no checkpoint of CT {ct_name!r} in {resume_dir}: give the log directory of a run that wrote one "
        f"(it holds checkpoints/{ct_name}.pt)"
    )


def resuming_in_place(config: RunConfig) -> bool:
    """Whether ``--resume`` names this run's own log directory (its tables then go on instead of starting anew)."""
    if not config.resume_dir:
        return False
    log_dir = Path(config.log_dir)
    return Path(config.resume_dir).resolve() in (log_dir.resolve(), (log_dir / "checkpoints").resolve())


class CheckpointSchedule:
    """``--checkpoint-every``: due every so many seconds or env steps, counted from ``start`` and from each one."""

    def __init__(self, config: RunConfig) -> None:
        self.every_s = config.checkpoint_every_s
        self.every_steps = config.checkpoint_every_steps
        self._next_s = float("inf")
        self._next_steps = float("inf")

    def start(self, now: float, env_steps: int) -> None:
        if self.every_s:
            self._next_s = now + self.every_s
        if self.every_steps:
            self._next_steps = env_steps + self.every_steps

    def take_due(self, now: float, env_steps: int) -> bool:
        """True when a checkpoint is due (and counts the next one from now)."""
        if now < self._next_s and env_steps < self._next_steps:
            return False
        self.start(now, env_steps)
        return True
