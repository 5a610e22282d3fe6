"""``flare2 attach``: start agents on this machine that join a run managed elsewhere.

It first asks the manager (a probe hello) whether it is there and speaks this
protocol version, so a wrong address, a missing key or another flare2
version ends in a clear error within seconds. Then it starts the agent
processes; each registers with the manager as a remote agent and talks to the
CDPs directly. An agent that fails (an exception in its episode code, a
kill) is restarted after a backoff, as the manager restarts its own, up to
``--max-restarts``. Ctrl+C (or SIGTERM) detaches them: each says bye and the
manager counts it as gone, not crashed. If the manager goes away, the agents
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

from flare2.errors import ConfigError, ReplyTimeoutError, TransportError
from flare2.runtime import exit_codes
from flare2.runtime.config import RunConfig
from flare2.runtime.processes import agent_command
from flare2.runtime.restarts import failure_streak, restart_backoff
from flare2.wire.protocol import HELLO, PROTOCOL_VERSION
from flare2.wire.security import AGENT_CURVE_ENV, CurveClient
from flare2.wire.sockets import Requester, context

logger = logging.getLogger(__name__)

_SUPERVISE_INTERVAL_S = 0.2


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
        if not self.endpoint.startswith("tcp://") or ":" not in self.endpoint[len("tcp://"):]:
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
            keys = " and that --keys holds the run's keys" if config.curve else " (a run bound beyond loopback needs --keys)"
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
    logger.info("manager at %s serves CTs %s; starting %d agent(s)", config.endpoint, sorted(info.get("cts", {})), config.num_agents)
    supervisor = _Supervisor(config)

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Detach(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return supervisor.run()
    except _Detach as detach:
        logger.info("detaching %d agent(s)", sum(process.poll() is None for process in supervisor.processes))
        return exit_codes.OK if detach.signum == signal.SIGINT else 128 + detach.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _stop(supervisor.processes, config.stop_timeout_s)


@dataclass
class _Slot:
    index: int
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    failure_streak: int = 0
    restart_at: float | None = None
    ended_with: int | None = None
    """The exit code that ended this slot for good (stopped by the run, manager gone)."""


class _Supervisor:
    """This machine's agents: started, restarted when they fail (the manager's policy: backoff and limit), until
    each has left for good (stopped by the run, or the manager is gone)."""

    def __init__(self, config: AttachConfig) -> None:
        self.config = config
        self.env = dict(os.environ)
        if config.curve is not None:
            self.env[AGENT_CURVE_ENV] = config.curve.to_env()
        self.tag = f"{socket.gethostname()}-{os.getpid()}"[:60]
        self.slots = [_Slot(index) for index in range(config.num_agents)]
        self.restarts = 0
        self.manager_gone = False

    @property
    def processes(self) -> list[subprocess.Popen]:
        return [slot.process for slot in self.slots if slot.process is not None]

    def _start(self, slot: _Slot) -> None:
        config = self.config
        command = agent_command(
            control_endpoint=config.endpoint, agent_id=f"r-{self.tag}-{slot.index}.{secrets.token_hex(4)}",
            agent_path=config.agent_path, agent_kwargs=config.agent_kwargs, seed=config.seed, slot=slot.index,
            incarnation=self.restarts, envs_per_agent=config.envs_per_agent, extra=("--remote",),
        )
        slot.process = subprocess.Popen(command, env=self.env, stdin=subprocess.DEVNULL, start_new_session=True)
        slot.started_at, slot.restart_at = time.monotonic(), None

    def run(self) -> int:
        for slot in self.slots:
            self._start(slot)
        while True:
            now = time.monotonic()
            for slot in self.slots:
                if slot.restart_at is not None and now >= slot.restart_at:
                    self._start(slot)
                elif slot.ended_with is None and slot.process is not None and slot.restart_at is None:
                    code = slot.process.poll()
                    if code is not None:
                        failed = self._ended(slot, code, now)
                        if failed is not None:
                            return failed
            codes = [slot.ended_with for slot in self.slots]
            if all(code is not None for code in codes):
                if all(code == exit_codes.MANAGER_LOST for code in codes):
                    logger.error("the manager is gone; the agents have exited")
                    return exit_codes.MANAGER_LOST
                logger.info("all agents have left (exit codes %s)", codes)
                return exit_codes.OK if all(code == exit_codes.OK for code in codes) else exit_codes.FAILED
            self._wait_a_little()

    def _ended(self, slot: _Slot, code: int, now: float) -> int | None:
        """Deal with the end of a slot's agent; returns this command's exit code when it must end too."""
        agent_id = slot.process.args[slot.process.args.index("--agent-id") + 1]
        cause = exit_codes.describe(code)
        if code == exit_codes.MANAGER_LOST and self._manager_answers():
            # It lost the manager (stopped for a while, a link that broke) but the run goes on: a new agent joins.
            cause = "lost the manager, which still answers"
        elif code in (exit_codes.OK, exit_codes.MANAGER_LOST):
            slot.ended_with = code
            return None
        if code == exit_codes.CONFIG_ERROR:
            logger.error("agent %s cannot run (its error is above); fix the agent or its options", agent_id)
            return exit_codes.CONFIG_ERROR
        self.restarts += 1
        if self.restarts > self.config.max_restarts:
            logger.error(
                "agent %s %s; that is %d agent failures here, more than --max-restarts %d: fix the cause above",
                agent_id, cause, self.restarts, self.config.max_restarts,
            )
            return exit_codes.FAILED
        slot.failure_streak = failure_streak(slot.failure_streak, now - slot.started_at)
        backoff = restart_backoff(self.config.restart_backoff_s, slot.failure_streak)
        logger.warning(
            "agent %s %s; restarting it in %.1fs (restart %d of at most %d)",
            agent_id, cause, backoff, self.restarts, self.config.max_restarts,
        )
        slot.restart_at = now + backoff
        return None

    def _manager_answers(self) -> bool:
        """Whether the manager still answers a probe; once it did not, the run is taken for gone (no more probes)."""
        if not self.manager_gone:
            try:
                probe(self.config)
            except (TransportError, ConfigError):
                self.manager_gone = True
        return not self.manager_gone

    def _wait_a_little(self) -> None:
        """Until the first running agent exits, or the next restart is due, or 0.2 s have passed."""
        now = time.monotonic()
        due = [slot.restart_at - now for slot in self.slots if slot.restart_at is not None]
        timeout = max(0.0, min([_SUPERVISE_INTERVAL_S, *due]))
        running = [slot.process for slot in self.slots if slot.ended_with is None and slot.restart_at is None]
        try:
            if running:
                running[0].wait(timeout=timeout)
            else:
                time.sleep(timeout)
        except subprocess.TimeoutExpired:
            pass


def _stop(processes: list[subprocess.Popen], timeout_s: float) -> None:
    """SIGTERM: each agent says bye at its next control tick; whatever is left after ``timeout_s`` is killed."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
