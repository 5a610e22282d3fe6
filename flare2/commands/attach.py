"""``flare2 attach``: start agents on this machine that join a run managed elsewhere.

It first asks the manager (a probe hello) whether it is there and speaks this
protocol version, so a wrong address, a missing key or another flare2
version ends in a clear error within seconds. The manager's answer carries the
run's recipe: the agent class and its settings (env, transforms, views,
frames, sample interval...), the envs per agent and the seed; the agents here
play exactly that. An option that would change what reaches the run's CTs
(another ``--agent`` or ``--agent-kwargs``) is refused, naming the setting;
``--envs-per-agent`` and ``--seed`` only change how much is played here and
which episodes, and are allowed (and logged).

Then it starts the agent processes; each registers with the manager as a
remote agent and talks to the CDPs directly. An agent that fails (an exception
in its episode code, a kill) is restarted after a backoff by the same
supervisor as the manager's own agents (:mod:`flare2.runtime.supervisor`), up
to ``--max-restarts``. An agent that lost the manager (a link down for longer
than the heartbeat timeout) is no failure: this command probes the manager
with a backoff and, as soon as the same run answers again, starts a new agent
in its place, which the manager counts as a rejoin; it gives up when the
manager has not answered for ``--rejoin-for`` seconds. Ctrl+C (or SIGTERM)
detaches the agents: each says bye and the manager counts it as gone, not
crashed. When the run ends, the manager stops the agents and this command
ends with them.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from flare2.errors import ConfigError, ReplyTimeoutError, RunFailed, TransportError
from flare2.runtime import exit_codes
from flare2.runtime.config import REJOIN_FOR_S, RunConfig
from flare2.runtime.processes import handle_stop_signals, restore_signal_handlers
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


# While the manager does not answer, probes follow each other after these pauses (then the last one, again and
# again): a link that comes back is noticed within a probe's timeout plus the longest pause.
_REJOIN_PAUSES_S = (0.5, 1.0, 2.0)


@dataclass(frozen=True)
class AttachConfig:
    endpoint: str
    """The manager's control endpoint, tcp://HOST:PORT."""
    agent_path: str | None = None
    """None: the run's agent class (from the manager); another one is refused."""
    agent_kwargs: dict[str, Any] | None = None
    """None: the run's agent settings; settings that differ from the run's are refused."""
    num_agents: int = 1
    envs_per_agent: int | None = None
    """Environments each agent process plays (a VectorAgent such as GymAgent); None: as many as the run's agents."""
    seed: int | None = None
    """None: the run's seed (each attach is given slots of its own, so its agents play other episodes)."""
    curve: CurveClient | None = None
    probe_timeout_s: float = 5.0
    stop_timeout_s: float = 5.0
    max_restarts: int = RunConfig.max_restarts
    """Agent failures (crash, kill) over this command's life that are restarted; past it the command fails."""
    restart_backoff_s: float = RunConfig.restart_backoff_s
    rejoin_for_s: float = REJOIN_FOR_S
    """How long the agents wait for a manager they lost to answer again before this command gives up."""

    def __post_init__(self) -> None:
        if not self.endpoint.startswith("tcp://") or ":" not in self.endpoint[len("tcp://") :]:
            raise ConfigError(f"the manager's address must look like tcp://HOST:PORT, got {self.endpoint!r}")
        if self.agent_path is not None and ":" not in self.agent_path:
            raise ConfigError(f"--agent must look like package.module:Class, got {self.agent_path!r}")
        if self.num_agents < 1:
            raise ConfigError(f"--num-agents must be >= 1, got {self.num_agents}")
        if self.envs_per_agent is not None and self.envs_per_agent < 1:
            raise ConfigError(f"--envs-per-agent must be >= 1, got {self.envs_per_agent}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.rejoin_for_s < 0:
            raise ConfigError(f"--rejoin-for must be >= 0 seconds, got {self.rejoin_for_s}")


@dataclass(frozen=True)
class AgentPlan:
    """What this machine's agents play: the run's recipe, with the overrides that leave its CTs' data unchanged."""

    agent_path: str
    agent_kwargs: dict[str, Any]
    envs_per_agent: int | None
    """None: each process plays its agent class's ``default_envs``, as the run's own agents do."""
    seed: int
    first_slot: int
    """Seeds are drawn as for the run's slots from this one on, which the manager gave this attach alone."""


def plan_agents(config: AttachConfig, recipe: Any) -> AgentPlan:
    """The run's recipe (from the manager's probe reply) with this command's options; a ConfigError names an option
    that would change what reaches the run's CTs."""
    try:
        path, kwargs = recipe["agent"], recipe["agent_kwargs"]
        envs, seed, first_slot = recipe["envs_per_agent"], recipe["seed"], recipe["first_slot"]
        valid = isinstance(path, str) and isinstance(kwargs, dict)
        valid = (
            valid and all(type(value) is int for value in (seed, first_slot)) and (envs is None or type(envs) is int)
        )
    except (TypeError, KeyError):
        valid = False
    if not valid:
        raise ConfigError(
            f"the manager's answer holds no valid run recipe (got {recipe!r}): run the same flare2 version on both sides"
        )
    keep = "leave the option out: attach plays the run's own agent"
    if config.agent_path is not None and config.agent_path != path:
        raise ConfigError(
            f"--agent {config.agent_path}: the run's agents are {path}, and what reaches its CTs must be the same; {keep}"
        )
    for key, value in (config.agent_kwargs or {}).items():
        if key not in kwargs:
            raise ConfigError(f"--agent-kwargs sets {key!r}, which the run's agents leave at its default; {keep}")
        if value != kwargs[key]:
            raise ConfigError(
                f"--agent-kwargs sets {key!r} to {value!r}, the run's agents play with {kwargs[key]!r}; {keep}"
            )
    plan = AgentPlan(
        path,
        kwargs,
        envs if config.envs_per_agent is None else config.envs_per_agent,
        seed if config.seed is None else config.seed,
        first_slot,
    )
    if plan.envs_per_agent != envs:
        run_envs = "its agent class's default" if envs is None else envs
        logger.info("each agent here plays %s envs (the run's agents play %s)", plan.envs_per_agent, run_envs)
    if plan.seed != seed:
        logger.info("the agents here draw their seeds from --seed %d (the run's seed is %d)", plan.seed, seed)
    return plan


def probe(config: AttachConfig) -> dict[str, Any]:
    """Ask the manager who it is, what it serves and what its agents play; raises TransportError/ConfigError with a
    message for the user."""
    return probe_manager(config.endpoint, curve=config.curve, timeout_s=config.probe_timeout_s)


def probe_manager(
    endpoint: str, *, curve: CurveClient | None, timeout_s: float, asks: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The manager's answer to a probe hello (which ``asks`` for more: ``flare2 learn``'s learner ranks); raises
    TransportError/ConfigError with a message for the user."""
    with context() as ctx:
        requester = Requester(ctx, endpoint, identity=f"probe-{secrets.token_hex(6)}", curve=curve)
        try:
            reply = requester.request(
                HELLO, {"role": "probe", **(asks or {})}, timeout_s=timeout_s, what="hello to the manager"
            ).payload
        except ReplyTimeoutError:
            keys = " and that --keys holds the run's keys" if curve else " (a run bound beyond loopback needs --keys)"
            raise TransportError(
                f"no manager answered at {endpoint} within {timeout_s:.0f}s: check the address, "
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
    try:
        plan = plan_agents(config, info.get("recipe"))
    except ConfigError as exc:
        logger.error("%s", exc)
        return exit_codes.CONFIG_ERROR
    logger.info(
        "manager at %s serves CTs %s; starting %d agent(s) of %s with %s env(s) each",
        config.endpoint,
        sorted(info.get("cts", {})),
        config.num_agents,
        plan.agent_path,
        "its class's default number of" if plan.envs_per_agent is None else plan.envs_per_agent,
    )
    agents = _AttachedAgents(config, plan, info.get("run_id"))

    def on_signal(signum: int, _frame: Any) -> None:
        raise _Detach(signum)

    previous = handle_stop_signals(on_signal)
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
        restore_signal_handlers(previous)
        agents.stop()


class _AttachedAgents:
    """This machine's agents: the supervisor starts them and restarts those that fail (the manager's policy: backoff
    and limit); this adds what only attach knows: an agent that lost the manager waits, held, until the same run
    answers a probe again, then a new one rejoins in its place; slots end for good when their agent was stopped by
    the run, or when the manager stays silent past ``rejoin_for_s``."""

    def __init__(self, config: AttachConfig, plan: AgentPlan, run_id: Any) -> None:
        self.config = config
        self.plan = plan
        self.run_id = run_id
        self.supervisor = AgentSupervisor(max_restarts=config.max_restarts, restart_backoff_s=config.restart_backoff_s)
        self.lost_since: float | None = None
        """When an agent last lost the manager, while some wait for it to answer again."""
        self._next_probe_at = 0.0
        self._probes_failed = 0

    def run(self) -> int:
        config, plan = self.config, self.plan
        tag = f"{socket.gethostname()}-{os.getpid()}"[:60]
        launch = AgentLaunch(
            control_endpoint=config.endpoint,
            agent_path=plan.agent_path,
            agent_kwargs=plan.agent_kwargs,
            envs_per_agent=plan.envs_per_agent,
            seed=plan.seed,
            curve=config.curve,
            id_prefix=f"r-{tag}-",
            first_slot=plan.first_slot,
            extra=("--remote",),
        )
        self.supervisor.start_all(launch, config.num_agents)
        while True:
            self.supervisor.restart_due(time.monotonic())
            for slot, code in list(self.supervisor.exited()):
                self._ended(slot, code)
            if self.supervisor.held_slots():
                self._look_for_the_manager()
            codes = [slot.ended_with for slot in self.supervisor.slots]
            if all(code is not None for code in codes):
                if all(code == exit_codes.MANAGER_LOST for code in codes):
                    return exit_codes.MANAGER_LOST
                logger.info("all agents have left (exit codes %s)", codes)
                return exit_codes.OK if all(code == exit_codes.OK for code in codes) else exit_codes.FAILED
            self.supervisor.wait(SUPERVISE_INTERVAL_S)

    def _ended(self, slot: AgentSlot, code: int) -> None:
        """Hold, retire or restart a slot whose agent exited; RunFailed when this command must end too."""
        if code in (exit_codes.MANAGER_LOST, exit_codes.COMPUTE_RESTARTS):
            # A link down for a while, a manager stopped for a while, a compute process restarting: not the agent's
            # failure.
            self.supervisor.hold(slot)
            if self.lost_since is None:
                self.lost_since = self._next_probe_at = time.monotonic()
                self._probes_failed = 0
            logger.warning(
                "agent %s %s; a new one rejoins as soon as the run answers again (for up to %.0fs, --rejoin-for)",
                slot.agent_id,
                "lost the manager"
                if code == exit_codes.MANAGER_LOST
                else "left while the run's compute process restarts",
                self.config.rejoin_for_s,
            )
        elif code == exit_codes.OK:
            self.supervisor.retire(slot, code)
        else:
            self.supervisor.restart_later(slot, exit_codes.describe(code), code)

    def _look_for_the_manager(self) -> None:
        """Probe the manager when the next probe is due: the run answering releases the held slots (as rejoins);
        silence past ``rejoin_for_s``, or another run at the address, ends them."""
        now = time.monotonic()
        if now < self._next_probe_at or self.lost_since is None:
            return
        try:
            info = probe(self.config)
        except (TransportError, ConfigError) as exc:
            silent_s = time.monotonic() - self.lost_since
            if silent_s >= self.config.rejoin_for_s:
                self._give_up(
                    f"the manager has not answered for {silent_s:.0f}s (--rejoin-for {self.config.rejoin_for_s:.0f}): "
                    f"the run is over or out of reach ({exc})"
                )
                return
            pause = _REJOIN_PAUSES_S[min(self._probes_failed, len(_REJOIN_PAUSES_S) - 1)]
            self._probes_failed += 1
            self._next_probe_at = time.monotonic() + pause
            return
        if info.get("run_id") != self.run_id:
            self._give_up(f"{self.config.endpoint} now serves another run than the one these agents joined")
            return
        held = self.supervisor.held_slots()
        logger.info(
            "the manager answers again after %.1fs; %d agent(s) rejoin", time.monotonic() - self.lost_since, len(held)
        )
        self.lost_since = None
        for slot in held:
            self.supervisor.release(slot, "--rejoin")

    def _give_up(self, why: str) -> None:
        logger.error("%s; the agents that lost it are not started again", why)
        for slot in self.supervisor.held_slots():
            self.supervisor.retire(slot, exit_codes.MANAGER_LOST)
        self.lost_since = None

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
