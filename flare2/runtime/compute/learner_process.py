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
the CPU) that meets at a TCP address on this machine. Every learn batch goes
to each of them; each learns from its equal share of the batch's sequences,
and ``Algorithm.optimize()`` averages their gradients
(:mod:`flare2.core.data_parallel`), so their weights stay identical. The first
one writes the weights to shared memory and the checkpoints; the compute
process takes the mean of their costs. When one of them dies, the others
fail in their next gradient average, the compute process reports which one
died and how, and the run stops (``--resume`` goes on from the last
checkpoint).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import socket
import traceback
from collections import deque
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist

from flare2.core.computation_task import ComputationTask, copy_tensors
from flare2.core.learn_requests import check_learn
from flare2.core.transforms import RunningMoments
from flare2.errors import ConfigError, LearnerDiedError
from flare2.runtime.compute.cdp import LearnBatch
from flare2.runtime.compute.cts import build_cts, resume
from flare2.runtime.compute.learn_calls import Learned, learn_with_lag
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
_RENDEZVOUS_TIMEOUT_S = 120.0
"""How long learners wait for each other to join their process group."""


@dataclass(frozen=True)
class LearnerSettings:
    cts: tuple[CTConfig, ...]
    device: str
    seed: int
    torch_threads: int
    resume_dir: str | None
    """The run being resumed (``--resume``): the learner loads the same checkpoints as the compute process."""
    parent_pid: int
    learners: int = 1
    rank: int = 0
    """Which of the ``learners`` this one is (0 writes the weights and the checkpoints)."""
    rendezvous: str = ""
    """Where the learners' process group meets (``tcp://HOST:PORT``, torch.distributed's init method); empty for one
    learner."""


def learner_device(device: str, rank: int) -> str:
    """The device of learner ``rank``: the next GPUs from the compute process's on, or the CPU."""
    if not device.startswith("cuda"):
        return device
    first = int(device.partition(":")[2] or 0)
    return f"cuda:{first + rank}"


def check_learners(learners: int, device: str, cts: list[ComputationTask]) -> None:
    """A ConfigError for ``--learners`` the machine or the CTs cannot take, naming the fix."""
    if learners == 1:
        return
    ragged = [f"{ct.name}.{key}" for ct in cts for key, spec in ct.specs.inputs.items() if spec.ragged]
    if ragged:
        raise ConfigError(
            f"--learners {learners} splits each learn batch by sequences, which ragged inputs ({', '.join(ragged)}) "
            "cannot be yet: use --learners 1"
        )
    if device.startswith("cuda"):
        first, available = int(learner_device(device, 0).partition(":")[2]), torch.cuda.device_count()
        if first + learners > available:
            raise ConfigError(
                f"--learners {learners} with --device {device} puts a learner on each GPU from cuda:{first} on, but "
                f"this machine has {available} GPU(s): use --learners {max(1, available - first)} or fewer, or "
                "--device cpu for learners on CPU cores"
            )


def weights_digest(ct: ComputationTask) -> str:
    """A digest of every bit of the CT's weights: learners that took the same steps have the same one."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in ct.weight_tensors():
        digest.update(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def shared_weights(ct: ComputationTask) -> list[torch.Tensor]:
    """A copy of the CT's weights in shared memory (host memory, whatever the device)."""
    return [tensor.detach().to("cpu", copy=True).share_memory_() for tensor in ct.weight_tensors()]


class LearnerProcess:
    """The compute process's end: hands learn batches over to the learner processes, one batch at a time, and adopts
    the weights they make.

    ``wake_socket`` (the first learner's pipe) becomes readable when an answer is ready for ``deliver``.
    """

    def __init__(self, cts: list[ComputationTask], settings: LearnerSettings) -> None:
        self._cts = cts
        self._weights = [shared_weights(ct) for ct in cts]
        spawn = multiprocessing.get_context("spawn")
        rendezvous = f"tcp://127.0.0.1:{_free_port()}" if settings.learners > 1 else ""
        self._pipes: list[Connection] = []
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._pending: list[deque[dict[str, Any]]] = [deque() for _ in range(settings.learners)]
        """Answers read from a learner's pipe ahead of their turn (a gone learner's last words)."""
        for rank in range(settings.learners):
            pipe, child_end = spawn.Pipe()
            own = replace(settings, rank=rank, rendezvous=rendezvous, device=learner_device(settings.device, rank))
            # Daemonic: multiprocessing ends it with this process even when the loop leaves by an exception.
            process = spawn.Process(
                target=learner_main, args=(own, child_end, self._weights), name=f"flare2-learner-{rank}", daemon=True
            )
            process.start()
            child_end.close()
            self._pipes.append(pipe)
            self._processes.append(process)
        self.wake_socket = self._pipes[0].fileno()
        self._in_flight: LearnBatch | None = None
        self.weight_digests: list[str] = []
        """Each learner's digest of its weights after the last batch (empty strings with one learner)."""
        # Not waited for: predictions are served while they import torch and build the CTs, and the first learn
        # batch waits in the pipes meanwhile.
        logger.info("%s started (pid %s)", self._name(), ", ".join(map(str, self.pids)))

    @property
    def idle(self) -> bool:
        return self._in_flight is None

    @property
    def pids(self) -> list[int | None]:
        return [process.pid for process in self._processes]

    def submit(self, batch: LearnBatch) -> None:
        sequences = batch.experience["terminated"].shape[0]
        learners = len(self._pipes)
        if sequences % learners:
            raise ConfigError(
                f"a learn batch of CT {batch.cdp.ct.name!r} holds {sequences} sequences, which do not split evenly "
                f"over --learners {learners} (each must take as many gradient steps as the others): make the envs "
                f"in a learn batch (--envs-per-agent times the agents batched together) a multiple of {learners}"
            )
        request = encode({"kind": "learn", "ct": self._cts.index(batch.cdp.ct), "experience": batch.experience})
        for rank in range(learners):
            self._send(rank, request)
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
        predict_calls = {ct.name: ct.predict_calls for ct in self._cts}
        # The agents' observation statistics are merged in the compute process, which serves their trades.
        statistics = {ct.name: {key: m.to_wire() for key, m in ct.statistics_copy().items()} for ct in self._cts}
        request = {
            "kind": "save",
            "paths": paths,
            "counters": counters,
            "predict_calls": predict_calls,
            "statistics": statistics,
        }
        self._send(0, encode(request))
        while (answer := self._receive(0))["kind"] != "saved":
            self._on_answer(answer)

    def close(self) -> None:
        for rank, process in enumerate(self._processes):
            if process.is_alive():
                try:
                    self._send(rank, encode({"kind": "stop"}))
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
        if len(self._pipes) == 1:
            return "the learner process"
        return f"learner process {rank} of {len(self._pipes)}" if rank is not None else f"{len(self._pipes)} learners"

    def _send(self, rank: int, request: bytes) -> None:
        try:
            self._pipes[rank].send_bytes(request)
        except OSError:
            raise self._died(rank) from None

    def _receive(self, rank: int) -> dict[str, Any]:
        pending = self._pending[rank]
        while not pending:
            if self._pipes[rank].poll(_ALIVE_CHECK_S):
                try:
                    pending.append(decode(self._pipes[rank].recv_bytes(), max_bytes=_PIPE_MAX_BYTES))
                except (EOFError, OSError):
                    raise self._died(rank) from None
            else:
                self._check_the_others(rank)
        return pending.popleft()

    def _check_the_others(self, rank: int) -> None:
        """The learners wait for each other: one that is gone leaves the rest waiting (to join the group, or in a
        gradient average), so it ends the wait, unless it left because its learn() raised (the others fail in the
        average then, and every traceback is reported)."""
        for other, process in enumerate(self._processes):
            if other == rank or process.is_alive():
                continue
            left = self._pending[other]
            try:
                while self._pipes[other].poll(0):
                    left.append(decode(self._pipes[other].recv_bytes(), max_bytes=_PIPE_MAX_BYTES))
            except (EOFError, OSError):
                pass
            for answer in left:
                if answer["kind"] == "build_failed":
                    self._on_status(answer)
            if not any(answer["kind"] == "failed" for answer in left):
                raise self._died(other)

    def _died(self, rank: int) -> LearnerDiedError:
        process = self._processes[rank]
        process.join(_STOP_TIMEOUT_S)
        code = process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return LearnerDiedError(f"{self._name(rank)} died ({how})")

    def _batch_answer(self, rank: int) -> dict[str, Any]:
        """Learner ``rank``'s answer to the batch in flight (past its word that it is ready)."""
        while (answer := self._receive(rank))["kind"] in ("ready", "build_failed"):
            self._on_status(answer)
        return answer

    def _on_status(self, answer: dict[str, Any]) -> None:
        if answer["kind"] == "build_failed":
            raise LearnerDiedError(f"{self._name()} could not build the CTs", answer["traceback"])
        if answer.get("rank", 0) == 0:
            logger.info("%s ready", self._name())

    def _on_answer(self, answer: dict[str, Any]) -> None:
        """The first learner's answer: the others' to the same batch follow; then the batch is replied to."""
        if answer["kind"] in ("ready", "build_failed"):
            self._on_status(answer)
            return
        batch, self._in_flight = self._in_flight, None
        if batch is None:
            raise LearnerDiedError(f"{self._name(0)} answered {answer['kind']!r} to no request")
        answers = [answer, *(self._batch_answer(rank) for rank in range(1, len(self._pipes)))]
        failed = [(rank, a["traceback"]) for rank, a in enumerate(answers) if a["kind"] == "failed"]
        if failed:
            # One learner's traceback goes as it is; several are each headed by the learner that raised.
            together = "\n".join(f"{self._name(rank)}:\n{text}" for rank, text in failed)
            batch.cdp.learn_failed(batch, failed[0][1] if len(answers) == 1 else together)
        ct = batch.cdp.ct
        self.weight_digests = [a["weights_digest"] for a in answers]
        if len(set(self.weight_digests)) > 1:
            raise ConfigError(
                f"after learn() call {answer['learn_calls']} of CT {ct.name!r} the {self._name()} hold different "
                f"weights: with --learners every change to the weights must be a step of Algorithm.optimize() (which "
                f"averages the gradients) taken alike on each learner; {type(ct.algorithm).__name__}.learn() changes "
                "them some other way (or a different number of times): run it with --learners 1"
            )
        ct.adopt_weights(self._weights[self._cts.index(ct)], learn_calls=answer["learn_calls"])
        costs = {key: float(np.mean([a["costs"][key] for a in answers])) for key in answer["costs"]}
        lag_sum, lag_steps = sum(a["lag_sum"] for a in answers), sum(a["lag_steps"] for a in answers)
        batch.cdp.learned(batch, Learned(costs, lag_sum, lag_steps, max(a["seconds"] for a in answers)))


def learner_main(settings: LearnerSettings, pipe: Connection, weights: list[list[torch.Tensor]]) -> None:
    """Entry point of a learner process (started with the spawn method by the compute process)."""
    die_with_parent(settings.parent_pid)
    ignore_interrupts()
    configure_child_logging()
    try:
        if settings.learners > 1:
            if settings.device.startswith("cuda"):
                # NCCL's collectives run on the current device: each learner's own GPU, not cuda:0 for all.
                torch.cuda.set_device(settings.device)
            dist.init_process_group(
                "nccl" if settings.device.startswith("cuda") else "gloo",
                init_method=settings.rendezvous,
                rank=settings.rank,
                world_size=settings.learners,
                timeout=timedelta(seconds=_RENDEZVOUS_TIMEOUT_S),
            )
        cts = _build(settings, weights)
    except Exception:  # noqa: BLE001 - user code builds the CTs: its traceback goes to the compute process
        pipe.send_bytes(encode({"kind": "build_failed", "traceback": traceback.format_exc()}))
        return
    pipe.send_bytes(encode({"kind": "ready", "rank": settings.rank}))
    while True:
        try:
            request = decode(pipe.recv_bytes(), max_bytes=_PIPE_MAX_BYTES)
        except EOFError:
            return  # the compute process is gone (the kernel ends this process with it too)
        kind = request["kind"]
        if kind == "stop":
            return
        if kind == "save":
            _save(cts, request)
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
            result = learn_with_lag(ct, experience, share=(settings.rank, settings.learners))
        except Exception:  # noqa: BLE001 - user code: its traceback goes back with the batch
            pipe.send_bytes(encode({"kind": "failed", "traceback": traceback.format_exc()}))
            if settings.learners > 1:
                # The others wait in a gradient average this one will not join: leaving fails theirs at once.
                return
            continue
        if settings.rank == 0:
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
                    "weights_digest": weights_digest(ct) if settings.learners > 1 else "",
                }
            )
        )


def _save(cts: list[ComputationTask], request: dict[str, Any]) -> None:
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


def _build(settings: LearnerSettings, weights: list[list[torch.Tensor]]) -> list[ComputationTask]:
    cts = build_cts(settings.cts, device=settings.device, seed=settings.seed, torch_threads=settings.torch_threads)
    resume(cts, settings.resume_dir)
    for index, ct in enumerate(cts):
        copy_tensors(ct.weight_tensors(), weights[index])
    return cts
