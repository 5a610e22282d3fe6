"""Learners: where the ``learn()`` calls of the compute process run.

:class:`InlineLearner` runs each learn batch at once, in the thread that
flushed it: predictions wait while it runs. The serial runner uses it, so a
debugger sees one call stack from the Agent down to ``Algorithm.learn``.

:class:`LearnerThread` runs them in one thread of its own, one at a time and
in order, while the compute process's loop keeps serving predictions from the
acting copy of the weights (``ComputationTask.act_beside_learning``). One
thread for every CT, because CTs may share parameters and two ``learn()``
calls must never update them at once. torch releases the GIL inside its
operators, so the two threads overlap even in one process. The loop hands
over the next batch only when the thread is idle: batches wait in the CDP's
queues meanwhile (and grow), never in an unbounded queue here.

A learner process (:mod:`flare2.runtime.compute.learner_process`) is the third kind,
and where an algorithm allows one, the fastest on a CPU.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from flare2.runtime.checkpoints import checkpoint_path
from flare2.runtime.compute.cdp import ComputationDataProcessor, LearnBatch

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask


class Learner(Protocol):
    """Where the compute loop's learn batches go (an inline call, a thread or a process)."""

    wake_socket: Any
    """What the loop polls for answers to ``deliver`` (None: answers come within ``submit``)."""

    @property
    def idle(self) -> bool: ...

    def submit(self, batch: LearnBatch) -> None: ...

    def deliver(self) -> None: ...

    def finish(self) -> None: ...

    def save(self, targets: list[tuple[ComputationTask, str]], counters: dict[str, Any]) -> None: ...

    def close(self, *, regroup: bool = False) -> None:
        """Stop learning (``regroup``: for a new compute process whose learners' group differs)."""
        ...


def save_here(targets: list[tuple[ComputationTask, str]], counters: dict[str, Any]) -> None:
    """Checkpoint CTs whose learn() runs in this process."""
    for ct, path in targets:
        ct.save(path, counters)


def finish_learning(cdps: list[ComputationDataProcessor], learner: Learner) -> None:
    """Learn every batch still waiting, as a run stops: no experience that reached the CDPs is lost."""
    now = time.monotonic()
    for cdp in cdps:
        while True:
            learner.finish()
            batch = cdp.take_learn_batch(now, flush=True)
            if batch is None:
                break
            learner.submit(batch)
    learner.finish()


def save_checkpoints(
    cdps: list[ComputationDataProcessor], learner: Learner, directory: str | os.PathLike, counters: dict[str, Any]
) -> None:
    """Checkpoint each CDP's CT to ``directory`` with the run's ``counters``, through the learner that holds its
    optimizer (the compute process at a CHECKPOINT or STOP message; ``--serial`` itself)."""
    learner.save([(cdp.ct, str(checkpoint_path(directory, cdp.ct.name))) for cdp in cdps], counters)


class InlineLearner:
    """Runs ``learn()`` at once in the calling thread."""

    idle = True
    wake_socket = None
    save = staticmethod(save_here)

    def submit(self, batch: LearnBatch) -> None:
        try:
            result = batch.run()
        except Exception:  # noqa: BLE001 - user code: its traceback goes back to the agents that asked
            batch.cdp.learn_failed(batch, traceback.format_exc())
        batch.cdp.learned(batch, result)

    def deliver(self) -> None:
        """Nothing is ever waiting."""

    def finish(self) -> None:
        """Nothing is ever left running."""

    def close(self, *, regroup: bool = False) -> None:
        """Nothing to stop."""


class LearnerThread:
    """Runs ``learn()`` in a thread; ``wake_socket`` becomes readable when a result is ready for ``deliver``."""

    save = staticmethod(save_here)  # ComputationTask.save waits for the learn() under way

    def __init__(self, ctx: zmq.Context) -> None:
        endpoint = f"inproc://flare2-learner-{id(self)}"
        self.wake_socket = ctx.socket(zmq.PAIR)
        self.wake_socket.bind(endpoint)
        self._signal = ctx.socket(zmq.PAIR)
        self._signal.connect(endpoint)
        self._batches: queue.SimpleQueue[LearnBatch | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[LearnBatch, Any, str]] = queue.SimpleQueue()
        self._busy = False
        self._thread = threading.Thread(target=self._work, name="flare2-learner", daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        return not self._busy

    def submit(self, batch: LearnBatch) -> None:
        self._busy = True
        self._batches.put(batch)

    def _work(self) -> None:
        while (batch := self._batches.get()) is not None:
            try:
                result, failure = batch.run(), ""
            except Exception:  # noqa: BLE001 - user code: the loop's thread reports its traceback
                result, failure = None, traceback.format_exc()
            self._results.put((batch, result, failure))
            # The wake-up socket is this thread's alone; the loop's end of the pair is the loop's alone.
            self._signal.send(b"", copy=True)

    def deliver(self) -> None:
        """Reply for the batch that was learned (in the loop's thread); raises UserCodeError if learn() raised."""
        while self.wake_socket.poll(0):
            self.wake_socket.recv()
        while True:
            try:
                batch, result, failure = self._results.get_nowait()
            except queue.Empty:
                return
            self._busy = False
            if failure:
                batch.cdp.learn_failed(batch, failure)
            batch.cdp.learned(batch, result)

    def finish(self) -> None:
        """Wait for the batch being learned and reply for it, so none is lost at a stop."""
        while self._busy:
            if self.wake_socket.poll(1000):
                self.deliver()
            elif not self._thread.is_alive():
                return

    def close(self, *, regroup: bool = False) -> None:
        self._batches.put(None)
        self._thread.join(timeout=5)
        self._signal.close(linger=0)
        self.wake_socket.close(linger=0)
