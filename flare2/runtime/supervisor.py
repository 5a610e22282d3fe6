"""The manager's local agent processes: started in their slots, watched, restarted after a failure.

An agent that dies, raises in its episode code or goes silent for
``heartbeat_timeout_s`` is started again as a new incarnation of its slot (a
new agent id, so nothing meant for its predecessor reaches it), after the
backoff of :mod:`flare2.runtime.restarts`, up to ``max_restarts`` for the run.
Deaths that no restart can cure (a configuration error, an agent that never
reached the manager) end the run instead.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import time
from collections.abc import Iterator

from flare2.errors import RunFailed
from flare2.runtime import exit_codes
from flare2.runtime.config import RunConfig
from flare2.runtime.processes import agent_command
from flare2.runtime.manager.progress import RunTotals
from flare2.runtime.manager.registry import AgentRecord, AgentRegistry
from flare2.runtime.restarts import failure_streak, restart_backoff
from flare2.wire.security import AGENT_CURVE_ENV, CurveClient

logger = logging.getLogger(__name__)


class AgentSupervisor:
    """Starts the local agents in ``agents`` and applies the restart policy to their failures."""

    def __init__(self, config: RunConfig, agents: AgentRegistry, totals: RunTotals) -> None:
        self.config = config
        self.agents = agents
        self.totals = totals
        self.control_endpoint = ""
        self.local_curve: CurveClient | None = None

    def start_all(self, control_endpoint: str, local_curve: CurveClient | None) -> None:
        self.control_endpoint, self.local_curve = control_endpoint, local_curve
        for slot in range(self.config.agents.num_agents):
            self.agents.put_local(self._start(slot, incarnation=0))

    def _start(self, slot: int, incarnation: int) -> AgentRecord:
        config = self.config
        # Each start is a new incarnation with its own id, so it is a new peer for the CDPs; the random
        # part keeps another peer from taking the id (ZeroMQ refuses a second connection with it).
        agent_id = f"a{slot}.{incarnation}.{secrets.token_hex(4)}"
        command = agent_command(
            control_endpoint=self.control_endpoint, agent_id=agent_id, agent_path=config.agents.path,
            agent_kwargs=config.agents.kwargs, seed=config.seed, slot=slot, incarnation=incarnation,
            envs_per_agent=config.agents.envs_per_agent, extra=("--hello-timeout", str(config.startup_timeout_s)),
        )
        env = dict(os.environ)
        if self.local_curve is not None:
            env[AGENT_CURVE_ENV] = self.local_curve.to_env()
        # A file.py:Class agent path is resolved against the manager's working directory.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
        # A session of its own keeps the terminal's Ctrl+C away from the agent: the manager stops it with STOP.
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        now = time.monotonic()
        return AgentRecord(slot, incarnation, agent_id, process, last_seen=now, started_at=now)

    def failures(self, now: float) -> Iterator[tuple[AgentRecord, str, int | None]]:
        """Start the successors that are due, and yield ``(agent, cause, exit code)`` for each agent that died or went
        silent since the last call (a silent one is killed first; its exit code is None)."""
        for agent in list(self.agents.slots):
            if agent.restart_at is not None:
                if now >= agent.restart_at:
                    successor = self._start(agent.slot, agent.incarnation + 1)
                    successor.failure_streak = agent.failure_streak
                    self.agents.put_local(successor)
                continue
            code = agent.process.poll()
            if code is not None and not agent.said_bye:
                yield agent, exit_codes.describe(code), code
            elif agent.registered and now - agent.last_seen > self.config.heartbeat_timeout_s:
                agent.process.kill()
                agent.process.wait()
                yield agent, f"silent for {self.config.heartbeat_timeout_s:.0f}s (heartbeat timeout); killed", None

    def restart_later(self, agent: AgentRecord, cause: str, exit_code: int | None, *, compute_up: bool) -> None:
        """Schedule the restart of a failed agent's slot, or raise RunFailed when no restart can help."""
        detail = f"\n{agent.error}" if agent.error else ""
        if exit_code == exit_codes.CONFIG_ERROR:
            raise RunFailed(f"agent {agent.agent_id} cannot run: {agent.error or cause}", exit_codes.CONFIG_ERROR)
        if exit_code == exit_codes.MANAGER_LOST and not compute_up:
            raise RunFailed(f"agent {agent.agent_id} could not register with the manager: {cause}", exit_codes.FAILED)
        totals = self.totals
        totals.restarts += 1
        if totals.restarts > self.config.max_restarts:
            raise RunFailed(
                f"agent {agent.agent_id} {cause}; that is {totals.restarts} agent failures, more than "
                f"max_restarts={self.config.max_restarts}: fix the cause above or raise --max-restarts{detail}",
                exit_codes.FAILED,
            )
        now = time.monotonic()
        agent.failure_streak = failure_streak(agent.failure_streak, now - agent.started_at)
        backoff = restart_backoff(self.config.restart_backoff_s, agent.failure_streak)
        logger.warning(
            "agent %s %s; restarting it in %.1fs (restart %d of at most %d)%s",
            agent.agent_id, cause, backoff, totals.restarts, self.config.max_restarts, detail,
        )
        agent.restart_at = now + backoff
        self.agents.stop_listening(agent)
