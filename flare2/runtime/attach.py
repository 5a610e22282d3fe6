"""``flare2 attach``: start agents on this machine that join a run managed elsewhere.

It first asks the manager (a probe hello) whether it is there and speaks this
protocol version, so a wrong address, a missing key or another flare2
version ends in a clear error within seconds. Then it starts the agent
processes; each registers with the manager as a remote agent and talks to the
CDPs directly. Ctrl+C (or SIGTERM) detaches them: each says bye and the
manager counts it as gone, not crashed. If the manager goes away, the agents
exit after the heartbeat timeout and so does this command.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from flare2.errors import ConfigError, ReplyTimeoutError, TransportError
from flare2.runtime import exit_codes
from flare2.wire.protocol import HELLO, PROTOCOL_VERSION
from flare2.wire.security import AGENT_CURVE_ENV, CurveClient
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

    def __post_init__(self) -> None:
        if not self.endpoint.startswith("tcp://") or ":" not in self.endpoint[len("tcp://"):]:
            raise ConfigError(f"the manager's address must look like tcp://HOST:PORT, got {self.endpoint!r}")
        if ":" not in self.agent_path:
            raise ConfigError(f"--agent must look like package.module:Class, got {self.agent_path!r}")
        if self.num_agents < 1:
            raise ConfigError(f"--num-agents must be >= 1, got {self.num_agents}")
        if self.envs_per_agent < 1:
            raise ConfigError(f"--envs-per-agent must be >= 1, got {self.envs_per_agent}")


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
    """Probe the manager, start the agents and wait for them; returns the exit code."""
    try:
        info = probe(config)
    except (TransportError, ConfigError) as exc:
        logger.error("%s", exc)
        return exit_codes.UNREACHABLE
    logger.info("manager at %s serves CTs %s; starting %d agent(s)", config.endpoint, sorted(info.get("cts", {})), config.num_agents)
    env = dict(os.environ)
    if config.curve is not None:
        env[AGENT_CURVE_ENV] = config.curve.to_env()
    tag = f"{socket.gethostname()}-{os.getpid()}"[:60]
    processes = []
    for index in range(config.num_agents):
        command = [
            sys.executable, "-m", "flare2.runtime.agent_process",
            "--control", config.endpoint,
            "--agent-id", f"r-{tag}-{index}.{secrets.token_hex(4)}",
            "--agent", config.agent_path,
            "--agent-kwargs", json.dumps(config.agent_kwargs),
            "--seed", str(config.seed * 100_003 + index),
            "--envs-per-agent", str(config.envs_per_agent),
            "--parent-pid", str(os.getpid()),
            "--remote",
        ]
        processes.append(subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True))

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Detach(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        codes = [process.wait() for process in processes]
    except _Detach as detach:
        logger.info("detaching %d agent(s)", sum(process.poll() is None for process in processes))
        _stop(processes, config.stop_timeout_s)
        return exit_codes.OK if detach.signum == signal.SIGINT else 128 + detach.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _stop(processes, config.stop_timeout_s)
    if all(code == exit_codes.MANAGER_LOST for code in codes):
        logger.error("the manager is gone; the agents have exited")
        return exit_codes.MANAGER_LOST
    logger.info("all agents have left (exit codes %s)", codes)
    return exit_codes.OK if all(code == exit_codes.OK for code in codes) else exit_codes.FAILED


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
