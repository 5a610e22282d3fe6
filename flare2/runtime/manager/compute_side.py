"""The compute process as the parallel schedule keeps it: started with the run's settings, heard on the control
socket (its stats, checkpoints, bye and failure), stopped last, and started again when it dies unasked.

A compute process that dies without a word (killed by a signal, by the kernel's out-of-memory killer, or gone in
a crash below Python), or that lost one of its learners, is restarted, up to ``max_restarts`` times, from the last
checkpoint the run wrote (its ``checkpoints/``; without one yet, from what the run started from). One that lost a
learner while its first learner stayed writes that checkpoint first, when the manager's stop brings the counters
(``waits_to_save``). One that reports a
failure (an exception in an Algorithm or Model, a bad spec) stops the run: a restart would fail the same way.

One is also stopped and started again on purpose, to give its learners' group room for a ``flare2 learn`` that
comes (back): it writes its checkpoints as it stops, and the new one starts from them
(:mod:`flare2.runtime.manager.learner_seats`). Such a regroup is no death: ``max_restarts`` does not count it.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from flare2.errors import RunFailed
from flare2.runtime import exit_codes
from flare2.runtime.checkpoints import checkpoint_path
from flare2.runtime.compute.compute_process import ComputeSettings, compute_main
from flare2.runtime.config import RunConfig
from flare2.runtime.manager.totals import RunTotals
from flare2.runtime.processes import COMPUTE_IDENTITY, WarmProcess
from flare2.wire.protocol import (
    BYE,
    CHECKPOINT,
    ERROR,
    LEARNER_LOST,
    REMOTE_LEARNER_LOST,
    STATS,
    STOP,
    Message,
    error_text,
)
from flare2.wire.sockets import router_send

logger = logging.getLogger(__name__)

_WARM_UP = f"{compute_main.__module__}:warm_up"
"""What a compute process does before its settings come (``WarmProcess``)."""
_SAVING_STOP_FACTOR = 4
"""A compute process asked to stop writes its checkpoints first (a big model's take a while): it is given this many
times ``stop_timeout_s``."""


class ComputeProcess:
    """The run's compute process, from the manager's side. ``settings(resume_dir)`` gives the settings of a new one
    that loads its CTs from ``resume_dir`` (None: fresh)."""

    def __init__(self, config: RunConfig, totals: RunTotals, settings: Callable[[str | None], ComputeSettings]) -> None:
        self.config = config
        self.totals = totals
        self.settings = settings
        self.process: multiprocessing.process.BaseProcess | None = None
        self.failed = False
        """It reported a failure: the run stops, and no reply to a request on its way will come."""
        self.checkpoint_pending = False
        self.started_at = time.monotonic()
        """When the process now running was started (it has ``startup_timeout_s`` from then to come up)."""
        self.leaving = False
        """It said it lost a learner, and exits next."""
        self.lost_elsewhere = False
        """The learner it lost was on another machine."""
        self.waits_to_save = False
        """It lost a learner and waits for a stop with the run's counters to write its checkpoints before it exits."""
        self.save_deadline: float | None = None
        """When one that was asked to save before it exits is killed, if it has not exited by then."""
        self.regrouping = False
        """It was asked to stop so that a new one takes a new group of learners."""
        self.regroup_deadline = 0.0
        """When a regrouping one that has not stopped yet is killed (as the run's stop would)."""
        self.deaths = 0
        """Compute processes that died or lost a learner (a regroup is none): ``max_restarts`` bounds them."""
        self.restarted = False
        """The process now running is a restarted one (its hello continues the run, it does not start it)."""
        self.spare: WarmProcess | None = None
        """A compute process waiting to take over, its imports done (``keep_a_spare``)."""
        self.stopped = False
        """The run stopped it: a hello still on its way starts no spare (one would wait for work to the end)."""

    def start(self, resume_dir: str | None) -> None:
        """Start a compute process: the spare where one waits, else a new one."""
        warm, self.spare = self.spare or WarmProcess(_WARM_UP, 0), None
        process = warm.run("flare2-compute", compute_main, self.settings(resume_dir))
        self.process, self.started_at = process, time.monotonic()
        logger.info("compute process started (pid %d)", process.pid)

    def keep_a_spare(self, learner: str) -> None:
        """Once a run has started its compute process again, it keeps a spare one waiting, its imports done, with
        spare learner processes of its own where the one that serves now learns in processes (``learner``, as its
        hello says): the next restart (a death, a lost learner, a regroup) does not wait for torch to load. A run
        that never restarts pays nothing for it."""
        if self.restarted and not self.stopped and (self.spare is None or not self.spare.alive):
            self._discard_spare()  # one that died waiting
            config = self.config
            learners = config.learners - config.remote_learners if learner == "process" else 0
            self.spare = WarmProcess(_WARM_UP, learners)
            logger.info("a spare compute process waits to take over at the next restart (pid %d)", self.spare.pid)

    def _discard_spare(self) -> None:
        if self.spare is not None:
            self.spare.discard()
            self.spare = None

    def died(self) -> str | None:
        """How the process ended ("was killed by SIGKILL") if it has; None while it runs. One that said it lost a
        learner is on its way out: it is waited for (and killed if it lingers), so that nothing is welcomed to it; one
        that writes its checkpoints first, and one asked to stop for a regroup, are killed past their stop's timeout
        (an agent welcomed meanwhile finds it gone, and rejoins the next one)."""
        process = self.process
        if process is not None and self.leaving and process.exitcode is None:
            saving = self.waits_to_save or self.save_deadline is not None
            if not saving:
                process.join(self.config.stop_timeout_s)
            if not saving or (self.save_deadline is not None and time.monotonic() > self.save_deadline):
                if process.exitcode is None:
                    process.kill()
                    process.join()
        if process is not None and self.regrouping and process.exitcode is None:
            if time.monotonic() > self.regroup_deadline:
                logger.warning("the compute process did not stop for the new group of learners; killing it")
                process.kill()
                process.join()
        return None if process is None or process.exitcode is None else exit_codes.describe(process.exitcode)

    @property
    def going(self) -> bool:
        """Asked to stop for a regroup, or leaving after it lost a learner: no new agent is welcomed to it."""
        return self.regrouping or self.leaving

    @property
    def gone(self) -> bool:
        """Whether it failed or died: no reply to a request on its way will come."""
        return self.failed or self.died() is not None

    def regroup(self, control: zmq.Socket, counters: dict[str, Any]) -> None:
        """Ask it to stop with its checkpoints (and its learners to leave for a new group); ``restart`` follows once
        it has."""
        router_send(control, COMPUTE_IDENTITY.encode(), Message(STOP, {"counters": counters, "regroup": True}))
        self.regrouping = True
        self.regroup_deadline = time.monotonic() + self.config.stop_timeout_s * _SAVING_STOP_FACTOR

    def stop_to_save(self, control: zmq.Socket, counters: dict[str, Any]) -> None:
        """One that lost a learner and waits to save (``waits_to_save``): the stop that brings the counters its
        checkpoints carry; it exits once they are written, and ``restart`` starts the next one from them."""
        router_send(control, COMPUTE_IDENTITY.encode(), Message(STOP, {"counters": counters}))
        self.waits_to_save = False
        self.save_deadline = time.monotonic() + self.config.stop_timeout_s * _SAVING_STOP_FACTOR

    def restart(self, how: str) -> None:
        """Start a new process in place of the one that ended (``how``: as ``died()`` says), from the run's last
        checkpoint; RunFailed past ``max_restarts`` deaths, or at once for one that exited with CONFIG_ERROR."""
        if self.process is not None and self.process.exitcode == exit_codes.CONFIG_ERROR:
            # It said why as it ended (flare2.runtime.processes.refuse_start_in_a_spawned_child): a new one would too.
            raise RunFailed(
                f"the compute process {how}: a setting is wrong (its message above)", exit_codes.CONFIG_ERROR
            )
        self.totals.compute_restarts += 1
        resume_dir = self._last_checkpoints()
        source = (
            f"the checkpoint in {resume_dir}" if resume_dir else "fresh weights (the run has written no checkpoint)"
        )
        if self.regrouping and self.process is not None and self.process.exitcode == exit_codes.OK:
            logger.info("the compute process stopped for a new group of learners; starting a new one from %s", source)
        else:
            self.deaths += 1
            most = self.config.max_restarts
            # One that lost a learner said so (the log above) and left; the others died without a word.
            what = "the compute process lost a learner" if self.leaving else f"the compute process died: it {how}"
            if self.deaths > most:
                raise RunFailed(
                    f"{what}; that is {self.deaths} compute process deaths, more than max_restarts={most}: find the "
                    "cause (the log above, the kernel's log for an out-of-memory kill) or raise --max-restarts",
                    exit_codes.FAILED,
                )
            logger.error(
                "%s; starting a new one from %s (compute restart %d of at most %d); the agents rejoin once it serves",
                what,
                source,
                self.deaths,
                most,
            )
        self.failed, self.checkpoint_pending, self.leaving, self.restarted = False, False, False, True
        self.lost_elsewhere = self.regrouping = self.waits_to_save = False
        self.save_deadline = None
        self.start(resume_dir)

    def _last_checkpoints(self) -> str | None:
        """The run's own checkpoints when every CT has one, else what the run started from (``--resume``)."""
        own = Path(self.config.log_dir) / "checkpoints"
        if all(checkpoint_path(own, ct.name).is_file() for ct in self.config.cts):
            return str(own)
        return self.config.resume_dir

    def on_message(self, message: Message, drop: Callable[[bytes, str], None]) -> None:
        """Its stats, checkpoint answers, bye and failure (its hello is the schedule's)."""
        if message.kind == STATS:
            self.totals.add_compute_stats(message.payload.get("cts", {}))
        elif message.kind == CHECKPOINT:
            self.checkpoint_pending = False
            if message.payload.get("error"):
                logger.error("%s (the run goes on)", message.payload["error"])
            else:
                logger.info("checkpoint written to %s", message.payload.get("checkpoint_dir"))
        elif message.kind == BYE:
            logger.info("compute process saved its checkpoints to %s", message.payload.get("checkpoint_dir"))
        elif message.kind == ERROR and message.payload.get("code") in (LEARNER_LOST, REMOTE_LEARNER_LOST):
            # It exits next (after its checkpoints, where the learners' state is still there to write); a new one,
            # with a new group of learners, starts from the last checkpoint.
            logger.error("the compute process lost a learner: %s", error_text(message))
            self.leaving = True
            self.lost_elsewhere = message.payload.get("code") == REMOTE_LEARNER_LOST
            self.waits_to_save = message.payload.get("saving") is True
        elif message.kind == ERROR:
            self.failed = True
            code = exit_codes.CONFIG_ERROR if message.payload.get("code") == "config" else exit_codes.FAILED
            raise RunFailed(f"the compute process failed: {error_text(message)}", code)
        else:
            drop(COMPUTE_IDENTITY.encode(), f"unexpected kind {message.kind!r}")

    def stop(self, control: zmq.Socket, *, serving: bool, counters: dict[str, Any], timeout_s: float) -> None:
        """Ask it to stop (it learns what waits and writes its checkpoints with ``counters``); kill it past the
        timeout. One that does not serve yet is only waited for. A spare is let go first."""
        self.stopped = True
        self._discard_spare()
        process = self.process
        if process is None or process.exitcode is not None:
            return
        wait_s = timeout_s
        if serving:
            router_send(control, COMPUTE_IDENTITY.encode(), Message(STOP, {"counters": counters}))
            wait_s = timeout_s * _SAVING_STOP_FACTOR
        process.join(wait_s)
        if process.exitcode is None:
            logger.warning("the compute process did not stop; killing it")
            process.kill()
        process.join()
