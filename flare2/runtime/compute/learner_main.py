"""What runs inside a learner process (:mod:`flare2.runtime.compute.learner_process` has the compute process's end).

A learner joins the learners' process group (``--learners N``), builds the
run's CTs, starts from the compute process's weights (the first learner, from
shared memory) or the first learner's (the others, over the group, with the
checkpoints of a resumed run), then takes requests in turn: the first one from
the compute process's pipe, handing learn batches and the word to stop on to
the others (:mod:`flare2.runtime.compute.learner_group`); each learns its
share of every batch and the first one answers for all. ``flare2 learn``
starts learners of this kind on other machines, without a pipe.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from flare2.core.computation_task import ComputationTask, copy_tensors
from flare2.core.learn_requests import check_learn
from flare2.core.transforms import RunningMoments, statistics_shape
from flare2.errors import CheckpointError, LearnersPartedError, TransportError
from flare2.runtime import exit_codes
from flare2.runtime.checkpoints import resume_checkpoint_path
from flare2.runtime.compute.cts import build_cts, resume
from flare2.runtime.compute.learn_calls import learn_with_lag
from flare2.runtime.compute.learner_group import (
    IDLE_BROADCAST_S,
    broadcast_bytes,
    broadcast_tensors,
    gather_bytes,
    join,
)
from flare2.runtime.compute.shared_weights import SharedWeights, WeightsLayout
from flare2.runtime.config import CTConfig
from flare2.runtime.processes import (
    configure_child_logging,
    die_with_parent,
)
from flare2.wire.codec import decode, encode

logger = logging.getLogger(__name__)

PIPE_MAX_BYTES = 1 << 40
"""The pipe and the learners' group join processes of one run; a learn batch is as large as the batching makes it."""
LEAVING = ("failed", "group_failed")
"""What a learner says as it leaves the group: its learn() raised, or a collective call failed."""


@dataclass(frozen=True)
class LearnerSettings:
    cts: tuple[CTConfig, ...]
    device: str
    seed: int
    torch_threads: int
    resume_dir: str | None
    """The run being resumed (``--resume``): the first learner loads its checkpoints and shares them."""
    parent_pid: int
    learners: int = 1
    remote_learners: int = 0
    """How many of the ``learners`` join from other machines (``flare2 learn``); they take the last ranks."""
    rank: int = 0
    """Which of the ``learners`` this one is (0 talks to the compute process, writes the weights and checkpoints)."""
    rendezvous: str = ""
    """Where the learners' process group meets (``tcp://HOST:PORT``, torch.distributed's init method); empty: a free
    port on loopback (or no group, for one learner)."""
    rendezvous_timeout_s: float = 120.0
    """How long the learners wait for each other to join (``LearnerSeats.rendezvous_timeout_s``)."""
    group_timeout_s: float = 120.0
    """How long a collective waits for a learner that does not answer (the run's --startup-timeout): past it, the
    group breaks."""

    @property
    def local_learners(self) -> int:
        """The learners the compute process starts on its own machine."""
        return self.learners - self.remote_learners


def learner_device(device: str, rank: int) -> str:
    """The device of learner ``rank``: the next GPUs from the compute process's on, or the CPU."""
    if not device.startswith("cuda"):
        return device
    first = int(device.partition(":")[2] or 0)
    return f"cuda:{first + rank}"


def weights_digest(ct: ComputationTask) -> str:
    """A digest of every bit of the CT's weights: learners that took the same steps have the same one."""
    digest = hashlib.blake2b(digest_size=16)
    for tensor in ct.weight_tensors():
        digest.update(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def learner_main(settings: LearnerSettings, pipe: Connection | None, weights_layout: WeightsLayout | None) -> NoReturn:
    """Entry point of a learner process (started with the spawn method by the compute process, or by ``flare2
    learn`` on another machine, which gives it no pipe: it logs what it would have said). Exits OK when it stopped
    when asked, COMPUTE_RESTARTS when asked to leave for a new group, LEARNERS_PARTED when its group broke (another
    learner is gone; the first learner stays until it is told to stop, to write the checkpoints the next group
    starts from) and FAILED when its own learn() or build failed."""
    die_with_parent(settings.parent_pid)
    configure_child_logging()
    try:
        # The first thing down the pipe after the work: the memory file of the weights (the first learner's).
        weights = (
            SharedWeights.receive(pipe, weights_layout).tensors
            if pipe is not None and weights_layout is not None
            else None
        )
        code = _learn_until_stopped(settings, pipe, weights)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # Everything it says has gone down its pipe or into its log: it ends here, without the interpreter's teardown,
    # where gloo's threads can end a cleanly stopped learner in std::terminate ("terminate called without an active
    # exception"), even with its group taken down first (the Slurm learn test, one run in several).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _learn_until_stopped(
    settings: LearnerSettings, pipe: Connection | None, weights: list[list[torch.Tensor]] | None
) -> int:
    """Learn until stopped; the exit code ``learner_main`` describes."""
    say = _Voice(pipe, settings.rank)
    try:
        group = (
            join(
                settings.rendezvous,
                settings.rank,
                settings.learners,
                device=settings.device,
                rendezvous_timeout_s=settings.rendezvous_timeout_s,
                timeout_s=settings.group_timeout_s,
            )
            if settings.learners > 1
            else None
        )
        cts = _build(settings, weights, group)
    except TransportError:
        # Not all came (or this one could not reach the others): a group may be formed without the missing ones.
        say({"kind": "build_failed", "traceback": traceback.format_exc(), "joined": False})
        return exit_codes.LEARNERS_PARTED
    except Exception:  # noqa: BLE001 - user code builds the CTs: its traceback goes to the compute process
        say({"kind": "build_failed", "traceback": traceback.format_exc()})
        return exit_codes.FAILED
    say({"kind": "ready", "rank": settings.rank})
    requests = _Requests(pipe, group)
    first_pipe = pipe if settings.rank == 0 else None  # the learner that stays when the group breaks
    while True:
        try:
            request = requests.next()
        except Exception:  # noqa: BLE001 - a collective call failed: another learner is gone
            return _parted(say, cts, first_pipe)
        kind = request["kind"]
        if kind == "stop":
            return exit_codes.COMPUTE_RESTARTS if request.get("regroup") is True else exit_codes.OK
        if kind == "save":  # only the first learner is asked
            _answer_save(say, cts, request)
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
        except LearnersPartedError:
            return _parted(say, cts, first_pipe)
        except Exception:  # noqa: BLE001 - user code: its traceback goes back with the batch
            say({"kind": "failed", "traceback": traceback.format_exc()})
            if group is not None:
                # The others wait in a collective call this one will not join: leaving fails theirs at once.
                return exit_codes.FAILED
            continue
        if settings.rank == 0 and weights is not None:
            copy_tensors(weights[index], ct.weight_tensors())
        answer = {
            "costs": result.costs,
            "lag_sum": result.lag_sum,
            "lag_steps": result.lag_steps,
            "seconds": result.seconds,
            "learn_calls": ct.learn_calls,
            "weights_digest": weights_digest(ct) if group is not None else "",
        }
        try:
            answers = [answer] if group is None else [decode(data) for data in gather_bytes(encode(answer), group)]
        except Exception:  # noqa: BLE001 - a collective call failed: another learner is gone
            return _parted(say, cts, first_pipe)
        if settings.rank == 0:
            say({"kind": "learned", "answers": answers})


def _answer_save(say: _Voice, cts: list[ComputationTask], request: dict[str, Any]) -> None:
    try:
        _save(cts, request)
    except CheckpointError as exc:  # the compute process says it: a periodic one lets the run go on
        say({"kind": "saved", "error": str(exc)})
    else:
        say({"kind": "saved"})


def _parted(say: _Voice, cts: list[ComputationTask], first_pipe: Connection | None) -> int:
    """The group broke (a collective call failed: another learner is gone; call it in the ``except`` block). Each
    learner says so; the first one (``first_pipe``: its pipe) stays for the compute process's last requests: its state is whole (a step whose
    gradients were not averaged was not taken), and the checkpoints it writes now let the next group start where
    this one stopped instead of at the last periodic checkpoint. Learn batches that were on their way are dropped."""
    say({"kind": "group_failed", "traceback": traceback.format_exc()})
    while first_pipe is not None:
        try:
            request = decode(first_pipe.recv_bytes(), max_bytes=PIPE_MAX_BYTES)
        except EOFError:
            break  # the compute process is gone
        if request["kind"] == "save":
            _answer_save(say, cts, request)
        elif request["kind"] == "stop":
            break
    return exit_codes.LEARNERS_PARTED


class _Voice:
    """What a learner says: down its pipe to the compute process, or, without one (``flare2 learn``), to its log.
    Answers to batches go from the first learner alone, which gathered the others'."""

    def __init__(self, pipe: Connection | None, rank: int) -> None:
        self._pipe = pipe
        self._rank = rank

    def __call__(self, message: dict[str, Any]) -> None:
        if self._pipe is not None:
            if message["kind"] != "learned" or self._rank == 0:
                self._pipe.send_bytes(encode(message))
            return
        if "traceback" in message:
            logger.error("learner %d: %s\n%s", self._rank, message["kind"].replace("_", " "), message["traceback"])
        elif message["kind"] == "ready":
            logger.info("learner %d joined the run's learners", self._rank)


class _Requests:
    """The requests a learner takes in turn: the first from the compute process's pipe, handing on to the others
    what they must take too (learn batches, the word to stop); the others from the first, over the group."""

    def __init__(self, pipe: Connection | None, group: dist.ProcessGroup | None) -> None:
        self._pipe = pipe
        self._group = group

    def next(self) -> dict[str, Any]:
        group = self._group
        if group is not None and dist.get_rank() != 0:
            while (request := decode(broadcast_bytes(None, group), max_bytes=PIPE_MAX_BYTES))["kind"] == "idle":
                pass
            return request
        if self._pipe is None:
            raise RuntimeError("the first learner is the compute process's child: it takes requests from its pipe")
        while group is not None and not self._pipe.poll(IDLE_BROADCAST_S):
            broadcast_bytes(encode({"kind": "idle"}), group)
        try:
            data = self._pipe.recv_bytes()
        except EOFError:
            # The compute process is gone (the kernel ends this process with it too): the others stop.
            data = encode({"kind": "stop"})
        request = decode(data, max_bytes=PIPE_MAX_BYTES)
        if group is not None and request["kind"] in ("learn", "stop"):
            broadcast_bytes(data, group)
        return request


def _save(cts: list[ComputationTask], request: dict[str, Any]) -> None:
    for ct in cts:
        if ct.name in request["paths"]:
            own = request["own_counters"][ct.name]
            ct.predict_calls, ct.learned_rows = own["predict_calls"], own["learned_rows"]
            ct.statistics = {
                key: RunningMoments.from_wire(moments, statistics_shape(ct.specs, key), f"statistics of {key!r}")
                for key, moments in request["statistics"][ct.name].items()
            }
            ct.save(request["paths"][ct.name], request["counters"])


def _build(
    settings: LearnerSettings, weights: list[list[torch.Tensor]] | None, group: dist.ProcessGroup | None
) -> list[ComputationTask]:
    """The CTs, from the compute process's weights (the first learner, through shared memory) or the first
    learner's (the others, over the group), with the optimizers and counters of a resumed run."""
    cts = build_cts(settings.cts, device=settings.device, seed=settings.seed, torch_threads=settings.torch_threads)
    if settings.rank == 0:
        resume(cts, settings.resume_dir)
        for index, ct in enumerate(cts):
            copy_tensors(ct.weight_tensors(), (weights or [])[index])
    if group is None:
        return cts
    # The others load the same checkpoints, from the first learner's bytes: their machine may not hold them.
    files = (
        {ct.name: resume_checkpoint_path(settings.resume_dir, ct.name).read_bytes() for ct in cts}
        if settings.rank == 0 and settings.resume_dir
        else {}
    )
    with _forming_group():
        shared = broadcast_bytes(encode(files) if settings.rank == 0 else None, group)
    files = decode(shared, max_bytes=PIPE_MAX_BYTES)
    if settings.rank != 0 and files:
        with tempfile.TemporaryDirectory(prefix="flare2-resume-") as directory:
            for ct in cts:
                path = Path(directory) / f"{ct.name}.pt"
                path.write_bytes(files[ct.name])
                ct.load(path)
    with _forming_group():
        for ct in cts:
            broadcast_tensors(ct.weight_tensors())
    return cts


@contextlib.contextmanager
def _forming_group() -> Iterator[None]:
    """A collective call of a forming group that fails (another learner died, or its link went down) is a group
    that cannot be formed with that learner, as one that does not join is (a TransportError): not a build that
    failed."""
    try:
        yield
    except RuntimeError as exc:  # gloo's and NCCL's errors are all RuntimeErrors
        raise TransportError(f"a learner left while the group formed ({type(exc).__name__}: {exc})") from None
