"""What a schedule is: where the compute side and the agents of a run execute, under the Manager's one orchestration.

The :class:`~flare2.runtime.manager.manager.Manager` decides *what* happens in
a run (its budget, stop and signal handling, progress rows, checkpoint
schedule, resume, summary and exit code); a schedule decides *where and when*
the work runs. There are two:

- :class:`~flare2.runtime.manager.parallel.ParallelSchedule`: the compute
  process and agent processes, over sockets (the default);
- :class:`~flare2.runtime.manager.serial.SerialSchedule` (``--serial``): one
  agent and the CDPs in the calling thread, so a breakpoint anywhere shows the
  whole call stack.

The Manager uses a schedule in this order::

    with schedule.open():   # what the run needs while it lasts (sockets, a private directory)
        schedule.start()    # the compute side and the agents; calls manager.compute_is_up once the CTs serve
        schedule.run()      # play, calling manager.tick() at least every SUPERVISE_INTERVAL_S, until it
                            # returns an exit code, which run() returns (or RunFailed ends it)
        schedule.shutdown() # stop the agents, then the compute side, which learns what waits and checkpoints

``shutdown`` runs however ``start`` or ``run`` ended, and only leaves out what never started.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from flare2.runtime.manager.totals import RunTotals


class Conductor(Protocol):
    """The Manager as a schedule sees it."""

    totals: RunTotals
    """What the run has done so far: schedules add what their agents and CDPs report."""
    next_row_at: float
    """When (``time.monotonic``) the next progress row is due: a waiting schedule wakes up for it."""

    def compute_is_up(self, cts: dict[str, Any], counters: dict[str, Any]) -> None:
        """The CTs serve now (``cts``: name to what ``ComputationTask.identity`` says of each); ``counters``: what the
        checkpoints of a resumed run kept (empty for a fresh run)."""

    def tick(self) -> int | None:
        """One turn of the run's control: progress rows and checkpoints when due; the exit code once it must stop."""


class Schedule(Protocol):
    """Where the compute side and the agents of a run execute; see the module's docstring for the call order."""

    stops_gradually: bool
    """Whether agents play on for a moment once the run stops (processes that must be told): the Manager then writes
    a progress row as the budget is reached, before their last episodes change the means."""

    def open(self) -> AbstractContextManager[None]: ...

    def start(self) -> None: ...

    def run(self) -> int: ...

    @property
    def ready_to_checkpoint(self) -> bool:
        """Whether a checkpoint may be asked for now (the CTs serve, and no checkpoint is under way)."""

    def checkpoint(self, counters: dict[str, Any]) -> None:
        """Write every CT's checkpoint with the run's ``counters``."""

    def agent_counts(self) -> tuple[int, int, int]:
        """Live agents of this machine, live agents of other machines, and the envs they play (for progress rows)."""

    def shutdown(self) -> None: ...
