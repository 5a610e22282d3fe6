"""The agent process: one Agent, its envs, and its sockets. Imports no torch.

Started by the manager (``python -m flare2.runtime.agents.agent_process ...``) or by
``flare2 attach`` on another machine; both paths run :func:`run_agent`. The
agent registers with the manager (hello/welcome: specs and CDP endpoints),
then plays: episode after episode for an ``Agent``, ``run()`` for a
``VectorAgent`` with its ``--envs-per-agent`` envs. Learn requests go out
without waiting for their reply while the CT's ``learn_ahead`` allows. Between
steps, at most every ``control_interval_s``, it
reports counters to the manager and looks for a STOP; while it waits for a
reply it does the same, so a STOP or a dead manager is noticed even when a
CDP never answers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import zmq

from flare2.core.agent import AgentBase
from flare2.core.helpers import AgentHelper
from flare2.core.specs import CTSpecs
from flare2.errors import ConfigError, DecodeError, FlareError, PeerDiedError, RemoteError, ReplyTimeoutError
from flare2.runtime import exit_codes
from flare2.runtime.agents.episodes import EpisodeStats
from flare2.runtime.agents.playing import StopRequested, check_request_sizes, make_agent, make_envs, play
from flare2.runtime.agents.socket_port import SocketPort
from flare2.runtime.latency import LatencyHistogram
from flare2.runtime.processes import configure_child_logging, die_with_parent, ignore_stop_signals
from flare2.wire.protocol import BYE, ERROR, HELLO, STATS, STOP, error_payload, unpack
from flare2.wire.security import AGENT_CURVE_ENV, CurveClient
from flare2.wire.sockets import Requester, context

logger = logging.getLogger(__name__)


# At a stop, how long an agent waits for the learn requests it already sent, so their steps are learned.
_FINISH_LEARNING_S = 2.0


@dataclass(frozen=True)
class AgentSettings:
    control_endpoint: str
    agent_id: str
    agent_path: str
    agent_kwargs: dict[str, Any]
    seed: int
    envs_per_agent: int | None = None
    """Environments this process plays; None: the agent class's ``default_envs``."""
    parent_pid: int = 0
    """PID of the process that started this one (manager or ``flare2 attach``), to die with; 0 for none."""
    hello_timeout_s: float = 10.0
    remote: bool = False
    """Started by ``flare2 attach``: the manager registers it as a remote agent."""
    curve: CurveClient | None = None
    rejoining: bool = False
    """Started by ``flare2 attach`` in place of an agent that lost the manager (the manager counts the rejoin)."""


_terminate_requested = False


def _on_sigterm(_signum: int, _frame: Any) -> None:
    # Only a flag: raising here could cut a multipart send in half. The next control service stops the agent.
    global _terminate_requested
    _terminate_requested = True


class _Control:
    """The agent's link to the manager: stats (which double as heartbeats), stop requests, manager liveness."""

    def __init__(
        self, requester: Requester, settings: AgentSettings, interval_s: float, manager_timeout_s: float
    ) -> None:
        self.requester = requester
        self.settings = settings
        self.interval_s = interval_s
        self.manager_timeout_s = manager_timeout_s
        self.stats: EpisodeStats | None = None
        self.round_trips = LatencyHistogram()
        now = time.monotonic()
        self._next_at = now + interval_s
        self._last_heard = now

    def maybe_service(self) -> None:
        if time.monotonic() >= self._next_at:
            self.service()

    def service(self) -> None:
        now = time.monotonic()
        self._next_at = now + self.interval_s
        if _terminate_requested:
            raise StopRequested()
        if self.settings.parent_pid and os.getppid() != self.settings.parent_pid:
            raise PeerDiedError("the manager process is gone")
        self.send_stats()
        sock = self.requester.socket
        while sock.poll(0):
            try:
                message = unpack(sock.recv_multipart(), max_bytes=1 << 20)
            except DecodeError as exc:
                logger.warning("dropped a malformed control message: %s", exc)
                continue
            self._last_heard = now
            if message.kind == STOP:
                raise StopRequested(
                    learn_replies=message.payload.get("compute_gone") is not True,
                    rejoin=message.payload.get("rejoin") is True,
                )
        if now - self._last_heard > self.manager_timeout_s:
            raise PeerDiedError(f"no word from the manager for {self.manager_timeout_s:.0f}s")

    def send_stats(self) -> None:
        if self.stats is not None:
            report = {"role": "agent", **self.stats.take(), "predict_round_trips": self.round_trips.take()}
            self.requester.send(STATS, report)

    @contextmanager
    def beating(self) -> Iterator[None]:
        """Heartbeats (reports of nothing played) from a thread of their own while this thread is in user code
        that cannot service the link: making 64 Atari envs takes longer than the heartbeat timeout, and slow is
        not dead. Nothing else uses the link meanwhile; the thread is joined before anything does again."""
        done = threading.Event()
        nothing = {"role": "agent", **EpisodeStats().take(), "predict_round_trips": LatencyHistogram().take()}

        def beat() -> None:
            while not done.wait(self.interval_s):
                self.requester.send(STATS, nothing)

        thread = threading.Thread(target=beat, name="flare2-heartbeats", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


def run_agent(settings: AgentSettings) -> int:
    """Run one agent until the manager stops it; returns the process exit code."""
    if settings.parent_pid:
        die_with_parent(settings.parent_pid)
    ignore_stop_signals()
    signal.signal(signal.SIGTERM, _on_sigterm)
    with context() as ctx:
        requester = Requester(ctx, settings.control_endpoint, identity=settings.agent_id, curve=settings.curve)
        try:
            return _run(ctx, requester, settings)
        finally:
            requester.close()


def _report(requester: Requester, payload: dict[str, str]) -> None:
    requester.send(ERROR, payload)
    # A lingering close lets ZeroMQ deliver the error before the process ends.
    requester.socket.setsockopt(zmq.LINGER, 2000)


@dataclass
class _Welcome:
    """The agent made, and what the manager's welcome settles for it."""

    agent: AgentBase
    helpers: dict[str, AgentHelper]
    payload: dict[str, Any]
    interval_s: float
    manager_timeout_s: float
    max_bytes: int
    eval_every: int


def _run(ctx: zmq.Context, requester: Requester, settings: AgentSettings) -> int:
    welcome = _join(requester, settings)
    if isinstance(welcome, int):
        return welcome
    control = _Control(requester, settings, interval_s=welcome.interval_s, manager_timeout_s=welcome.manager_timeout_s)
    ports: dict[str, SocketPort] = {}
    try:
        _connect(ctx, welcome, control, ports, settings)
        play(welcome.agent, control.maybe_service)
    except Exception as exc:  # noqa: BLE001 - the user's episode code may raise anything; _ended says how it ended
        return _ended(exc, requester, control, ports, settings)
    finally:
        for port in ports.values():
            port.close()


def _join(requester: Requester, settings: AgentSettings) -> _Welcome | int:
    """Make the agent and say hello to the manager: its welcome, or the exit code of an agent that cannot start."""
    try:
        agent = make_agent(settings.agent_path, settings.agent_kwargs, settings.envs_per_agent)
        if "torch" in sys.modules:
            logger.warning(
                "agent module of %s imports torch: agent processes then start slower and use about 140 MB more; "
                "keep Agent classes in modules that do not import torch",
                settings.agent_path,
            )
        helpers: dict[str, AgentHelper] = agent.helpers()
        welcome = requester.request(
            HELLO,
            {
                "role": "agent",
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "cts": sorted(helpers),
                "remote": settings.remote,
                "rejoin": settings.rejoining,
                "envs": agent.num_envs,
            },
            timeout_s=settings.hello_timeout_s,
            what="hello to the manager",
        )
        if welcome.kind == STOP:
            return exit_codes.OK
        # The manager's settings, never restated here: a welcome without one comes from another flare2.
        interval_s, manager_timeout_s = (
            _welcome_number(welcome.payload, key, float) for key in ("control_interval_s", "heartbeat_timeout_s")
        )
        max_bytes, eval_every = (
            int(_welcome_number(welcome.payload, key, int)) for key in ("max_message_bytes", "eval_every")
        )
    except ReplyTimeoutError:
        logger.error(
            "cannot reach the manager at %s within %.0fs: check the address, that the run is up, and the keys",
            settings.control_endpoint,
            settings.hello_timeout_s,
        )
        return exit_codes.MANAGER_LOST
    except FlareError as exc:
        logger.error("agent %s cannot start: %s", settings.agent_id, exc)
        _report(requester, error_payload(str(exc), code="config"))
        return exit_codes.CONFIG_ERROR
    return _Welcome(agent, helpers, welcome.payload, interval_s, manager_timeout_s, max_bytes, eval_every)


def _connect(
    ctx: zmq.Context,
    welcome: _Welcome,
    control: _Control,
    ports: dict[str, SocketPort],
    settings: AgentSettings,
) -> None:
    """Open a port to each CT's CDP (into ``ports``, which the caller closes), make the envs and hand both to the
    agent."""
    cts = welcome.payload["cts"]
    specs = {name: CTSpecs.from_wire(cts[name]["specs"]) for name in welcome.helpers}
    for name in welcome.helpers:
        ports[name] = SocketPort(
            ctx,
            name,
            cts[name],
            specs[name],
            settings.agent_id,
            control,
            _reply_timeout(welcome.payload),
            welcome.max_bytes,
            settings.curve,
        )
    with control.beating():
        control.stats = make_envs(welcome.agent, welcome.eval_every)
    welcome.agent.connect(
        agent_id=settings.agent_id, seed=settings.seed, specs=specs, ports=ports, helpers=welcome.helpers
    )
    check_request_sizes(welcome.helpers, specs, {name: ports[name].learner.max_bytes for name in welcome.helpers})


def _ended(
    exc: Exception, requester: Requester, control: _Control, ports: dict[str, SocketPort], settings: AgentSettings
) -> int:
    """The exit code of an agent whose play ended with ``exc`` (called while it is handled), after telling the
    manager what it needs to hear."""
    if isinstance(exc, StopRequested):
        if exc.learn_replies:
            for port in ports.values():
                port.finish_learning(timeout_s=_FINISH_LEARNING_S)
        control.send_stats()
        requester.send(BYE, {"reason": "the compute process restarts" if exc.rejoin else "stopped"})
        requester.socket.setsockopt(zmq.LINGER, 2000)
        return exit_codes.COMPUTE_RESTARTS if exc.rejoin else exit_codes.OK
    if isinstance(exc, PeerDiedError):
        logger.error("agent %s: %s; exiting", settings.agent_id, exc)
        return exit_codes.MANAGER_LOST
    if isinstance(exc, ReplyTimeoutError):
        logger.error(
            "agent %s: %s (--reply-timeout), though the manager still vouched for the compute process: raise "
            "--reply-timeout or leave it unset, or find what keeps predict() or learn() busy that long",
            settings.agent_id,
            exc,
        )
        return exit_codes.REPLY_TIMEOUT
    if isinstance(exc, RemoteError):
        # The compute process reports the failure to the manager, which stops the run and shows the traceback.
        logger.error("agent %s: %s", settings.agent_id, str(exc).splitlines()[0])
        return exit_codes.COMPUTE_FAILED
    if isinstance(exc, FlareError):
        logger.error("agent %s: %s", settings.agent_id, exc)
        _report(requester, error_payload(str(exc), code="config"))
        return exit_codes.CONFIG_ERROR
    control.send_stats()  # the steps it played still count
    text = traceback.format_exc()
    logger.error("agent %s raised in its episode code:\n%s", settings.agent_id, text)
    _report(requester, error_payload(f"agent {settings.agent_id} raised {exc!r}", traceback=text, code="user_code"))
    return exit_codes.FAILED


def _welcome_number(welcome: dict[str, Any], key: str, kind: type[int | float]) -> float:
    value = welcome.get(key)
    if type(value) not in (int, kind) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(
            f"the manager's welcome has no valid {key!r} (got {value!r}): run the same flare2 version on both sides"
        )
    return kind(value)


def _reply_timeout(welcome: dict[str, Any]) -> float | None:
    """The welcome's limit on one CDP reply: None (no limit) unless it names a positive number of seconds."""
    value = welcome.get("reply_timeout_s")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one flare2 agent process (the manager starts these).")
    parser.add_argument("--control", required=True, help="manager control endpoint, tcp://HOST:PORT")
    parser.add_argument("--agent-id", required=True)
    parser.add_argument("--agent", required=True, help="package.module:Class or file.py:Class")
    parser.add_argument("--agent-kwargs", default="{}", help="JSON object of keyword arguments")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--envs-per-agent", type=int, default=None, help="environments this process plays (default: its class's)"
    )
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--hello-timeout", type=float, default=10.0, help="seconds to wait for the manager's welcome")
    parser.add_argument("--remote", action="store_true", help="started by flare2 attach on another machine")
    parser.add_argument("--rejoin", action="store_true", help="replaces a remote agent that lost the manager")
    args = parser.parse_args(argv)
    configure_child_logging()
    try:
        kwargs = json.loads(args.agent_kwargs)
    except json.JSONDecodeError as exc:
        parser.error(f"--agent-kwargs is not valid JSON: {exc}")
    if not isinstance(kwargs, dict):
        parser.error("--agent-kwargs must be a JSON object")
    curve_env = os.environ.get(AGENT_CURVE_ENV)
    try:
        curve = CurveClient.from_env(curve_env) if curve_env else None
    except ConfigError as exc:
        logger.error("%s", exc)
        return exit_codes.CONFIG_ERROR
    settings = AgentSettings(
        args.control,
        args.agent_id,
        args.agent,
        kwargs,
        args.seed,
        args.envs_per_agent,
        args.parent_pid,
        args.hello_timeout,
        args.remote,
        curve,
        args.rejoin,
    )
    return run_agent(settings)


if __name__ == "__main__":
    sys.exit(main())
