"""The parallel schedule: the compute process and the agent processes, over sockets.

It binds the control endpoint, starts the compute process (spawn start
method: the manager never forks once torch may be loaded) and the local agent
processes, and then, between the Manager's ticks, serves the control socket:
the compute process's hello, stats and checkpoints, the agents' messages
(``agent_desk``), heartbeats, and the supervision of the local agents
(:mod:`flare2.runtime.supervisor`, with the manager's own concerns: the
registry of who is live, byes, heartbeat timeouts). A failure in the compute
process (user code in an Algorithm or Model included) stops the run with its
traceback; a compute process that dies unasked is started again from the
run's last checkpoint (:mod:`flare2.runtime.manager.compute_side`,
docs/architecture.md: Failures).

Stopping is ordered so that no data in flight is lost: agents are stopped
first (each sends its final stats and a bye), then the compute process, which
learns what waits and saves its checkpoints with the final counters before it
says bye. A child that does not leave within ``stop_timeout_s`` is killed.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import zmq

from flare2.errors import DecodeError, RunFailed
from flare2.runtime import exit_codes
from flare2.runtime.compute.compute_process import ComputeSettings
from flare2.runtime.config import RunConfig, is_loopback
from flare2.runtime.manager.agent_desk import AgentDesk
from flare2.runtime.manager.compute_side import ComputeProcess
from flare2.runtime.manager.progress import compute_report_interval_s
from flare2.runtime.manager.registry import AgentRecord, AgentRegistry
from flare2.runtime.manager.schedule import Conductor
from flare2.runtime.processes import COMPUTE_IDENTITY, stop_resource_tracker
from flare2.runtime.run_files import write_run_file
from flare2.runtime.supervisor import SUPERVISE_INTERVAL_S, AgentLaunch, AgentSlot, AgentSupervisor
from flare2.wire.protocol import (
    CHECKPOINT,
    ERROR,
    HELLO,
    STOP,
    Message,
    VersionMismatchError,
    error_payload,
    unpack,
)
from flare2.wire.security import (
    CurveClient,
    CurveServer,
    ephemeral_client,
    load_server,
    start_authenticator,
)
from flare2.wire.sockets import (
    ConnectionWatch,
    bind_router,
    context,
    poll_timeout_ms,
    router_send,
)
from flare2.wire.streams import make_socket_dir

logger = logging.getLogger(__name__)

# Dropped control messages are logged one by one up to this many, then only counted.
_LOGGED_DROPS = 20
_MAX_DRAIN = 1000
# How long the last stats and bye of agents that have exited may take to arrive.
_LAST_WORDS_S = 2.0


class ParallelSchedule:
    """The compute process and the agent processes of a run, and the control socket that joins them."""

    stops_gradually = True

    def __init__(self, config: RunConfig, manager: Conductor) -> None:
        self.config = config
        self.manager = manager
        self.totals = manager.totals
        self.control_endpoint = ""
        self.agents = AgentRegistry()
        self.desk = AgentDesk(config, self.agents, self.totals, self._drop)
        self.supervisor = AgentSupervisor(
            max_restarts=config.max_restarts,
            restart_backoff_s=config.restart_backoff_s,
            count=self.totals,
        )
        self._control: zmq.Socket | None = None
        self._curve_server: CurveServer | None = None
        self._local_curve: CurveClient | None = None
        self._connections: ConnectionWatch | None = None
        self._socket_dir = ""
        self.compute = ComputeProcess(config, self.totals, self._compute_settings)

    @property
    def control(self) -> zmq.Socket:
        if self._control is None:
            raise RuntimeError("the control socket is bound by open(): use the schedule inside `with schedule.open()`")
        return self._control

    # ---- the schedule ----------------------------------------------------------------

    @contextmanager
    def open(self) -> Iterator[None]:
        """The control socket, CURVE when asked for, and the private directory of the local agents' Unix sockets."""
        self._setup_security()
        with context() as ctx, ExitStack() as cleanup:
            if self._curve_server:
                cleanup.callback(start_authenticator(ctx, self._curve_server).stop)
            control, self.control_endpoint = bind_router(
                ctx,
                self.config.bind,
                port=self.config.port,
                max_bytes=self.config.max_message_bytes,
                curve=self._curve_server,
            )
            cleanup.callback(control.close, linger=0)
            self._control = control
            if self._curve_server or not is_loopback(self.config.bind):
                # Other machines can reach this socket: what ZeroMQ does to them unseen is counted and logged.
                self._connections = ConnectionWatch(control, self.config.max_message_bytes)
                cleanup.callback(self._connections.close)
            # The Unix sockets local agents reach the CDPs by, removed as the run ends however the compute process ended.
            self._socket_dir = make_socket_dir()
            cleanup.callback(shutil.rmtree, self._socket_dir, ignore_errors=True)
            yield

    def _setup_security(self) -> None:
        config = self.config
        if config.keys_dir:
            # The run's own processes get a key pair of their own, allowed next to the listed clients.
            self._local_curve, self._curve_server = ephemeral_client(load_server(config.keys_dir))
            logger.info(
                "CURVE on: %d client key(s) allowed from %s/allowed",
                len(self._curve_server.allowed) - 1,
                config.keys_dir,
            )
        elif not is_loopback(config.bind):
            logger.warning(
                "INSECURE: listening on %s without CURVE (--insecure): anyone who reaches this address can join the "
                "run and feed its learning. Use --keys DIR (made by `flare2 keys DIR`) instead.",
                config.bind,
            )

    def start(self) -> None:
        config = self.config
        logger.info("control endpoint %s, log dir %s", self.control_endpoint, config.log_dir)
        if config.agents.num_agents == 0:
            keys = " --keys DIR" if config.keys_dir else ""
            logger.warning(
                "no local agents (--num-agents 0): the run waits for agents attached from other machines with "
                "`flare2 attach %s --agent %s%s`",
                self.control_endpoint,
                config.agents.path,
                keys,
            )
        self.compute.start(config.resume_dir)
        launch = AgentLaunch(
            control_endpoint=self.control_endpoint,
            agent_path=config.agents.path,
            agent_kwargs=config.agents.kwargs,
            envs_per_agent=config.agents.envs_per_agent,
            seed=config.seed,
            curve=self._local_curve,
            extra=("--hello-timeout", str(config.startup_timeout_s)),
        )
        self.supervisor.start_all(launch, config.agents.num_agents)
        for slot in self.supervisor.slots:
            self._listen_to(slot)

    def run(self) -> int:
        """Serve the control socket and supervise the children between the Manager's ticks, until it says stop."""
        control = self.control
        next_heartbeat = time.monotonic()
        while (code := self.manager.tick()) is None:
            now = time.monotonic()
            if self.desk.served is None and now > self.compute.started_at + self.config.startup_timeout_s:
                raise RunFailed(
                    f"the compute process did not come up within {self.config.startup_timeout_s:.0f}s "
                    "(startup_timeout_s): building the Algorithm takes too long or hangs",
                    exit_codes.FAILED,
                )
            if now >= next_heartbeat:
                next_heartbeat = now + self.config.heartbeat_timeout_s / 4
                self.desk.send_heartbeats(control)
            if control.poll(poll_timeout_ms(min(SUPERVISE_INTERVAL_S, max(0.0, self.manager.next_row_at - now)))):
                self._drain(control)
            if self._connections is not None:
                self._connections.check()
                self.totals.closed_connections = self._connections.closed
            self._supervise(control)
            self.desk.supervise_remotes(control)
        return code

    @property
    def ready_to_checkpoint(self) -> bool:
        return self.desk.served is not None and not self.compute.checkpoint_pending

    def checkpoint(self, counters: dict[str, Any]) -> None:
        """Ask the compute process for its checkpoints; the next one waits for its answer."""
        self.compute.checkpoint_pending = True
        router_send(self.control, COMPUTE_IDENTITY.encode(), Message(CHECKPOINT, {"counters": counters}))

    def agent_counts(self) -> tuple[int, int, int]:
        live = self.agents.live()
        remote = sum(agent.remote for agent in live)
        return len(live) - remote, remote, sum(agent.envs for agent in live)

    # ---- children --------------------------------------------------------------------

    def _compute_settings(self, resume_dir: str | None) -> ComputeSettings:
        """The settings of a compute process that loads its CTs from ``resume_dir`` (None: fresh weights)."""
        config = self.config
        seats = self.desk.learner_seats
        return ComputeSettings(
            control_endpoint=self.control_endpoint,
            cts=config.cts,
            device=config.device,
            seed=config.seed,
            bind=config.bind,
            curve_server=self._curve_server,
            curve_client=self._local_curve,
            checkpoint_dir=str(Path(config.log_dir) / "checkpoints"),
            resume_dir=resume_dir,
            torch_threads=config.torch_threads,
            predict_threads=config.predict_threads,
            learner=config.learner,
            learners=seats.learners,
            remote_learners=seats.remote,
            learner_rendezvous=seats.rendezvous,
            startup_timeout_s=config.startup_timeout_s,
            learner_rendezvous_timeout_s=seats.rendezvous_timeout_s,
            busy_wait_us=config.busy_wait_us,
            local_agents=config.agents.num_agents,
            max_message_bytes=config.max_message_bytes,
            parent_pid=os.getpid(),
            stats_interval_s=compute_report_interval_s(config.progress_interval_s),
            socket_dir=self._compute_socket_dir(),
        )

    def _compute_socket_dir(self) -> str:
        """Where the compute process binds its Unix sockets: a restarted one gets a folder of its own, as the dead
        one's sockets are still there (the agents learn where from their welcome)."""
        if not self.compute.restarted:
            return self._socket_dir
        path = os.path.join(self._socket_dir, f"restart{self.totals.compute_restarts}")
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def _listen_to(self, slot: AgentSlot) -> None:
        """The slot's new incarnation is the agent the manager hears under its id now."""
        self.agents.put_local(AgentRecord(slot.agent_id, last_seen=time.monotonic(), slot=slot.index))

    def _restart_compute_if_dead(self, control: zmq.Socket) -> None:
        if self.compute.waits_to_save:
            self.compute.stop_to_save(control, self.totals.counters())
        if (how := self.compute.died()) is not None:
            self._drain(control)  # a failure it reported on its way out ends the run instead
            self.desk.learner_seats.new_group(lost_elsewhere=self.compute.lost_elsewhere)
            self.compute.restart(how)
            self.desk.compute_restarts(control)

    def _regroup_learners_if_asked(self, control: zmq.Socket) -> None:
        """A flare2 learn waits for ranks only a new group has: the compute process stops with its checkpoints, and
        the next one forms that group."""
        compute = self.compute
        if self.desk.learner_seats.wants_to_grow and self.desk.served is not None and not compute.regrouping:
            if not compute.leaving and compute.died() is None:
                compute.regroup(control, self.totals.counters())

    def _supervise(self, control: zmq.Socket) -> None:
        self._regroup_learners_if_asked(control)
        self.desk.holding = self.compute.going
        self._restart_compute_if_dead(control)
        now = time.monotonic()
        for slot in self.supervisor.restart_due(now):
            self._listen_to(slot)
        for slot, code in list(self.supervisor.exited()):
            agent = self.agents.slots[slot.index]
            if code in (exit_codes.CONFIG_ERROR, exit_codes.COMPUTE_FAILED):
                # Its report, and a compute process that died meanwhile (which it may have failed to reach), first.
                self._drain(control)
                self._restart_compute_if_dead(control)
            if code == exit_codes.COMPUTE_RESTARTS or self.desk.welcomed_by_a_gone_compute_process(agent):
                # It left while the compute process restarts (or could not reach the one that welcomed it, dead
                # or going since); its successor starts once the new one serves.
                self.agents.stop_listening(agent)
                self.supervisor.hold(slot)
                self._release_held()
                continue
            if agent.said_bye:
                self.supervisor.retire(slot, code)  # it stopped as it was asked to
                continue
            self.agent_failed(control, agent, slot, exit_codes.describe(code), code)
        timeout_s = self.config.heartbeat_timeout_s
        for slot in self.supervisor.slots:
            agent = self.agents.slots[slot.index]
            if slot.running and agent.registered and now - agent.last_seen > timeout_s:
                slot.process.kill()
                slot.process.wait()
                cause = f"silent for {timeout_s:.0f}s (heartbeat timeout); killed"
                self.agent_failed(control, agent, slot, cause, None)

    def _release_held(self) -> None:
        """Start the successors of the agents that left for a compute restart, once the new compute process serves."""
        held = self.supervisor.held_slots()
        if self.desk.served is None or not held:
            return
        logger.info("%d agent(s) rejoin the restarted compute process", len(held))
        for slot in held:
            self.supervisor.release(slot)
            self._listen_to(slot)

    def agent_failed(
        self, control: zmq.Socket, agent: AgentRecord, slot: AgentSlot, cause: str, exit_code: int | None
    ) -> None:
        """A local agent died or went silent: its slot restarts after the backoff (the supervisor's), the CDPs stop
        waiting for it; RunFailed when no restart can help."""
        if exit_code == exit_codes.MANAGER_LOST and self.desk.served is None:
            raise RunFailed(f"agent {agent.agent_id} could not register with the manager: {cause}", exit_codes.FAILED)
        self.supervisor.restart_later(slot, cause, exit_code, error=agent.error, played=agent.played)
        agent.failed = True
        self.agents.stop_listening(agent)
        self.desk.send_live(control)

    # ---- messages --------------------------------------------------------------------

    def _drain(self, control: zmq.Socket) -> None:
        # Bounded, so that a flooding peer cannot keep the manager from supervising.
        for _ in range(_MAX_DRAIN):
            try:
                frames = control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, frames = frames[0], frames[1:]
            try:
                message = unpack(frames, max_bytes=self.config.max_message_bytes)
            except VersionMismatchError as exc:
                # Answer in this side's version: the peer's decoder then names both versions to its user.
                self._drop(identity, str(exc))
                router_send(control, identity, Message(ERROR, error_payload(str(exc), code="config")))
                continue
            except DecodeError as exc:
                self._drop(identity, f"malformed message: {exc}")
                continue
            try:
                if identity == COMPUTE_IDENTITY.encode():
                    self._on_compute(control, message)
                else:
                    self.desk.on_message(control, identity, message)
            except RunFailed:
                raise
            except Exception:  # a message nobody foresaw must not take the run down
                logger.exception("a %r message from %r could not be handled", message.kind, identity[:64])
                self._drop(identity, f"{message.kind!r} message that could not be handled")

    def _drop(self, identity: bytes, reason: str) -> None:
        self.totals.dropped_messages += 1
        if self.totals.dropped_messages <= _LOGGED_DROPS:
            logger.warning("dropped a control message from %r: %s", identity[:64], reason)
            if self.totals.dropped_messages == _LOGGED_DROPS:
                logger.warning("further dropped control messages are only counted")

    def _on_compute(self, control: zmq.Socket, message: Message) -> None:
        if message.kind == HELLO:
            self._on_compute_hello(control, message.payload)
        else:
            self.compute.on_message(message, self._drop)

    def _on_compute_hello(self, control: zmq.Socket, hello: dict[str, Any]) -> None:
        write_run_file(Path(self.config.log_dir) / "run.json", self.control_endpoint, hello)
        served = hello.get("cts")
        served = served if isinstance(served, dict) else {}
        counters = hello.get("counters")
        if not self.compute.restarted:
            # A restarted compute process continues the run: the manager's counters stand (its steps were played).
            self.manager.compute_is_up(served, counters if isinstance(counters, dict) else {})
        learners = hello.get("learners")
        processes = (
            f"in {learners} learner processes" if type(learners) is int and learners > 1 else "in a learner process"
        )
        learner = {"process": processes, "thread": "in a learner thread"}.get(str(hello.get("learner")))
        logger.info(
            "compute process is up on %s, CTs %s, learn() %s",
            hello.get("device"),
            sorted(served),
            learner or "between predictions",
        )
        self.desk.compute_is_up(control, served, device=str(hello.get("device")))
        self._release_held()
        self.compute.keep_a_spare(str(hello.get("learner")))

    # ---- stopping --------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop agents, then the compute process (which writes the checkpoint); kill what does not leave."""
        control = self.control
        timeout_s = self.config.stop_timeout_s
        # A failed or dead compute process answers no learn request: agents need not wait for those on their way.
        compute_gone = self.compute.gone
        self.desk.stop_all(control, compute_gone=compute_gone)
        running = self.supervisor.running()
        for slot in running:
            router_send(control, slot.agent_id.encode(), Message(STOP, {"compute_gone": compute_gone}))
        started = time.monotonic()
        deadline = started + timeout_s
        while any(slot.process.poll() is None for slot in running) and time.monotonic() < deadline:
            self._drain_quietly(control, 0.05)
        # An agent that stopped cleanly sent its final stats and a bye before it exited; they may still be on
        # their way. The checkpoint's counters must include them.
        deadline = max(deadline, time.monotonic() + _LAST_WORDS_S)
        while any(self._said_no_bye_yet(slot) for slot in running) and time.monotonic() < deadline:
            self._drain_quietly(control, 0.05)
        self._drain_quietly(control, 0.0)
        self.supervisor.kill_running(timeout_s)
        if running:
            logger.info("agents stopped in %.2fs", time.monotonic() - started)
        if self.compute.process is not None:
            serving = self.desk.served is not None
            self.compute.stop(control, serving=serving, counters=self.totals.counters(), timeout_s=timeout_s)
            self._drain_quietly(control, 0.0)
            stop_resource_tracker(timeout_s)
        if self.totals.dropped_messages:
            logger.warning("dropped %d malformed or unexpected control messages", self.totals.dropped_messages)

    def _said_no_bye_yet(self, slot: AgentSlot) -> bool:
        """Whether the agent exited cleanly but its bye has not arrived yet. One stopped before its welcome (the
        compute process failed at start, say) has no stats to send and says none."""
        agent = self.agents.slots[slot.index]
        return slot.process.poll() == 0 and agent.registered and not agent.said_bye

    def _drain_quietly(self, control: zmq.Socket, timeout_s: float) -> None:
        """Take final stats while stopping; a failure report now is only logged."""
        if not control.poll(poll_timeout_ms(timeout_s)):
            return
        try:
            self._drain(control)
        except RunFailed as exc:
            logger.error("while stopping: %s", exc)
