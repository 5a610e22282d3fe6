"""``flare2 attach``: start agents on this machine that join a run managed elsewhere.

It first asks the manager (a probe hello) whether it is there and speaks this
protocol version, so a wrong address, a missing key or another flare2
version ends in a clear error within seconds. Then it starts the agent
processes; each registers with the manager as a remote agent and talks to the
CDPs directly. An agent that fails (an exception in its episode code, a
kill) is restarted after a backoff by the same supervisor as the manager's
own agents (:mod:`flare2.runtime.supervisor`), up to ``--max-restarts``.
Ctrl+C (or SIGTERM) detaches them: each says bye and the manager counts it as
gone, not crashed. If the manager goes away, the agents
exit after the heartbeat timeout and so does this command.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from flare2.errors import ConfigError, ReplyTimeoutError, RunFailed, TransportError
from flare2.runtime import exit_codes
from flare2.runtime.config import RunConfig
from flare2.runtime.supervisor import (
    SUPERVISE_INTERVAL_S,
    AgentLaunch,
    AgentSlot,
    AgentSupervisor,
)
from flare2.wire.protocol import HELLO, PROTOCOL_VERSION
from flare2.wire.security import CurveClient
from flare2.wire.sockets import Requester, context

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttachConfig:
    endpoint: str
    """The manager's control endpoint, tcp://HOST:PORT."""
    agent_path: str
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    num_agents: int = 1
    envs_per_agent: int = 1
    """Environments each agent process plays (a VectorAgent such as GymAgent)."""
    seed: int = 0
    curve: CurveClient | None = None
    probe_timeout_s: float = 5.0
    stop_timeout_s: float = 5.0
    max_restarts: int = RunConfig.max_restarts
    """Agent failures (crash, kill) over this command's life that are restarted; past it the command fails."""
    restart_backoff_s: float = RunConfig.restart_backoff_s

    def __post_init__(self) -> None:
        if not self.endpoint.startswith("tcp://") or ":" not in self.endpoint[len("tcp://") :]:
            raise ConfigError(f"the manager's address must look like tcp://HOST:PORT, got {self.endpoint!r}")
        if ":" not in self.agent_path:
            raise ConfigError(f"--agent must look like package.module:Class, got {self.agent_path!r}")
        if self.num_agents < 1:
            raise ConfigError(f"--num-agents must be >= 1, got {self.num_agents}")
        if self.envs_per_agent < 1:
            raise ConfigError(f"--envs-per-agent must be >= 1, got {self.envs_per_agent}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {self.max_restarts}")


def probe(config: AttachConfig) -> dict[str, Any]:
    """Ask the manager who it is; raises TransportError/ConfigError with a message for the user."""
    with context() as ctx:
        requester = Requester(ctx, config.endpoint, identity=f"probe-{secrets.token_hex(6)}", curve=config.curve)
        try:
            reply = requester.request(
                HELLO, {"role": "probe"}, timeout_s=config.probe_timeout_s, what="hello to the manager"
            ).payload
        except ReplyTimeoutError:
            keys = (
                " and that --keys holds the run's keys"
                if config.curve
                else " (a run bound beyond loopback needs --keys)"
            )
            raise TransportError(
                f"no manager answered at {config.endpoint} within {config.probe_timeout_s:.0f}s: check the address, "
                f"that the run is up and that the port is reachable{keys}"
            ) from None
        finally:
            requester.close()
    if reply.get("protocol_version") != PROTOCOL_VERSION:
        raise ConfigError(
            f"the manager speaks flare2 protocol {reply.get('protocol_version')}, this side speaks {PROTOCOL_VERSION}: "
            "install the same flare2 version on both machines"
        )
    return reply


class _Detach(Exception):
    def __init__(self, signum: int) -> None:
        self.signum = signum


def attach(config: AttachConfig) -> int:
    """Probe the manager, start the agents and supervise them until they leave; returns the exit code."""
    try:
        info = probe(config)
    except (TransportError, ConfigError) as exc:
        logger.error("%s", exc)
        return exit_codes.UNREACHABLE
    logger.info(
        "manager at %s serves CTs %s; starting %d agent(s)",
        config.endpoint,
        sorted(info.get("cts", {})),
        config.num_agents,
    )
    agents = _AttachedAgents(config)

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Detach(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return agents.run()
    except RunFailed as exc:
        logger.error("%s", exc)
        return exc.exit_code
    except _Detach as detach:
        logger.info("detaching %d agent(s)", len(agents.supervisor.running()))
        # Ctrl+C is how a user detaches: that is a success.
        return exit_codes.OK if detach.signum == signal.SIGINT else exit_codes.stopped_by(detach.signum)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        agents.stop()


class _AttachedAgents:
    """This machine's agents: the supervisor starts them and restarts those that fail (the manager's policy: backoff
    and limit); this adds what only attach knows: an agent that lost the manager is restarted while the manager
    still answers a probe, and each slot ends for good when its agent was stopped by the run or the manager is gone."""

    def __init__(self, config: AttachConfig) -> None:
        self.config = config
        self.supervisor = AgentSupervisor(max_restarts=config.max_restarts, restart_backoff_s=config.restart_backoff_s)
        self.manager_gone = False

    def run(self) -> int:
        config = self.config
        tag = f"{socket.gethostname()}-{os.getpid()}"[:60]
        launch = AgentLaunch(
            control_endpoint=config.endpoint,
            agent_path=config.agent_path,
            agent_kwargs=config.agent_kwargs,
            envs_per_agent=config.envs_per_agent,
            seed=config.seed,
            curve=config.curve,
            id_prefix=f"r-{tag}-",
            extra=("--remote",),
        )
        self.supervisor.start_all(launch, config.num_agents)
        while True:
            self.supervisor.restart_due(time.monotonic())
            for slot, code in list(self.supervisor.exited()):
                self._ended(slot, code)
            codes = [slot.ended_with for slot in self.supervisor.slots]
            if all(code is not None for code in codes):
                if all(code == exit_codes.MANAGER_LOST for code in codes):
                    logger.error("the manager is gone; the agents have exited")
                    return exit_codes.MANAGER_LOST
                logger.info("all agents have left (exit codes %s)", codes)
                return exit_codes.OK if all(code == exit_codes.OK for code in codes) else exit_codes.FAILED
            self.supervisor.wait(SUPERVISE_INTERVAL_S)

    def _ended(self, slot: AgentSlot, code: int) -> None:
        """Retire or restart a slot whose agent exited; RunFailed when this command must end too."""
        cause = exit_codes.describe(code)
        if code == exit_codes.MANAGER_LOST and self._manager_answers():
            # It lost the manager (stopped for a while, a link that broke) but the run goes on: a new agent joins.
            cause = "lost the manager, which still answers"
        elif code in (exit_codes.OK, exit_codes.MANAGER_LOST):
            self.supervisor.retire(slot, code)
            return
        self.supervisor.restart_later(slot, cause, code)

    def _manager_answers(self) -> bool:
        """Whether the manager still answers a probe; once it did not, the run is taken for gone (no more probes)."""
        if not self.manager_gone:
            try:
                probe(self.config)
            except (TransportError, ConfigError):
                self.manager_gone = True
        return not self.manager_gone

    def stop(self) -> None:
        """SIGTERM: each agent says bye at its next control tick; whatever is left after ``stop_timeout_s`` is
        killed."""
        running = self.supervisor.running()
        for slot in running:
            slot.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.config.stop_timeout_s
        for slot in running:
            try:
                slot.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self.supervisor.kill_running(self.config.stop_timeout_s)
