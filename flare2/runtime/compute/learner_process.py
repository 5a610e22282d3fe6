"""The learner process: ``learn()`` on a core of its own while the compute process keeps predicting.

On a CPU with small models both ``learn()`` and ``predict()`` are mostly
Python, so a learner thread takes turns with the predictions at the GIL (see
:mod:`flare2.runtime.compute.learners`); a process does not. The compute process starts
it when every CT's Algorithm allows it (``Algorithm.may_learn_in_own_process``):

- it builds the same CTs from the same configs (CTs that share modules share
  them here too), loads the same checkpoint on ``--resume``, and starts from
  the compute process's weights, which it finds in shared memory;
- for each learn batch the compute process sends the experience down a pipe,
  encoded with flare2's array codec; the learner runs ``learn()``, writes every
  parameter and buffer of the algorithm's networks into that shared memory and
  answers with the costs;
- the compute process copies those weights into its acting networks as it
  reads the answer, which makes them the next version. One batch is on its way
  at a time, so the learner never writes while the other side reads;
- it holds the optimizer and every counter ``learn()`` keeps, so it writes the
  checkpoints.
"""

from __future__ import annotations

import logging
import multiprocessing
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast

import torch

from flare2.core.computation_task import ComputationTask, copy_tensors
from flare2.core.learn_requests import check_learn
from flare2.core.transforms import RunningMoments
from flare2.errors import LearnerDiedError
from flare2.runtime.compute.cdp import LearnBatch, Learned, learn_with_lag
from flare2.runtime.compute.cts import build_cts, resume
from flare2.runtime.config import CTConfig
from flare2.runtime.processes import (
    configure_child_logging,
    die_with_parent,
    ignore_interrupts,
)
from flare2.wire.codec import decode, encode

logger = logging.getLogger(__name__)

_PIPE_MAX_BYTES = 1 << 40
"""The pipe joins two processes of one run; a learn batch is as large as the batching makes it."""
_ALIVE_CHECK_S = 1.0
"""While waiting for an answer, how often to look whether the learner process is still there."""
_STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class LearnerSettings:
    cts: tuple[CTConfig, ...]
    device: str
    seed: int
    torch_threads: int
    resume_dir: str | None
    """The run being resumed (``--resume``): the learner loads the same checkpoints as the compute process."""
    parent_pid: int


def shared_weights(ct: ComputationTask) -> list[torch.Tensor]:
    """A copy of the CT's weights in shared memory (host memory, whatever the device)."""
    return [tensor.detach().to("cpu", copy=True).share_memory_() for tensor in ct.weight_tensors()]


class LearnerProcess:
    """The compute process's end: hands learn batches over, one at a time, and adopts the weights they make.

    ``wake_socket`` (the pipe's file descriptor) becomes readable when an answer is ready for ``deliver``.
    """

    def __init__(self, cts: list[ComputationTask], settings: LearnerSettings) -> None:
        self._cts = cts
        self._weights = [shared_weights(ct) for ct in cts]
        spawn = multiprocessing.get_context("spawn")
        self._pipe, child_end = spawn.Pipe()
        self.wake_socket = self._pipe.fileno()
        # Daemonic: multiprocessing ends it with this process even when the loop leaves by an exception.
        self._process = spawn.Process(
            target=learner_main, args=(settings, child_end, self._weights), name="flare2-learner", daemon=True
        )
        self._process.start()
        child_end.close()
        self._in_flight: LearnBatch | None = None
        # Not waited for: predictions are served while it imports torch and builds the CTs, and the first learn
        # batch waits in the pipe meanwhile.
        logger.info("learner process started (pid %d)", self._process.pid)

    @property
    def idle(self) -> bool:
        return self._in_flight is None

    def submit(self, batch: LearnBatch) -> None:
        index = self._cts.index(batch.cdp.ct)
        self._send({"kind": "learn", "ct": index, "experience": batch.experience})
        self._in_flight = batch

    def deliver(self) -> None:
        """Reply for the batch that was learned; raises UserCodeError if learn() raised."""
        while self._pipe.poll(0):
            self._on_answer(self._receive())

    def finish(self) -> None:
        """Wait for the batch being learned and reply for it, so none is lost at a stop."""
        while self._in_flight is not None:
            self._on_answer(self._receive())

    def save(self, targets: list[tuple[ComputationTask, str]], counters: dict[str, Any]) -> None:
        """Checkpoint each CT to its file: the learner holds the optimizers and the counters learn() keeps."""
        paths = {ct.name: path for ct, path in targets}
        predict_calls = {ct.name: ct.predict_calls for ct in self._cts}
        # The agents' observation statistics are merged in the compute process, which serves their trades.
        statistics = {ct.name: {key: m.to_wire() for key, m in ct.statistics_copy().items()} for ct in self._cts}
        self._send(
            {
                "kind": "save",
                "paths": paths,
                "counters": counters,
                "predict_calls": predict_calls,
                "statistics": statistics,
            }
        )
        self._await("saved")

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._send({"kind": "stop"})
            except LearnerDiedError:
                pass  # it went meanwhile: nothing left to stop
            self._process.join(_STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._pipe.close()

    # ---- the pipe ------------------------------------------------------------------------

    def _send(self, request: dict[str, Any]) -> None:
        try:
            self._pipe.send_bytes(encode(request))
        except OSError:
            raise self._died() from None

    def _receive(self) -> dict[str, Any]:
        while not self._pipe.poll(_ALIVE_CHECK_S):
            if not self._process.is_alive():
                break
        try:
            return decode(self._pipe.recv_bytes(), max_bytes=_PIPE_MAX_BYTES)
        except (EOFError, OSError):
            raise self._died() from None

    def _died(self) -> LearnerDiedError:
        self._process.join(_STOP_TIMEOUT_S)
        code = self._process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return LearnerDiedError(f"the learner process died ({how})")

    def _await(self, kind: str) -> None:
        """Read answers until one of ``kind``, serving the others that come first."""
        while (answer := self._receive())["kind"] != kind:
            self._on_answer(answer)

    def _on_answer(self, answer: dict[str, Any]) -> None:
        if answer["kind"] == "ready":
            logger.info("learner process ready")
            return
        if answer["kind"] == "build_failed":
            raise LearnerDiedError("the learner process could not build the CTs", answer["traceback"])
        batch, self._in_flight = self._in_flight, None
        if batch is None:
            raise LearnerDiedError(f"the learner process answered {answer['kind']!r} to no request")
        if answer["kind"] == "failed":
            batch.cdp.learn_failed(batch, answer["traceback"])
        ct = batch.cdp.ct
        ct.adopt_weights(self._weights[self._cts.index(ct)], learn_calls=answer["learn_calls"])
        batch.cdp.learned(batch, Learned(answer["costs"], answer["lag_sum"], answer["lag_steps"], answer["seconds"]))


def learner_main(settings: LearnerSettings, pipe: Connection, weights: list[list[torch.Tensor]]) -> None:
    """Entry point of the learner process (started with the spawn method by the compute process)."""
    die_with_parent(settings.parent_pid)
    ignore_interrupts()
    configure_child_logging()
    try:
        cts = _build(settings, weights)
    except Exception:  # noqa: BLE001 - user code builds the CTs: its traceback goes to the compute process
        pipe.send_bytes(encode({"kind": "build_failed", "traceback": traceback.format_exc()}))
        return
    pipe.send_bytes(encode({"kind": "ready"}))
    while True:
        try:
            request = decode(pipe.recv_bytes(), max_bytes=_PIPE_MAX_BYTES)
        except EOFError:
            return  # the compute process is gone (the kernel ends this process with it too)
        kind = request["kind"]
        if kind == "stop":
            return
        if kind == "save":
            for ct in cts:
                if ct.name in request["paths"]:
                    ct.predict_calls = request["predict_calls"][ct.name]
                    # Statistics are kept of fixed-shape inputs only (check_statistics_request).
                    ct.statistics = {
                        key: RunningMoments.from_wire(
                            moments, cast("tuple[int, ...]", ct.specs.inputs[key].shape), f"statistics of {key!r}"
                        )
                        for key, moments in request["statistics"][ct.name].items()
                    }
                    ct.save(request["paths"][ct.name], request["counters"])
            pipe.send_bytes(encode({"kind": "saved"}))
            continue
        index = request["ct"]
        ct = cts[index]
        experience = request["experience"]
        # Ragged arrays come down the pipe as their wire maps, which this turns back into Ragged.
        check_learn(ct.specs, experience)
        # Decoded arrays are views of the message: learn() gets writable copies of its own.
        experience = {
            key: {name: array.copy() for name, array in value.items()} if isinstance(value, dict) else value.copy()
            for key, value in experience.items()
        }
        try:
            result = learn_with_lag(ct, experience)
        except Exception:  # noqa: BLE001 - user code: its traceback goes back with the batch
            pipe.send_bytes(encode({"kind": "failed", "traceback": traceback.format_exc()}))
            continue
        copy_tensors(weights[index], ct.weight_tensors())
        pipe.send_bytes(
            encode(
                {
                    "kind": "learned",
                    "costs": result.costs,
                    "lag_sum": result.lag_sum,
                    "lag_steps": result.lag_steps,
                    "seconds": result.seconds,
                    "learn_calls": ct.learn_calls,
                }
            )
        )


def _build(settings: LearnerSettings, weights: list[list[torch.Tensor]]) -> list[ComputationTask]:
    cts = build_cts(settings.cts, device=settings.device, seed=settings.seed, torch_threads=settings.torch_threads)
    resume(cts, settings.resume_dir)
    for index, ct in enumerate(cts):
        copy_tensors(ct.weight_tensors(), weights[index])
    return cts
