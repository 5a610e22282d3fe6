"""ComputationDataProcessor: batches the requests of many agents for one ComputationTask.

Two ROUTER sockets per CT: predict and learn. A prediction batch is flushed
as soon as (1) it holds ``max_batch`` requests, (2) every live agent of the
CT has a request in it, or (3) its oldest request has waited ``max_wait``.
Rule 2 is what makes batching nearly free when agents are in step; rule 3
bounds what a dead or slow agent can cost the others. Learn requests are
batched by the same rule with their own limits, among requests of the same
sequence length; rule 2 leaves out agents playing an evaluation episode (their
last prediction was greedy), since they send nothing to learn from.

Requests are validated against the CT's specs before they join a batch; a bad
one gets an ERROR reply naming the key, what was expected and what arrived.
"""

from __future__ import annotations

import logging
import traceback
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import zmq

from flare2.errors import DecodeError, SpecError
from flare2.runtime.config import BatchingConfig
from flare2.wire.codec import DEFAULT_MAX_BYTES
from flare2.wire.protocol import ERROR, LEARN, LEARNED, PREDICT, PREDICTION, Message, error_payload, unpack
from flare2.wire.security import CurveServer
from flare2.wire.sockets import bind_router, router_send

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask

logger = logging.getLogger(__name__)

# Messages taken from one socket per wake-up, so that one flooding peer cannot
# keep the loop away from the other socket and from flushing.
_MAX_DRAIN = 256
_MAX_PENDING_PER_AGENT = 4


@dataclass
class _Request:
    identity: bytes
    agent_id: str
    seq: int
    payload: dict[str, Any]
    arrived: float
    size: int  # rows of a predict request, sequences of a learn request


def check_finite(payload: dict[str, Any]) -> None:
    """Refuse NaN and infinity in the float arrays of a learn request: one would poison the model for good."""
    for group in ("inputs", "next_inputs", "actions", "rewards", "states"):
        for key, array in payload[group].items():
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise SpecError(f"{group}[{key!r}] holds NaN or infinity: check the environment or the agent")


class UserCodeError(Exception):
    """User code (Algorithm/Model) raised while serving a batch; the run must stop."""

    def __init__(self, ct: str, what: str, remote_traceback: str) -> None:
        super().__init__(f"{what} of CT {ct!r} raised:\n{remote_traceback}")
        self.remote_traceback = remote_traceback


class _BatchQueue:
    """Requests waiting to be served together, and the flush rule."""

    def __init__(self, max_batch: int, max_wait_s: float) -> None:
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.requests: list[_Request] = []

    def add(self, request: _Request) -> None:
        self.requests.append(request)

    def deadline(self) -> float | None:
        return self.requests[0].arrived + self.max_wait_s if self.requests else None

    def ready(self, now: float, waiting_for: frozenset[str]) -> bool:
        if not self.requests:
            return False
        if len(self.requests) >= self.max_batch or now >= self.requests[0].arrived + self.max_wait_s:
            return True
        return bool(waiting_for) and waiting_for.issubset(request.agent_id for request in self.requests)

    def take(self) -> list[_Request]:
        batch, self.requests = self.requests[: self.max_batch], self.requests[self.max_batch :]
        return batch

    def discard(self, agent_ids: frozenset[str]) -> int:
        """Drop the requests of ``agent_ids``; returns how many there were."""
        kept = [request for request in self.requests if request.agent_id not in agent_ids]
        dropped = len(self.requests) - len(kept)
        self.requests = kept
        return dropped

    def pending(self, agent_id: str) -> int:
        return sum(request.agent_id == agent_id for request in self.requests)


@dataclass
class CDPStats:
    """Cumulative counters, reported to the manager."""

    predict_requests: int = 0
    predict_rows: int = 0
    predict_batches: int = 0
    learn_requests: int = 0
    learn_calls: int = 0
    rejected: int = 0
    discarded: int = 0
    """Requests of agents that left (died, were restarted) before they were served."""
    max_predict_wait_ms: float = 0.0
    costs_sum: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    costs_count: int = 0

    def take_report(self) -> dict[str, Any]:
        """Counters plus the mean costs since the previous report."""
        report = {
            "predict_requests": self.predict_requests,
            "predict_rows": self.predict_rows,
            "predict_batches": self.predict_batches,
            "learn_requests": self.learn_requests,
            "learn_calls": self.learn_calls,
            "rejected": self.rejected,
            "discarded": self.discarded,
            "max_predict_wait_ms": self.max_predict_wait_ms,
            "costs": {key: value / self.costs_count for key, value in self.costs_sum.items()} if self.costs_count else {},
        }
        self.costs_sum = defaultdict(float)
        self.costs_count = 0
        self.max_predict_wait_ms = 0.0
        return report


class ComputationDataProcessor:
    """Serves one ComputationTask on a predict and a learn ROUTER socket."""

    def __init__(
        self,
        ct: ComputationTask,
        ctx: zmq.Context,
        *,
        host: str = "127.0.0.1",
        config: BatchingConfig = BatchingConfig(),
        max_bytes: int = DEFAULT_MAX_BYTES,
        curve: CurveServer | None = None,
    ) -> None:
        self.ct = ct
        self.config = config
        self.max_bytes = max_bytes
        self._live: frozenset[str] = frozenset()
        self._evaluating: set[str] = set()
        self.stats = CDPStats(learn_calls=ct.learn_calls)
        self._predict_queue = _BatchQueue(config.max_batch, config.max_wait_ms / 1000)
        self._learn_queues: dict[int, _BatchQueue] = {}
        self.predict_socket, self.predict_endpoint = bind_router(ctx, host, max_bytes=max_bytes, curve=curve)
        try:
            self.learn_socket, self.learn_endpoint = bind_router(ctx, host, max_bytes=max_bytes, curve=curve)
        except BaseException:
            self.predict_socket.close(linger=0)
            raise

    @property
    def live(self) -> frozenset[str]:
        """The agents the batching rule waits for (the manager's registry)."""
        return self._live

    @live.setter
    def live(self, agents: frozenset[str]) -> None:
        # An agent that left will never be read from again: its queued requests go, never to reach learn().
        gone = self._live - agents
        if gone:
            for queue in (self._predict_queue, *self._learn_queues.values()):
                self.stats.discarded += queue.discard(gone)
        self._evaluating -= gone
        self._live = agents

    def close(self) -> None:
        self.predict_socket.close(linger=0)
        self.learn_socket.close(linger=0)

    # ---- receiving -------------------------------------------------------------------

    def drain(self, sock: zmq.Socket, now: float) -> None:
        """Take the waiting messages of ``sock`` (at most a bounded number) into the queues."""
        learn = sock is self.learn_socket
        for _ in range(_MAX_DRAIN):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._accept(frames, now, learn=learn)
            except Exception:  # a message nobody foresaw must not take the compute process down
                self.stats.rejected += 1
                logger.exception("CT %r dropped a request it could not handle", self.ct.name)

    def _reject(self, sock: zmq.Socket, identity: bytes, seq: int, reason: str, code: str) -> None:
        self.stats.rejected += 1
        logger.debug("CT %r rejected a request from %r: %s", self.ct.name, identity, reason)
        router_send(sock, identity, Message(ERROR, error_payload(reason, code=code), seq=seq, ct=self.ct.name))

    def _accept(self, frames: list[bytes], now: float, *, learn: bool) -> None:
        sock = self.learn_socket if learn else self.predict_socket
        identity, frames = frames[0], frames[1:]
        try:
            message = unpack(frames, max_bytes=self.max_bytes)
        except DecodeError as exc:
            self._reject(sock, identity, 0, str(exc), "bad_request")
            return
        expected_kind = LEARN if learn else PREDICT
        if message.kind != expected_kind:
            self._reject(sock, identity, message.seq, f"this socket takes {expected_kind!r}, got {message.kind!r}", "bad_request")
            return
        if message.ct != self.ct.name:
            self._reject(
                sock, identity, message.seq, f"unknown CT {message.ct!r}: this endpoint serves {self.ct.name!r}", "config"
            )
            return
        if message.agent_id.encode() != identity:
            self._reject(sock, identity, message.seq, "header agent_id does not match the connection's identity", "bad_request")
            return
        if learn and message.agent_id not in self._live:
            # Only agents the manager registered may feed learn().
            self._reject(sock, identity, message.seq, f"agent {message.agent_id!r} is not registered with the manager", "config")
            return
        try:
            if learn:
                size, steps = self.ct.specs.check_learn(message.payload)
                check_finite(message.payload)
            else:
                size, steps = self.ct.specs.check_predict(message.payload), 0
        except SpecError as exc:
            self._reject(sock, identity, message.seq, f"CT {self.ct.name!r}: {exc}", "spec")
            return
        if learn:
            # Sequences of one length are batched together.
            queue = self._learn_queues.get(steps)
            if queue is None:
                queue = self._learn_queues[steps] = _BatchQueue(
                    self.config.learn_max_batch, self.config.learn_max_wait_ms / 1000
                )
        else:
            queue = self._predict_queue
        # An agent waits for each reply before it asks again; more than this is a flood, and
        # refusing it keeps one peer from filling the batches of everyone else.
        if queue.pending(message.agent_id) >= _MAX_PENDING_PER_AGENT:
            self._reject(sock, identity, message.seq, f"more than {_MAX_PENDING_PER_AGENT} requests waiting", "bad_request")
            return
        if learn:
            self.stats.learn_requests += 1
        else:
            self.stats.predict_requests += 1
            if message.payload.get("greedy", False) and message.agent_id in self._live:
                self._evaluating.add(message.agent_id)
            else:
                self._evaluating.discard(message.agent_id)
        queue.add(_Request(identity, message.agent_id, message.seq, message.payload, now, size))

    # ---- serving ---------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        deadlines = [queue.deadline() for queue in (self._predict_queue, *self._learn_queues.values())]
        deadlines = [deadline for deadline in deadlines if deadline is not None]
        return min(deadlines) if deadlines else None

    def serve_ready(self, now: float) -> None:
        """Flush every batch that the batching rule says is ready."""
        while self._predict_queue.ready(now, self.live):
            self._serve_predict(self._predict_queue.take(), now)
        learners = self.live - self._evaluating if self._learn_queues else frozenset()
        for steps, queue in list(self._learn_queues.items()):
            while queue.ready(now, learners):
                self._serve_learn(queue.take())
            if not queue.requests:
                del self._learn_queues[steps]

    def _fail_batch(self, sock: zmq.Socket, batch: list[_Request], what: str) -> None:
        text = traceback.format_exc()
        reason = f"{what} of CT {self.ct.name!r} raised in the compute process"
        for request in batch:
            router_send(sock, request.identity, Message(ERROR, error_payload(reason, traceback=text, code="user_code"), seq=request.seq, ct=self.ct.name))
        raise UserCodeError(self.ct.name, what, text)

    def _serve_predict(self, batch: list[_Request], now: float) -> None:
        # Evaluation requests ask for the greedy action: they ride in the same batch (so no agent waits
        # longer) but take their own forward pass. check_predict made "greedy" a bool where present.
        evaluation = [request for request in batch if request.payload.get("greedy", False)]
        training = [request for request in batch if not request.payload.get("greedy", False)] if evaluation else batch
        if training:
            self._predict_part(training, greedy=False)
        if evaluation:
            self._predict_part(evaluation, greedy=True)
        stats = self.stats
        stats.predict_batches += 1
        stats.predict_rows += sum(request.size for request in batch)
        stats.max_predict_wait_ms = max(stats.max_predict_wait_ms, (now - batch[0].arrived) * 1000)

    def _predict_part(self, batch: list[_Request], *, greedy: bool) -> None:
        specs = self.ct.specs
        inputs = {key: np.concatenate([r.payload["inputs"][key] for r in batch]) for key in specs.inputs}
        states = {key: np.concatenate([r.payload["states"][key] for r in batch]) for key in specs.states}
        try:
            actions, next_states = self.ct.predict(inputs, states, greedy=greedy)
        except Exception:
            self._fail_batch(self.predict_socket, batch, "predict_greedy" if greedy else "predict")
        start = 0
        for request in batch:
            stop = start + request.size
            reply = {
                "actions": {key: value[start:stop] for key, value in actions.items()},
                "states": {key: value[start:stop] for key, value in next_states.items()},
            }
            router_send(self.predict_socket, request.identity, Message(PREDICTION, reply, seq=request.seq, ct=self.ct.name))
            start = stop

    def _serve_learn(self, batch: list[_Request]) -> None:
        def stacked(group: str, specs: dict) -> dict[str, np.ndarray]:
            return {key: np.concatenate([r.payload[group][key] for r in batch]) for key in specs}

        specs = self.ct.specs
        experience = {
            "inputs": stacked("inputs", specs.inputs),
            "next_inputs": stacked("next_inputs", specs.inputs),
            "actions": stacked("actions", specs.actions),
            "rewards": stacked("rewards", specs.rewards),
            "states": stacked("states", specs.states),
            "terminated": np.concatenate([r.payload["terminated"] for r in batch]),
            "truncated": np.concatenate([r.payload["truncated"] for r in batch]),
        }
        try:
            costs = self.ct.learn(experience)
        except Exception:
            self._fail_batch(self.learn_socket, batch, "learn")
        # The CT's count, which a resumed run continues.
        self.stats.learn_calls = self.ct.learn_calls
        for key, value in costs.items():
            self.stats.costs_sum[key] += value
        self.stats.costs_count += 1
        reply = {"costs": costs, "learn_calls": self.ct.learn_calls}
        for request in batch:
            router_send(self.learn_socket, request.identity, Message(LEARNED, reply, seq=request.seq, ct=self.ct.name))
