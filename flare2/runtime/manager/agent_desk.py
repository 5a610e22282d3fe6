"""The manager's side of the conversation with agents on the control socket.

Hellos of local and remote agents (kept until the compute process is up,
then welcomed with the endpoints each one needs), probes from ``flare2
attach`` (answered with the run's id and its agents' recipe) and ``flare2 learn``
(given learner ranks and the learners' recipe), stats, byes and
errors; the LIVE set each CDP batches by (sent from one place, and only once
the compute process is up); heartbeats; remote agents dropped when silent,
their late stats still counted, and the ones that rejoin in their place
counted.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

import zmq

from flare2.errors import ConfigError
from flare2.runtime.config import RunConfig
from flare2.runtime.manager.learner_seats import LearnerSeats
from flare2.runtime.manager.registry import AgentRecord, AgentRegistry
from flare2.runtime.manager.totals import RunTotals, episode_from_wire
from flare2.runtime.processes import COMPUTE_IDENTITY
from flare2.wire.protocol import (
    BYE,
    ERROR,
    HEARTBEAT,
    HELLO,
    LIVE,
    PROTOCOL_VERSION,
    STATS,
    STOP,
    WELCOME,
    Message,
    error_payload,
    error_text,
)
from flare2.wire.sockets import router_send

logger = logging.getLogger(__name__)

AGENT_CONTROL_INTERVAL_S = 0.25
"""How often agents report to the manager (and notice a STOP or a dead manager)."""
_MAX_REMOTE_AGENTS = 1024
# Ids `flare2 attach` gives its agents: printable, bounded, and never like a local agent's ("a<slot>.<n>.<hex>").
_REMOTE_ID = re.compile(r"r-[A-Za-z0-9_.-]{1,100}")


class AgentDesk:
    """Answers the agents of a run; ``served`` is set (the compute process's CTs) once the compute process is up."""

    def __init__(
        self, config: RunConfig, agents: AgentRegistry, totals: RunTotals, drop: Callable[[bytes, str], None]
    ) -> None:
        self.config = config
        self.agents = agents
        self.totals = totals
        self.drop = drop
        self.served: dict[str, Any] | None = None
        self.holding = False
        """The compute process is on its way out (``ComputeProcess.going``): hellos wait for the next one."""
        self.pending_hellos: list[Message] = []
        self.stopping = False
        self.run_id = secrets.token_hex(8)
        """Tells ``flare2 attach`` that the manager answering after a lost link still runs the run it joined."""
        own = config.agents
        self.recipe = {
            "agent": own.path,
            "agent_kwargs": own.kwargs,
            "envs_per_agent": own.envs_per_agent,
            "seed": config.seed,
        }
        """What the run's own agents play, for ``flare2 attach`` to play the same."""
        self._next_remote_slot = own.num_agents
        self.learner_seats = LearnerSeats(config)

    def compute_is_up(self, control: zmq.Socket, served: dict[str, Any], *, device: str) -> None:
        """The compute process serves these CTs now, on ``device``: welcome the agents that said hello before."""
        self.served, self.holding = served, False
        self.learner_seats.compute_is_up(device)
        pending, self.pending_hellos = self.pending_hellos, []
        for message in pending:
            self._welcome(control, message)

    def compute_restarts(self, control: zmq.Socket) -> None:
        """The compute process died and a new one starts: every agent's requests in flight died with it, so each is
        told to leave (its supervisor, the manager or ``flare2 attach``, starts a new one in its place), and hellos
        wait for the new one to serve."""
        self.served = None
        for agent in self.agents.live():
            router_send(control, agent.agent_id.encode(), Message(STOP, {"compute_gone": True, "rejoin": True}))

    def welcomed_by_a_gone_compute_process(self, agent: AgentRecord) -> bool:
        """Whether the endpoints ``agent`` was welcomed with are those of a compute process that has died since, or
        is on its way out (``holding``): its failure to reach them is no error of its own, and a new agent rejoins
        in its place."""
        return 0 <= agent.welcomed_by != self.totals.compute_restarts or (self.holding and agent.welcomed_by >= 0)

    def stop_all(self, control: zmq.Socket, *, compute_gone: bool = False) -> None:
        """The run is over: agents still waiting for their welcome and attached agents are told to stop (and, with
        ``compute_gone``, not to wait for replies to their learn requests)."""
        self.stopping = True
        pending, self.pending_hellos = self.pending_hellos, []
        for hello in pending:
            router_send(control, hello.agent_id.encode(), Message(STOP, {}, seq=hello.seq))
        for agent in self.agents.remotes.values():
            # The run is over for attached agents too; their `flare2 attach` exits when they have.
            router_send(control, agent.agent_id.encode(), Message(STOP, {"compute_gone": compute_gone}))

    def on_message(self, control: zmq.Socket, identity: bytes, message: Message) -> None:
        """One message from an agent's (or a stranger's) identity on the control socket."""
        agent_id = identity.decode(errors="replace")
        agent = self.agents.by_id(agent_id)
        if agent is None:
            if message.kind == HELLO and not self.stopping:
                self._on_stranger_hello(control, identity, message)
            elif (dropped := self.agents.dropped_remote(agent_id)) is not None:
                self._on_dropped_remote(dropped, identity, message)
            else:
                self.drop(identity, "not an agent of this run (or one that was already restarted)")
            return
        agent.last_seen = time.monotonic()
        if message.kind == HELLO:
            if self.stopping:
                # Answer in place of the welcome, so an agent still starting up leaves at once.
                router_send(control, identity, Message(STOP, {}, seq=message.seq))
            elif self.served is None or self.holding:
                self.pending_hellos.append(message)
            else:
                self._welcome(control, message)
        elif message.kind == STATS:
            self._on_agent_stats(agent, identity, message.payload)
        elif message.kind == BYE:
            if agent.remote:
                logger.info("remote agent %s detached", agent.agent_id)
                self.agents.stop_listening(agent)
            agent.said_bye = True
            self.send_live(control)
        elif message.kind == ERROR and agent.remote:
            self._forget_remote(control, agent, f"failed: {error_text(message)}")
        elif message.kind == ERROR:
            # The agent exits next; supervision restarts it, or fails the run for a config error (unless the error is
            # a compute process that died since its welcome, which supervision finds out first).
            agent.error = error_text(message)
        else:
            self.drop(identity, f"unexpected kind {message.kind!r}")

    def _on_dropped_remote(self, agent: AgentRecord, identity: bytes, message: Message) -> None:
        """What a dropped remote agent sent before its link broke, arriving now that the link is back: its stats
        count (those steps were played); the rest is of no use to an agent no longer in the run."""
        if message.kind == STATS:
            self._on_agent_stats(agent, identity, message.payload)
        else:
            logger.debug("ignored a late %r message of dropped remote agent %s", message.kind, agent.agent_id)

    def _on_stranger_hello(self, control: zmq.Socket, identity: bytes, message: Message) -> None:
        """A probe from `flare2 attach`, or a remote agent joining (CURVE already vetted the peer, off loopback)."""
        role = message.payload.get("role")
        if role == "probe":
            served = self.served or {}
            cts = {name: self._endpoints_for(ct, local=False) for name, ct in served.items()}
            # Each attach draws its agents' seeds from slots of its own, so they play other episodes than the rest.
            recipe = {**self.recipe, "first_slot": self._next_remote_slot}
            self._next_remote_slot += _MAX_REMOTE_AGENTS
            reply = {"protocol_version": PROTOCOL_VERSION, "run_id": self.run_id, "cts": cts, "recipe": recipe}
            if "learners" in message.payload:
                try:
                    asks = message.payload
                    reply["learners"] = self.learner_seats.give(
                        asks["learners"], asks.get("gpus"), asks.get("learn_id"), rejoin=asks.get("rejoin") is True
                    )
                except ConfigError as exc:
                    router_send(
                        control, identity, Message(ERROR, error_payload(str(exc), code="config"), seq=message.seq)
                    )
                    return
            router_send(control, identity, Message(WELCOME, reply, seq=message.seq))
            return
        agent_id = message.agent_id
        valid = (
            role == "agent"
            and message.payload.get("remote") is True
            and agent_id.encode() == identity
            and _REMOTE_ID.fullmatch(agent_id) is not None
        )
        if not valid or len(self.agents.remotes) >= _MAX_REMOTE_AGENTS:
            self.drop(identity, "a hello that is neither a probe nor a remote agent's, or too many remote agents")
            return
        agent = AgentRecord(agent_id, last_seen=time.monotonic())
        self.agents.add_remote(agent)
        rejoining = message.payload.get("rejoin") is True
        self.totals.remote_rejoins += rejoining
        logger.info(
            "remote agent %s (pid %s on %s) %s",
            agent_id,
            message.payload.get("pid"),
            message.payload.get("host"),
            "rejoined in place of one that had lost the manager" if rejoining else "attached",
        )
        if self.served is None or self.holding:
            self.pending_hellos.append(message)
        else:
            self._welcome(control, message)

    def _on_agent_stats(self, agent: AgentRecord, identity: bytes, payload: dict[str, Any]) -> None:
        try:
            steps, episodes = _counted(payload, "steps", "episodes")
            eval_steps, eval_episodes = _counted(payload, "eval_steps", "eval_episodes")
        except (TypeError, ValueError):
            self.drop(identity, "stats with wrong field types")
            return
        self.totals.add_agent_stats(steps, episodes, remote=agent.remote)
        agent.played = agent.played or steps > 0
        self.totals.add_eval_stats(eval_steps, eval_episodes)
        self.totals.round_trips.merge(payload.get("predict_round_trips"))

    def _welcome(self, control: zmq.Socket, hello: Message) -> None:
        agent = self.agents.by_id(hello.agent_id)
        if agent is None:
            return
        served = self.served
        if served is None:  # hellos wait in pending_hellos until the compute process is up
            return
        wanted = hello.payload.get("cts", [])
        unknown = sorted(str(ct) for ct in wanted if ct not in served) if isinstance(wanted, list) else [repr(wanted)]
        if unknown:
            reason = f"agent asks for CT(s) {unknown}, but this run serves {sorted(served)}"
            refusal = Message(ERROR, error_payload(reason, code="config"), seq=hello.seq)
            router_send(control, hello.agent_id.encode(), refusal)
            return
        welcome = {
            "cts": {name: self._endpoints_for(served[name], local=not agent.remote) for name in wanted},
            "control_interval_s": AGENT_CONTROL_INTERVAL_S,
            "heartbeat_timeout_s": self.config.heartbeat_timeout_s,
            "reply_timeout_s": self.config.reply_timeout_s,
            "max_message_bytes": self.config.max_message_bytes,
            "eval_every": self.config.eval_every,
        }
        agent.registered = True
        agent.welcomed_by = self.totals.compute_restarts
        agent.cts = frozenset(wanted)
        envs = hello.payload.get("envs", 1)
        agent.envs = envs if type(envs) is int and envs >= 0 else 0
        # Its heartbeat clock starts now, not when its hello arrived (it may have waited for the compute process).
        agent.last_seen = time.monotonic()
        # The CDPs learn of the agent before it can send its first request.
        self.send_live(control)
        router_send(control, hello.agent_id.encode(), Message(WELCOME, welcome, seq=hello.seq))

    def _endpoints_for(self, ct: dict[str, Any], *, local: bool) -> dict[str, Any]:
        """What an agent needs of a CT: its Unix sockets for an agent of this machine (``local``), else the TCP
        address agents must use (``advertise``, not the one bound)."""
        endpoints = {key: ct[key] for key in ("specs", "learn_ahead")}
        if local and ct.get("local_predict_endpoint"):
            return {
                **endpoints,
                "predict_endpoint": ct["local_predict_endpoint"],
                "learn_endpoint": ct["local_learn_endpoint"],
                "busy_wait_us": ct["busy_wait_us"],
            }
        for key in ("predict_endpoint", "learn_endpoint"):
            endpoints[key] = _with_host(ct[key], self.config.advertise) if self.config.advertise else ct[key]
        return endpoints

    def send_live(self, control: zmq.Socket) -> None:
        """Tell the compute process which agents its batches wait for; the one place a LIVE set goes out."""
        if self.served is None:
            # Not up yet: the welcomes that follow its hello send the set then.
            return
        agents = self.agents.live()
        # Each CT's batches wait only for the agents that ask it.
        cts = {name: sorted(a.agent_id for a in agents if name in a.cts) for name in self.served}
        router_send(control, COMPUTE_IDENTITY.encode(), Message(LIVE, {"cts": cts}))

    def send_heartbeats(self, control: zmq.Socket) -> None:
        for agent in list(self.agents):
            if agent.live:
                router_send(control, agent.agent_id.encode(), Message(HEARTBEAT, {}))

    def supervise_remotes(self, control: zmq.Socket) -> None:
        now = time.monotonic()
        for agent in list(self.agents.remotes.values()):
            if now - agent.last_seen > self.config.heartbeat_timeout_s:
                self._forget_remote(control, agent, f"silent for {self.config.heartbeat_timeout_s:.0f}s (link lost?)")

    def _forget_remote(self, control: zmq.Socket, agent: AgentRecord, why: str) -> None:
        # Remote agents are not restarted here: their machine's `flare2 attach` owns them, and they may attach again.
        logger.warning("remote agent %s %s; dropped from the run", agent.agent_id, why)
        self.totals.remote_dropped += 1
        self.agents.drop_remote(agent)
        self.send_live(control)


def _counted(payload: dict[str, Any], steps_key: str, episodes_key: str) -> tuple[int, list[tuple[float, int, str]]]:
    """A stats message's step count and (return, length, team) episodes (an agent of an older flare2 sends no team);
    TypeError/ValueError when malformed."""
    steps, episodes = payload.get(steps_key, 0), payload.get(episodes_key, [])
    if type(steps) is not int or steps < 0 or not isinstance(episodes, list):
        raise ValueError(f"{steps_key}/{episodes_key} have the wrong types")
    return steps, [episode_from_wire(item) for item in episodes]


def _with_host(endpoint: str, host: str) -> str:
    port = endpoint.rsplit(":", 1)[1]
    return f"tcp://{host}:{port}"
