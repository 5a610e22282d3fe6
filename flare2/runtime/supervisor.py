"""Agent processes in slots: started, watched, restarted after a failure, up to a limit.

The one supervisor of the manager's local agents and of the agents ``flare2
attach`` starts on another machine. Each slot holds one agent process at a
time; a restart starts a new *incarnation* of the slot, with a new agent id,
so that nothing meant for its predecessor reaches it.

The restart policy: an agent that failed starts again after
``restart_backoff_s``, doubled for each failure in a row (a failure after a
short life in which it played no step), at most :data:`MAX_RESTART_BACKOFF_S`;
one that ran :data:`HEALTHY_LIFE_S`, or played, before it failed starts again
at the base wait (an agent killed from outside as it plays is no crash loop). Past
``max_restarts`` failures, or for a failure no restart can cure (a
configuration error), :class:`~flare2.errors.RunFailed` is raised.

What a slot's exit *means* is the owner's to say: the manager also knows of
byes, heartbeats and the compute process, ``flare2 attach`` whether the
manager still answers. So the owner asks :meth:`AgentSupervisor.exited` what
ended and calls :meth:`~AgentSupervisor.restart_later` or
:meth:`~AgentSupervisor.retire` for each.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from flare2.errors import RunFailed
from flare2.runtime import exit_codes
from flare2.wire.security import AGENT_CURVE_ENV, CurveClient

logger = logging.getLogger(__name__)

SUPERVISE_INTERVAL_S = 0.2
"""A supervisor's owner looks at its agents at least this often (an exit is noticed within this time)."""
MAX_RESTART_BACKOFF_S = 30.0
HEALTHY_LIFE_S = 60.0
"""An agent that ran this long before it failed starts again at once; one that keeps failing waits longer."""


def failure_streak(previous_streak: int, lived_s: float, *, played: bool = False) -> int:
    """How many times in a row this agent has failed, counting the failure that ends a life of ``lived_s`` in which
    it ``played`` (its owner heard of env steps it played) or not: one that played was no crash loop, whatever killed
    it."""
    return 0 if played or lived_s > HEALTHY_LIFE_S else previous_streak + 1


def restart_backoff(base_s: float, streak: int) -> float:
    """The wait before the restart: ``base_s``, doubling for each failure in a row, at most 30 s."""
    return min(base_s * 2 ** max(streak - 1, 0), MAX_RESTART_BACKOFF_S)


def agent_seed(seed: int, slot: int, incarnation: int) -> int:
    """The seed of a slot's agent incarnation: a restarted agent plays other episodes than its predecessor."""
    return seed * 100_003 + slot * 1009 + incarnation


@dataclass(frozen=True)
class AgentLaunch:
    """How each agent process of a supervisor is started (the same command for the manager and ``flare2 attach``)."""

    control_endpoint: str
    agent_path: str
    agent_kwargs: dict[str, Any]
    envs_per_agent: int | None
    """None: each process plays its agent class's ``default_envs``."""
    seed: int
    curve: CurveClient | None = None
    """The key pair the agents talk CURVE with (None on loopback without keys)."""
    first_slot: int = 0
    """Seeds are drawn as for slots ``first_slot`` on (``flare2 attach`` is given slots no other agents of the run
    use, so its agents play other episodes)."""
    id_prefix: str = "a"
    """Agent ids are ``<prefix><slot>.<incarnation>.<random hex>``; the random part keeps another peer from taking
    the id (ZeroMQ refuses a second connection with it)."""
    extra: tuple[str, ...] = ()
    """More options of ``flare2.runtime.agents.agent_process`` (``--remote``, ``--hello-timeout S``)."""

    def command(self, agent_id: str, slot: int, incarnation: int) -> list[str]:
        """The command line of one agent process."""
        return [
            sys.executable,
            "-m",
            "flare2.runtime.agents.agent_process",
            "--control",
            self.control_endpoint,
            "--agent-id",
            agent_id,
            "--agent",
            self.agent_path,
            "--agent-kwargs",
            json.dumps(self.agent_kwargs),
            "--seed",
            str(agent_seed(self.seed, self.first_slot + slot, incarnation)),
            *(() if self.envs_per_agent is None else ("--envs-per-agent", str(self.envs_per_agent))),
            "--parent-pid",
            str(os.getpid()),
            *self.extra,
        ]

    def start(self, slot: int, incarnation: int) -> tuple[str, subprocess.Popen]:
        """Start the process of ``slot``'s ``incarnation``; returns its agent id and the process."""
        agent_id = f"{self.id_prefix}{slot}.{incarnation}.{secrets.token_hex(4)}"
        command = self.command(agent_id, slot, incarnation)
        env = dict(os.environ)
        if self.curve is not None:
            env[AGENT_CURVE_ENV] = self.curve.to_env()
        # A file.py:Class agent path is resolved against the starting command's working directory.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
        # A session of its own keeps the terminal's Ctrl+C away from the agent: its owner stops it (STOP, SIGTERM).
        return agent_id, subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)


@dataclass
class AgentSlot:
    """One slot and the agent process that fills it now (its latest incarnation)."""

    index: int
    agent_id: str
    process: subprocess.Popen
    started_at: float
    incarnation: int = 0
    failure_streak: int = 0
    """Failures of this slot in a row, each after a short life; sets the backoff."""
    restart_at: float | None = None
    """When the next incarnation starts, while the slot waits for it."""
    ended_with: int | None = None
    """The exit code that ended this slot for good (stopped by the run, the manager gone)."""
    held: bool = False
    """Its agent exited and the owner holds the next incarnation until something it waits for (``flare2 attach``:
    the manager answering again)."""

    @property
    def running(self) -> bool:
        """Whether its process is (as far as this supervisor knows) playing: neither failed, held nor ended."""
        return self.restart_at is None and self.ended_with is None and not self.held


class RestartCount(Protocol):
    """Where the restarts are counted (the manager's run totals, which checkpoints keep and progress rows show)."""

    restarts: int


@dataclass
class _Count:
    restarts: int = 0


@dataclass(kw_only=True)
class AgentSupervisor:
    """Starts agent processes in slots and applies the restart policy to those that fail."""

    max_restarts: int
    """Failures restarted over the supervisor's life; the next one raises RunFailed."""
    restart_backoff_s: float
    count: RestartCount = field(default_factory=_Count)
    slots: list[AgentSlot] = field(default_factory=list)
    launch: AgentLaunch | None = None

    def start_all(self, launch: AgentLaunch, num_agents: int) -> None:
        """Start ``num_agents`` slots with ``launch``."""
        self.launch = launch
        for index in range(num_agents):
            agent_id, process = launch.start(index, incarnation=0)
            self.slots.append(AgentSlot(index, agent_id, process, started_at=time.monotonic()))

    def restart_due(self, now: float) -> list[AgentSlot]:
        """Start the next incarnation of each slot whose backoff is over; returns those slots."""
        launch = self.launch
        if launch is None:  # nothing started yet
            return []
        due = [slot for slot in self.slots if slot.restart_at is not None and now >= slot.restart_at]
        for slot in due:
            self._start_next(slot, launch)
        return due

    def hold(self, slot: AgentSlot) -> None:
        """The slot's agent exited; its next incarnation waits for :meth:`release` (not a failure: no restart is
        counted)."""
        slot.held = True

    def release(self, slot: AgentSlot, *extra: str) -> None:
        """Start the next incarnation of a held slot now, with these options of the agent process added."""
        if self.launch is None or not slot.held:
            return
        slot.held = False
        self._start_next(slot, replace(self.launch, extra=(*self.launch.extra, *extra)))

    def held_slots(self) -> list[AgentSlot]:
        return [slot for slot in self.slots if slot.held]

    def _start_next(self, slot: AgentSlot, launch: AgentLaunch) -> None:
        slot.incarnation += 1
        slot.agent_id, slot.process = launch.start(slot.index, slot.incarnation)
        slot.started_at, slot.restart_at = time.monotonic(), None

    def exited(self) -> Iterator[tuple[AgentSlot, int]]:
        """``(slot, exit code)`` of each running slot whose process has exited; the caller restarts or retires it."""
        for slot in self.slots:
            if slot.running and (code := slot.process.poll()) is not None:
                yield slot, code

    def running(self) -> list[AgentSlot]:
        """The slots whose process has not exited (nor waits for its restart)."""
        return [slot for slot in self.slots if slot.running and slot.process.poll() is None]

    def retire(self, slot: AgentSlot, exit_code: int) -> None:
        """The slot's agent left for good (asked to stop, or the run is gone): no restart."""
        slot.ended_with = exit_code
        slot.held = False

    def restart_later(
        self, slot: AgentSlot, cause: str, exit_code: int | None, *, error: str = "", played: bool = False
    ) -> None:
        """Start ``slot`` again after its backoff, logging why; RunFailed when no restart can help.

        ``cause`` says how the agent ended ("was killed by SIGKILL"), ``error`` what it reported before (a
        traceback), when its owner heard it; ``played``: its owner heard of env steps it played (``failure_streak``).
        """
        if exit_code == exit_codes.CONFIG_ERROR:
            reason = error or f"{cause} (its error is above)"
            raise RunFailed(
                f"agent {slot.agent_id} cannot run: {reason}; fix the agent or its options", exit_codes.CONFIG_ERROR
            )
        detail = f"\n{error}" if error else ""
        self.count.restarts += 1
        if self.count.restarts > self.max_restarts:
            raise RunFailed(
                f"agent {slot.agent_id} {cause}; that is {self.count.restarts} agent failures, more than "
                f"max_restarts={self.max_restarts}: fix the cause above or raise --max-restarts{detail}",
                exit_codes.FAILED,
            )
        now = time.monotonic()
        slot.failure_streak = failure_streak(slot.failure_streak, now - slot.started_at, played=played)
        backoff = restart_backoff(self.restart_backoff_s, slot.failure_streak)
        logger.warning(
            "agent %s %s; restarting it in %.1fs (restart %d of at most %d)%s",
            slot.agent_id,
            cause,
            backoff,
            self.count.restarts,
            self.max_restarts,
            detail,
        )
        slot.restart_at = now + backoff

    def kill_running(self, timeout_s: float) -> None:
        """Kill each agent that has not left by now, though asked to stop ``timeout_s`` ago; wait for all of them."""
        for slot in self.slots:
            if slot.process.poll() is None:
                logger.warning("agent %s did not stop within %.1fs; killing it", slot.agent_id, timeout_s)
                slot.process.kill()
            slot.process.wait()

    def wait(self, timeout_s: float) -> None:
        """Until a running agent exits, the next restart is due, or ``timeout_s`` (at most SUPERVISE_INTERVAL_S)."""
        now = time.monotonic()
        due = [slot.restart_at - now for slot in self.slots if slot.restart_at is not None]
        timeout_s = max(0.0, min([timeout_s, SUPERVISE_INTERVAL_S, *due]))
        running = [slot.process for slot in self.slots if slot.running]
        if not running:
            time.sleep(timeout_s)
            return
        try:
            running[0].wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
