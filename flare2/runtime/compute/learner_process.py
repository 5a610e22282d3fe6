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

With ``--learners N`` there are N such processes (one per GPU with
``--device cuda``, learner ``r`` on ``cuda:r``; CPU processes otherwise),
joined in one ``torch.distributed`` process group (NCCL between GPUs, gloo on
the CPU; :mod:`flare2.runtime.compute.learner_group`). ``--remote-learners K``
of them run on other machines (``flare2 learn``), the rest here. Only the first
one talks to the compute process: it hands every learn batch on to the others
over the group and answers with all of their answers. Each learns from its
equal share of the batch's sequences, and ``Algorithm.optimize()`` averages
their gradients (:mod:`flare2.core.data_parallel`), so their weights stay
identical. The first one writes the weights to shared memory and the
checkpoints; the compute process takes the mean of their costs. When one of
them dies, the others fail in their next collective call and the compute process
reports which one died and how (a learner on another machine prints its own
traceback where it was started); the manager then starts a new compute process
with a new group from the last checkpoint
(:mod:`flare2.runtime.manager.learner_seats`).
"""

from __future__ import annotations

import logging
import multiprocessing
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any, cast

import numpy as np
import torch

from flare2.core.computation_task import ComputationTask
from flare2.errors import CheckpointError, ConfigError, LearnerDiedError
from flare2.runtime.compute.cdp import LearnBatch
from flare2.runtime.compute.learn_calls import Learned
from flare2.runtime.compute.learner_main import (
    LEAVING,
    PIPE_MAX_BYTES,
    LearnerSettings,
    learner_device,
    learner_main,
)
from flare2.runtime.compute.shared_weights import SharedWeights
from flare2.runtime.processes import OWN_PIPE, WarmProcess
from flare2.wire.codec import decode, encode
from flare2.wire.sockets import free_port

logger = logging.getLogger(__name__)

LEARNER_MODULE = learner_main.__module__
"""What a spare learner imports as it waits (``WarmProcess``)."""

_ALIVE_CHECK_S = 1.0
"""While waiting for an answer, how often to look whether the learner processes are still there."""
_STOP_TIMEOUT_S = 5.0


def check_learners(learners: int, device: str, cts: list[ComputationTask], *, remote: int = 0) -> None:
    """A ConfigError for ``--learners`` (``remote`` of them elsewhere) the machine or the CTs cannot take, naming the
    fix."""
    if learners == 1:
        return
    ragged = [f"{ct.name}.{key}" for ct in cts for key, spec in ct.specs.inputs.items() if spec.ragged]
    if ragged:
        raise ConfigError(
            f"--learners {learners} splits each learn batch by sequences, which ragged inputs ({', '.join(ragged)}) "
            "cannot be yet: use --learners 1"
        )
    here = learners - remote
    if device.startswith("cuda"):
        first, available = int(learner_device(device, 0).partition(":")[2]), torch.cuda.device_count()
        if first + here > available:
            learners_here = f"--learners {learners}" + (f" ({here} of them here)" if remote else "")
            raise ConfigError(
                f"{learners_here} with --device {device} puts a learner on each GPU from cuda:{first} on, but this "
                f"machine has {available} GPU(s): use --learners {max(1, available - first) + remote} or fewer, or "
                "--device cpu for learners on CPU cores"
            )


class LearnerProcess:
    """The compute process's end: hands learn batches over to the first learner process, one batch at a time, and
    adopts the weights the learners make.

    ``wake_socket`` (the first learner's pipe) becomes readable when an answer is ready for ``deliver``.
    """

    def __init__(
        self, cts: list[ComputationTask], settings: LearnerSettings, spares: Sequence[WarmProcess] = ()
    ) -> None:
        self._cts = cts
        self._learners = settings.learners
        self._remote = settings.remote_learners
        self._shared = SharedWeights.of(cts)
        rendezvous = settings.rendezvous or (f"tcp://127.0.0.1:{free_port('127.0.0.1')}" if self._learners > 1 else "")
        self._pipes: list[Connection] = []
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._pending: list[deque[dict[str, Any]]] = [deque() for _ in range(settings.local_learners)]
        """Answers read from a learner's pipe ahead of their turn (a gone learner's last words)."""
        ready = list(spares)
        for rank in range(settings.local_learners):
            own = replace(settings, rank=rank, rendezvous=rendezvous, device=learner_device(settings.device, rank))
            # Daemonic: multiprocessing ends it with this process even when the loop leaves by an exception.
            warm = ready.pop(0) if ready else WarmProcess(LEARNER_MODULE, daemon=True)
            layout = self._shared.layout if rank == 0 else None
            process = warm.run(f"flare2-learner-{rank}", learner_main, own, OWN_PIPE, layout)
            if rank == 0:
                try:
                    self._shared.send(warm.pipe, cast(int, process.pid))
                except OSError:  # it died: its pipe says so as the first answer is awaited
                    pass
            self._processes.append(process)
            self._pipes.append(warm.pipe)
        for spare in ready:
            spare.discard()
        self.wake_socket = self._pipes[0].fileno()
        self._in_flight: LearnBatch | None = None
        self._parted = False
        """The group broke: the first learner, where it is still there, only writes checkpoints and stops."""
        self.weight_digests: list[str] = []
        """Each learner's digest of its weights after the last batch (empty strings with one learner)."""
        # Not waited for: predictions are served while they import torch and build the CTs, and the first learn
        # batch waits in the pipe meanwhile.
        logger.info("%s started (pid %s)", self._name(), ", ".join(map(str, self.pids)))
        if self._remote:
            logger.info("%d of the learners join at %s from other machines (flare2 learn)", self._remote, rendezvous)

    @property
    def idle(self) -> bool:
        return self._in_flight is None

    @property
    def pids(self) -> list[int | None]:
        return [process.pid for process in self._processes]

    def submit(self, batch: LearnBatch) -> None:
        sequences = batch.experience["terminated"].shape[0]
        if sequences % self._learners:
            raise ConfigError(
                f"a learn batch of CT {batch.cdp.ct.name!r} holds {sequences} sequences, which do not split evenly "
                f"over --learners {self._learners} (each must take as many gradient steps as the others): make the "
                f"envs in a learn batch (--envs-per-agent times the agents batched together) a multiple of "
                f"{self._learners}"
            )
        self._send(encode({"kind": "learn", "ct": self._cts.index(batch.cdp.ct), "experience": batch.experience}))
        self._in_flight = batch

    def deliver(self) -> None:
        """Reply for the batch that was learned; raises UserCodeError if learn() raised."""
        while self._pipes[0].poll(0):
            self._on_answer(self._receive(0))

    def finish(self) -> None:
        """Wait for the batch being learned and reply for it, so none is lost at a stop."""
        while self._in_flight is not None:
            self._on_answer(self._receive(0))

    def save(self, targets: list[tuple[ComputationTask, str]], counters: dict[str, Any]) -> None:
        """Checkpoint each CT to its file: the first learner holds the optimizers and the counters learn() keeps."""
        paths = {ct.name: path for ct, path in targets}
        own_counters = {ct.name: ct.own_counters() for ct in self._cts}
        # The agents' observation statistics are merged in the compute process, which serves their trades.
        statistics = {ct.name: {key: m.to_wire() for key, m in ct.statistics_copy().items()} for ct in self._cts}
        request = {
            "kind": "save",
            "paths": paths,
            "counters": counters,
            "own_counters": own_counters,
            "statistics": statistics,
        }
        self._send(encode(request))
        while (answer := self._receive(0))["kind"] != "saved":
            if not self._parted:  # once parted, the answers to batches the group dropped say nothing more
                self._on_answer(answer)
        if "error" in answer:
            raise CheckpointError(str(answer["error"]))

    def close(self, *, regroup: bool = False) -> None:
        """Stop the learners: the first one passes the word on to the others (``regroup``: those of ``flare2 learn``
        then ask for ranks in the next group)."""
        if self._processes[0].is_alive():
            try:
                self._send(encode({"kind": "stop", "regroup": regroup}))
            except LearnerDiedError:
                pass  # it went meanwhile: nothing left to stop
        for process in self._processes:
            process.join(_STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
        for pipe in self._pipes:
            pipe.close()

    # ---- the pipes -----------------------------------------------------------------------

    def _name(self, rank: int | None = None) -> str:
        if self._learners == 1:
            return "the learner process"
        return f"learner process {rank} of {self._learners}" if rank is not None else f"{self._learners} learners"

    def _send(self, request: bytes) -> None:
        try:
            self._pipes[0].send_bytes(request)
        except OSError:
            raise self._died(0) from None

    def _receive(self, rank: int) -> dict[str, Any]:
        pending = self._pending[rank]
        while not pending:
            if self._pipes[rank].poll(_ALIVE_CHECK_S):
                try:
                    pending.append(decode(self._pipes[rank].recv_bytes(), max_bytes=PIPE_MAX_BYTES))
                except (EOFError, OSError):
                    raise self._died(rank) from None
            elif not self._parted:
                self._check_the_others(rank)
        return pending.popleft()

    def _last_words(self, rank: int) -> list[dict[str, Any]]:
        """What a learner that is gone (or going) left in its pipe."""
        left = self._pending[rank]
        try:
            while self._pipes[rank].poll(0):
                left.append(decode(self._pipes[rank].recv_bytes(), max_bytes=PIPE_MAX_BYTES))
        except (EOFError, OSError):
            pass
        return list(left)

    def _check_the_others(self, rank: int) -> None:
        """The learners wait for each other: one that is gone leaves the rest waiting (to join the group, or in a
        collective call), so it ends the wait, unless it left saying why (its learn() raised, or a collective call
        failed: the first learner's answer then tells)."""
        for other, process in enumerate(self._processes):
            if other == rank or process.is_alive():
                continue
            left = self._last_words(other)
            for answer in left:
                if answer["kind"] == "build_failed":
                    self._on_status(answer)
            if not any(answer["kind"] in LEAVING for answer in left):
                raise self._died(other)

    def _died(self, rank: int) -> LearnerDiedError:
        process = self._processes[rank]
        process.join(_STOP_TIMEOUT_S)
        code = process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return self._lost(f"{self._name(rank)} died ({how})")

    def _lost(self, message: str, remote_traceback: str = "", *, elsewhere: bool = False) -> LearnerDiedError:
        """A learner is gone, and with it the group: the first learner, if it is still there, leaves the group too
        and stays to write the checkpoints (``learner_main``)."""
        self._parted = True
        alive = self._processes[0].is_alive()
        return LearnerDiedError(message, remote_traceback, lost=True, elsewhere=elsewhere, can_save=alive)

    def _on_status(self, answer: dict[str, Any]) -> None:
        if answer["kind"] == "build_failed":
            # A learner killed while the group formed fails the others' build, and learners of flare2 learn that
            # do not come fail the first one's join: a group may be formed again without them.
            killed = any(process.exitcode is not None and process.exitcode < 0 for process in self._processes)
            missing = self._remote > 0 and answer.get("joined") is False
            raise LearnerDiedError(
                f"{self._name()} could not build the CTs or join the other learners",
                answer["traceback"],
                lost=killed or missing,
                elsewhere=missing and not killed,
            )
        if answer.get("rank", 0) == 0:
            logger.info("%s ready", self._name())

    def _failures(self, first: dict[str, Any]) -> list[tuple[int, str]]:
        """The tracebacks of the learn() calls that raised on a failed batch, the first learner's answer ``first``
        and the words the others here left (on a failure every learner leaves); a learner here that died without a
        word is the cause, and raised as such."""
        failed = [(0, first["traceback"])] if first["kind"] == "failed" else []
        for rank in range(1, len(self._processes)):
            self._processes[rank].join(_STOP_TIMEOUT_S)
            left = self._last_words(rank)
            if not any(answer["kind"] in LEAVING for answer in left) and not self._processes[rank].is_alive():
                raise self._died(rank)
            failed += [(rank, answer["traceback"]) for answer in left if answer["kind"] == "failed"]
        return failed

    def _on_answer(self, answer: dict[str, Any]) -> None:
        """The first learner's answer, which holds every learner's: then the batch is replied to."""
        if answer["kind"] in ("ready", "build_failed"):
            self._on_status(answer)
            return
        batch, self._in_flight = self._in_flight, None
        if answer["kind"] in LEAVING:
            failed = self._failures(answer) if self._learners > 1 else [(0, answer["traceback"])]
            if not failed:
                elsewhere = ": a learner on another machine left (its `flare2 learn` says why)" if self._remote else ""
                raise self._lost(
                    f"the {self._name()} lost one another and none here raised{elsewhere}",
                    answer["traceback"],
                    elsewhere=self._remote > 0,
                )
            # One learner's traceback goes as it is; several are each headed by the learner that raised.
            together = "\n".join(f"{self._name(rank)}:\n{text}" for rank, text in failed)
            if batch is not None:
                batch.cdp.learn_failed(batch, failed[0][1] if len(failed) == 1 else together + self._remote_hint())
        if batch is None:
            # A collective call between batches (the word that no batch is coming yet) fails as well.
            raise LearnerDiedError(f"{self._name(0)} answered {answer['kind']!r} to no request")
        answers = answer["answers"]
        ct = batch.cdp.ct
        self.weight_digests = [a["weights_digest"] for a in answers]
        if len(set(self.weight_digests)) > 1:
            raise ConfigError(
                f"after learn() call {answers[0]['learn_calls']} of CT {ct.name!r} the {self._name()} hold different "
                f"weights: with --learners every change to the weights must be a step of Algorithm.optimize() (which "
                f"averages the gradients) taken alike on each learner; {type(ct.algorithm).__name__}.learn() changes "
                "them some other way (or a different number of times): run it with --learners 1"
                + self._remote_rounding_hint()
            )
        ct.adopt_weights(self._shared.tensors[self._cts.index(ct)], learn_calls=answers[0]["learn_calls"])
        costs = {key: float(np.mean([a["costs"][key] for a in answers])) for key in answers[0]["costs"]}
        lag_sum, lag_steps = sum(a["lag_sum"] for a in answers), sum(a["lag_steps"] for a in answers)
        batch.cdp.learned(batch, Learned(costs, lag_sum, lag_steps, max(a["seconds"] for a in answers)))

    def _remote_rounding_hint(self) -> str:
        if not self._remote:
            return ""
        # The same averaged gradient gives the same weights only where the same code computes the step.
        return (
            ". Learners on other machines also part ways when their torch versions or processors round the same step "
            "differently: run every learner with the same torch on machines of one kind"
        )

    def _remote_hint(self) -> str:
        if not self._remote:
            return ""
        return (
            f"\n(the {self._remote} learner(s) on other machines print their own tracebacks where `flare2 learn` runs)"
        )
