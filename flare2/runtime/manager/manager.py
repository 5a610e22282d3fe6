"""The Manager: control plane of a run.

It binds the control endpoint, starts the compute process (spawn start
method: the manager never forks once torch may be loaded) and the agent
processes, supervises them, aggregates stats into progress lines and
``progress.csv``, asks for checkpoints, and stops everything at the budget or
on Ctrl+C/SIGTERM. Its parts live next to it: the agents it knows
(``registry``), what it tells them and hears from them (``agent_desk``), how
local agents are started and restarted (``supervisor`` with the policy of
``restarts``), the checkpoint schedule (``checkpoints``) and the files of the
run (``run_files``).

Supervision (docs/architecture.md: Failures): the local agents' restarts are the supervisor's
(``supervisor``); a failure in the compute process (user code in an Algorithm
or Model included) stops the run with its traceback.

Stopping is ordered so that no data in flight is lost: agents are stopped
first (each sends its final stats and a bye), then the compute process, which
saves its checkpoints with the final counters before it says bye. A child
that does not leave within ``stop_timeout_s`` is killed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import zmq

from flare2.errors import ConfigError, DecodeError, RunFailed
from flare2.runtime import exit_codes
from flare2.runtime.manager.agent_desk import AgentDesk
from flare2.runtime.manager.registry import AgentRegistry
from flare2.runtime.supervisor import AgentSupervisor
from flare2.runtime.run_files import record_run, run_logs_and_signals, write_run_file
from flare2.runtime.checkpoints import CheckpointSchedule, resume_checkpoint_path, resuming_in_place
from flare2.runtime.compute.compute_process import ComputeSettings, compute_main
from flare2.runtime.config import RunConfig, is_loopback
from flare2.runtime.manager.progress import ProgressLog, RunTotals, summary_line, wandb_logging
from flare2.runtime.processes import COMPUTE_IDENTITY, stop_resource_tracker
from flare2.wire.protocol import (
    BYE, CHECKPOINT, ERROR, HELLO, STATS, STOP, Message, VersionMismatchError, error_payload, error_text, unpack,
)
from flare2.wire.security import CurveClient, CurveServer, ephemeral_client, load_server, start_authenticator
from flare2.wire.sockets import ConnectionWatch, bind_router, context, poll_timeout_ms, router_send

logger = logging.getLogger(__name__)

# The manager wakes at least this often to look at its children.
_SUPERVISE_INTERVAL_S = 0.2
# Dropped control messages are logged one by one up to this many, then only counted.
_LOGGED_DROPS = 20
_MAX_DRAIN = 1000
# How long the last stats and bye of agents that have exited may take to arrive.
_LAST_WORDS_S = 2.0


class Manager:
    """Runs one :class:`RunConfig` to its budget: ``Manager(config).run()`` returns the exit code."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.log_dir = Path(config.log_dir)
        self.checkpoint_dir = self.log_dir / "checkpoints"
        self.totals = RunTotals()
        self.control_endpoint = ""
        self._stop_signal: int | None = None
        self.agents = AgentRegistry()
        self.desk = AgentDesk(config, self.agents, self.totals, self._drop)
        self.supervisor = AgentSupervisor(config, self.agents, self.totals)
        self._curve_server: CurveServer | None = None
        self._connections: ConnectionWatch | None = None
        self._socket_dir = ""
        self._local_curve: CurveClient | None = None
        self._compute: multiprocessing.process.BaseProcess | None = None
        self._progress: ProgressLog | None = None
        self._checkpoint_pending = False
        self._compute_failed = False
        self._checkpoints = CheckpointSchedule(config)

    # ---- public ----------------------------------------------------------------------

    def run(self) -> int:
        """Start the run, supervise it to the end and return the process exit code."""
        if self.config.serial:
            from flare2.runtime.manager.serial import SerialRun

            return SerialRun(self.config).run()
        with run_logs_and_signals(self.log_dir, self._on_signal), wandb_logging(self.config):
            try:
                code = self._run_with_logs()
            finally:
                if self._progress is not None:
                    self._progress.close()
            logger.info("%s", summary_line(exit_codes.outcome(code), self.totals, self.log_dir))
            return code

    def _run_with_logs(self) -> int:
        try:
            if self.config.resume_dir:
                for ct in self.config.cts:
                    resume_checkpoint_path(self.config.resume_dir, ct.name)
            self._setup_security()
            with context() as ctx, ExitStack() as cleanup:
                if self._curve_server:
                    cleanup.callback(start_authenticator(ctx, self._curve_server).stop)
                control, self.control_endpoint = bind_router(
                    ctx, self.config.bind, port=self.config.port, max_bytes=self.config.max_message_bytes,
                    curve=self._curve_server,
                )
                cleanup.callback(control.close, linger=0)
                if self._curve_server or not is_loopback(self.config.bind):
                    # Other machines can reach this socket: what ZeroMQ does to them unseen is counted and logged.
                    self._connections = ConnectionWatch(control, self.config.max_message_bytes)
                    cleanup.callback(self._connections.close)
                # The Unix sockets local agents reach the CDPs by: mode 0700, removed as the run ends however
                # the compute process ended.
                self._socket_dir = tempfile.mkdtemp(prefix="flare2-")
                cleanup.callback(shutil.rmtree, self._socket_dir, ignore_errors=True)
                try:
                    return self._run(control)
                finally:
                    self._shutdown(control)
        except ConfigError as exc:
            logger.error("%s", exc)
            return exit_codes.CONFIG_ERROR

    def _setup_security(self) -> None:
        config = self.config
        if config.keys_dir:
            # The run's own processes get a key pair of their own, allowed next to the listed clients.
            self._local_curve, self._curve_server = ephemeral_client(load_server(config.keys_dir))
            logger.info("CURVE on: %d client key(s) allowed from %s/allowed", len(self._curve_server.allowed) - 1, config.keys_dir)
        elif not is_loopback(config.bind):
            logger.warning(
                "INSECURE: listening on %s without CURVE (--insecure): anyone who reaches this address can join the "
                "run and feed its learning. Use --keys DIR (made by `flare2 keys DIR`) instead.", config.bind,
            )

    # ---- the run ---------------------------------------------------------------------

    def _run(self, control: zmq.Socket) -> int:
        config = self.config
        logger.info("control endpoint %s, log dir %s", self.control_endpoint, self.log_dir)
        if config.agents.num_agents == 0:
            keys = " --keys DIR" if config.keys_dir else ""
            logger.warning(
                "no local agents (--num-agents 0): the run waits for agents attached from other machines with "
                "`flare2 attach %s --agent %s%s`", self.control_endpoint, config.agents.path, keys,
            )
        self._start_compute()
        self.supervisor.start_all(self.control_endpoint, self._local_curve)
        startup_deadline = time.monotonic() + config.startup_timeout_s
        next_progress = time.monotonic() + config.progress_interval_s
        next_heartbeat = time.monotonic()
        try:
            while not self.totals.budget_reached(config):
                if self._stop_signal is not None:
                    logger.warning("stopping on %s", signal.Signals(self._stop_signal).name)
                    return exit_codes.SIGINT if self._stop_signal == signal.SIGINT else exit_codes.SIGTERM
                now = time.monotonic()
                if self.desk.served is None and now > startup_deadline:
                    raise RunFailed(
                        f"the compute process did not come up within {config.startup_timeout_s:.0f}s "
                        "(startup_timeout_s): building the Algorithm takes too long or hangs",
                        exit_codes.FAILED,
                    )
                if now >= next_progress:
                    next_progress = now + config.progress_interval_s
                    self._report_progress()
                if now >= next_heartbeat:
                    next_heartbeat = now + config.heartbeat_timeout_s / 4
                    self.desk.send_heartbeats(control)
                self._maybe_checkpoint(control, now)
                timeout_s = min(_SUPERVISE_INTERVAL_S, max(0.0, next_progress - now))
                if control.poll(poll_timeout_ms(timeout_s)):
                    self._drain(control)
                if self._connections is not None:
                    self._connections.check()
                    self.totals.closed_connections = self._connections.closed
                self._supervise(control)
                self.desk.supervise_remotes(control)
            logger.info(
                "budget reached: %d env steps, %d episodes, return_mean %.1f",
                self.totals.env_steps, self.totals.episodes, self.totals.return_mean,
            )
            # A row as the run stops, before the episodes that end while the agents stop change the means.
            if self._progress is not None:
                self._progress.run_ends()
            self._report_progress()
            return exit_codes.OK
        except RunFailed as exc:
            logger.error("%s", exc)
            return exc.exit_code

    def _report_progress(self) -> None:
        if self._progress is not None:
            live = self.agents.live()
            self._progress.report(
                self.totals,
                agents=sum(not agent.remote for agent in live),
                remote_agents=sum(agent.remote for agent in live),
                envs=sum(agent.envs for agent in live),
            )

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_signal = signum

    # ---- children --------------------------------------------------------------------

    def _start_compute(self) -> None:
        config = self.config
        settings = ComputeSettings(
            control_endpoint=self.control_endpoint,
            cts=config.cts,
            device=config.device,
            seed=config.seed,
            bind=config.bind,
            curve_server=self._curve_server,
            curve_client=self._local_curve,
            checkpoint_dir=str(self.checkpoint_dir),
            resume_dir=config.resume_dir,
            torch_threads=config.torch_threads,
            learner=config.learner,
            busy_wait_us=config.busy_wait_us,
            local_agents=config.agents.num_agents,
            max_message_bytes=config.max_message_bytes,
            parent_pid=os.getpid(),
            # At least one compute report per progress row, so each row sees fresh batching figures.
            stats_interval_s=min(1.0, config.progress_interval_s / 2),
            socket_dir=self._socket_dir,
        )
        process = multiprocessing.get_context("spawn").Process(target=compute_main, args=(settings,), name="flare2-compute")
        process.start()
        self._compute = process
        logger.info("compute process started (pid %d)", process.pid)

    def _supervise(self, control: zmq.Socket) -> None:
        compute = self._compute
        if compute is not None and compute.exitcode is not None:
            raise RunFailed(
                f"the compute process died: it {exit_codes.describe(compute.exitcode)} (see its log above)", exit_codes.FAILED
            )
        for agent, cause, exit_code in self.supervisor.failures(time.monotonic()):
            if exit_code == exit_codes.COMPUTE_FAILED:
                # The compute process failed; its own report (with the traceback) ends the run.
                self._drain(control)
            self.supervisor.restart_later(agent, cause, exit_code, compute_up=self.desk.served is not None)
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
        elif message.kind == STATS:
            self.totals.add_compute_stats(message.payload.get("cts", {}))
        elif message.kind == CHECKPOINT:
            self._checkpoint_pending = False
            logger.info("checkpoint written to %s", message.payload.get("checkpoint_dir"))
        elif message.kind == BYE:
            logger.info("compute process saved its checkpoints to %s", message.payload.get("checkpoint_dir"))
        elif message.kind == ERROR:
            self._compute_failed = True
            raise RunFailed(f"the compute process failed: {error_text(message)}", _error_exit_code(message))
        else:
            self._drop(COMPUTE_IDENTITY.encode(), f"unexpected kind {message.kind!r}")

    def _on_compute_hello(self, control: zmq.Socket, hello: dict[str, Any]) -> None:
        write_run_file(self.log_dir / "run.json", self.control_endpoint, hello)
        served = hello.get("cts")
        served = served if isinstance(served, dict) else {}
        record_run(self.config, served)
        logger.info(
            "compute process is up on %s, CTs %s, learn() %s", hello.get("device"), sorted(hello.get("cts", {})),
            {"process": "in a learner process", "thread": "in a learner thread"}.get(hello.get("learner"), "between predictions"),
        )
        counters = hello.get("counters") or {}
        if counters:
            self.totals.resume_from(counters)
            logger.info(
                "resumed from %s: %d env steps, %d episodes, return_mean %.1f",
                self.config.resume_dir, self.totals.env_steps, self.totals.episodes, self.totals.return_mean,
            )
        self._progress = ProgressLog(
            self.log_dir, start_steps=self.totals.env_steps, append=bool(counters) and resuming_in_place(self.config),
            max_steps=self.config.max_steps, tensorboard=self.config.board,
        )
        self._checkpoints.start(time.monotonic(), self.totals.env_steps)
        self.desk.compute_is_up(control, served)

    def _maybe_checkpoint(self, control: zmq.Socket, now: float) -> None:
        if self.desk.served is None or self._checkpoint_pending:
            return
        if not self._checkpoints.take_due(now, self.totals.env_steps):
            return
        self._checkpoint_pending = True
        router_send(control, COMPUTE_IDENTITY.encode(), Message(CHECKPOINT, {"counters": self.totals.counters()}))

    # ---- stopping --------------------------------------------------------------------

    def _shutdown(self, control: zmq.Socket) -> None:
        """Stop agents, then the compute process (which writes the checkpoint); kill what does not leave."""
        timeout_s = self.config.stop_timeout_s
        compute = self._compute
        if self._progress is not None:
            self._progress.run_ends()
        # A failed or dead compute process answers no learn request: agents need not wait for those on their way.
        compute_gone = self._compute_failed or (compute is not None and compute.exitcode is not None)
        self.desk.stop_all(control, compute_gone=compute_gone)
        running = [agent for agent in self.agents.slots if agent.restart_at is None and agent.process.poll() is None]
        for agent in running:
            router_send(control, agent.agent_id.encode(), Message(STOP, {"compute_gone": compute_gone}))
        started = time.monotonic()
        deadline = started + timeout_s
        while any(agent.process.poll() is None for agent in running) and time.monotonic() < deadline:
            self._drain_quietly(control, 0.05)
        # An agent that stopped cleanly sent its final stats and a bye before it exited; they may still be on
        # their way. The checkpoint's counters must include them.
        deadline = max(deadline, time.monotonic() + _LAST_WORDS_S)
        while any(agent.process.poll() == 0 and not agent.said_bye for agent in running) and time.monotonic() < deadline:
            self._drain_quietly(control, 0.05)
        self._drain_quietly(control, 0.0)
        for agent in running:
            if agent.process.poll() is None:
                logger.warning("agent %s did not stop within %.1fs; killing it", agent.agent_id, timeout_s)
                agent.process.kill()
            agent.process.wait()
        if running:
            logger.info("agents stopped in %.2fs", time.monotonic() - started)
        if compute is not None and compute.exitcode is None:
            wait_s = timeout_s
            if self.desk.served is not None:
                router_send(control, COMPUTE_IDENTITY.encode(), Message(STOP, {"counters": self.totals.counters()}))
                # Saving a checkpoint of a big model takes a while.
                wait_s = timeout_s * 4
            compute.join(wait_s)
            if compute.exitcode is None:
                logger.warning("the compute process did not stop; killing it")
                compute.kill()
            compute.join()
            self._drain_quietly(control, 0.0)
        if compute is not None:
            stop_resource_tracker()
        self._report_progress()
        if self.totals.dropped_messages:
            logger.warning("dropped %d malformed or unexpected control messages", self.totals.dropped_messages)

    def _drain_quietly(self, control: zmq.Socket, timeout_s: float) -> None:
        """Take final stats while stopping; a failure report now is only logged."""
        if not control.poll(poll_timeout_ms(timeout_s)):
            return
        try:
            self._drain(control)
        except RunFailed as exc:
            logger.error("while stopping: %s", exc)


def _error_exit_code(message: Message) -> int:
    return exit_codes.CONFIG_ERROR if message.payload.get("code") == "config" else exit_codes.FAILED
