"""ComputationDataProcessor: batches the requests of many agents for one ComputationTask.

Two ROUTER sockets per CT: predict and learn. A prediction batch is flushed
as soon as (1) it holds ``max_batch`` requests, (2) every live agent of the
CT has a request in it, or (3) its oldest request has waited ``max_wait``.
Rule 2 is what makes batching nearly free when agents are in step; rule 3
bounds what a dead or slow agent can cost the others. Learn requests are
batched by the same rule with their own limits, among requests of the same
sequence length; rule 2 leaves out agents playing an evaluation episode,
since they send nothing to learn from. An agent says so in its predict
requests: an ``evaluation`` array marks the rows of evaluation episodes
(answered with ``Algorithm.predict_greedy``), and an agent whose latest
request to this CT holds marked rows only is not waited for until one holds
a training row again.

Requests are validated against the CT's specs before they join a batch; a bad one gets an ERROR reply naming the
key, what was expected and what arrived.

The batching does not know how requests arrive: ``SocketFront``
(:mod:`flare2.runtime.compute.cdp_sockets`) feeds it from the CT's two ROUTER
sockets in the compute process, the serial runner from in-process ports. A
ready learn batch goes to a learner (:mod:`flare2.runtime.compute.learners`),
which may run ``learn()`` in another thread while predictions go on; its
reply comes back through ``learned``.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np

from flare2.core.learn_requests import check_learn, concatenate
from flare2.core.predict_requests import ViewsReceiver
from flare2.core.specs import EXPERIENCE_GROUPS
from flare2.core.transforms import check_statistics_request
from flare2.errors import SpecError, UserCodeError
from flare2.runtime.compute.learn_calls import Learned, learn_with_lag
from flare2.runtime.config import BatchingConfig
from flare2.wire.protocol import (
    ERROR,
    LEARN,
    LEARNED,
    PREDICT,
    PREDICTION,
    STATISTICS,
    Message,
    error_payload,
)
from flare2.wire.ragged import Ragged, concat_rows

if TYPE_CHECKING:
    from flare2.core.computation_task import ComputationTask

logger = logging.getLogger(__name__)

_MAX_PENDING_PER_AGENT = 4
# An agent's first learn requests can overtake the manager's word that it joined (they come over a faster link):
# this many are held for it, each for at most this long, before they are refused as an unregistered agent's.
_MAX_HELD_FOR_REGISTRATION = 16
_REGISTRATION_GRACE_S = 10.0


@dataclass
class _Request:
    reply_to: Any
    """Where the reply goes: a ROUTER identity, or an in-process port."""
    agent_id: str
    seq: int
    payload: dict[str, Any]
    arrived: float
    size: int  # rows of a predict request, sequences of a learn request
    own_inputs: frozenset[str] = frozenset()
    """Inputs the CT takes as they are (read-only, valid until the reply): views rebuilt here, shared memory's."""


def check_finite(payload: dict[str, Any]) -> None:
    """Refuse NaN and infinity in the float arrays of a learn request: one would poison the model for good."""
    for group in EXPERIENCE_GROUPS:
        for key, array in payload.get(group, {}).items():
            values = array.values if isinstance(array, Ragged) else array
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                raise SpecError(f"{group}[{key!r}] holds NaN or infinity: check the environment or the agent")


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

    def take_all(self) -> list[_Request]:
        batch, self.requests = self.requests, []
        return batch

    def discard(self, agent_ids: frozenset[str]) -> int:
        """Drop the requests of ``agent_ids``; returns how many there were."""
        kept = [request for request in self.requests if request.agent_id not in agent_ids]
        dropped = len(self.requests) - len(kept)
        self.requests = kept
        return dropped

    def pending(self, agent_id: str) -> int:
        return sum(request.agent_id == agent_id for request in self.requests)


_NOT_REPORTED = frozenset({"costs_sum", "costs_count"})
"""CDPStats' sums of learn costs, which a report gives as their means since the previous report."""


@dataclass
class CDPStats:
    """Cumulative counters, reported to the manager."""

    predict_requests: int = 0
    predict_rows: int = 0
    predict_batches: int = 0
    compute_pid: int = field(default_factory=os.getpid)
    """The process that counts: a restarted one counts again from 0, and the manager's totals carry what the one it
    replaced had counted (``RunTotals.ct_activity``)."""
    learn_calls_at_start: int = 0
    """``learn_calls`` as this process began: a resumed CT's count goes on from its checkpoint."""
    learned_requests: int = 0
    """Learn requests answered, counted as their learn call ends, with it: so a report's requests per call holds
    wherever learn() runs and however long it takes."""
    learn_calls: int = 0
    learned_rows: int = 0
    rejected: int = 0
    closed_connections: int = 0
    """Connections of agents on other machines that ZeroMQ closed: the peer left, or sent a message over the limit."""
    discarded: int = 0
    """Requests of agents that left (died, were restarted) before they were served."""
    max_predict_wait_ms: float = 0.0
    policy_lag_sum: int = 0
    """Over every learned step: learner version minus the version that acted (see ``policy_lag_steps``)."""
    policy_lag_steps: int = 0
    predict_seconds: float = 0.0
    """Time in ``predict()`` (the forward passes and their copies to and from the device)."""
    learn_seconds: float = 0.0
    """Time in ``learn()``, wherever it runs."""
    costs_sum: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    costs_count: int = 0

    def take_report(self) -> dict[str, Any]:
        """Counters plus the mean costs since the previous report."""
        report: dict[str, Any] = {
            counter.name: getattr(self, counter.name) for counter in fields(self) if counter.name not in _NOT_REPORTED
        }
        report["costs"] = (
            {key: value / self.costs_count for key, value in self.costs_sum.items()} if self.costs_count else {}
        )
        self.costs_sum = defaultdict(float)
        self.costs_count = 0
        self.max_predict_wait_ms = 0.0
        return report


Reply = Callable[[Any, bool, Message], None]
"""``reply(reply_to, learn, message)``: send ``message`` to a requester (``learn``: on the learn channel)."""


@dataclass
class LearnBatch:
    """Learn requests flushed together, their experience assembled, on the way to ``learn()``."""

    cdp: ComputationDataProcessor
    requests: list[_Request]
    experience: dict[str, Any]

    def run(self) -> Learned:
        """``learn()`` on it (in whatever thread the learner uses); see ``learn_with_lag``."""
        return learn_with_lag(self.cdp.ct, self.experience)


class Follower(Protocol):
    """What a CT's learning tells the frozen copies that follow it (``flare2.runtime.compute.frozen_copies``)."""

    def leader_learned(self, leader: ComputationTask) -> None: ...


class ComputationDataProcessor:
    """Batches the predict and learn requests of one ComputationTask and serves them."""

    def __init__(self, ct: ComputationTask, *, config: BatchingConfig = BatchingConfig(), reply: Reply) -> None:
        self.ct = ct
        self.config = config
        self.reply = reply
        self._live: frozenset[str] = frozenset()
        self._evaluating: set[str] = set()
        self.stats = CDPStats(
            learn_calls=ct.learn_calls, learned_rows=ct.learned_rows, learn_calls_at_start=ct.learn_calls
        )
        self._predict_queue = _BatchQueue(config.max_batch, config.max_wait_ms / 1000)
        self._learn_queues: dict[int, _BatchQueue] = {}
        self._views = ViewsReceiver(ct.specs)
        # Learn-channel messages of agents the manager has not named yet: (message, reply_to, arrived).
        self._held: list[tuple[Message, Any, float]] = []
        self.followers: list[Follower] = []
        """The frozen copies of this CT (``CTConfig.follows``)."""

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
        self._views.forget(gone)
        self._live = agents
        held, self._held = self._held, []
        for message, reply_to, arrived in held:
            # In arrival order and with their arrival times: the agent's learn queue keeps its order and deadlines.
            self.accept(message, reply_to, arrived, learn=True)

    # ---- receiving -------------------------------------------------------------------

    def reject(self, reply_to: Any, learn: bool, seq: int, reason: str, code: str) -> None:
        self.stats.rejected += 1
        logger.debug("CT %r rejected a request from %r: %s", self.ct.name, reply_to, reason)
        self.reply(reply_to, learn, Message(ERROR, error_payload(reason, code=code), seq=seq, ct=self.ct.name))

    def accept(self, message: Message, reply_to: Any, now: float, *, learn: bool) -> None:
        """Validate a decoded request and queue it, or answer it with an error naming what is wrong."""
        expected_kinds = (LEARN, STATISTICS) if learn else (PREDICT,)
        if message.kind not in expected_kinds:
            self.reject(
                reply_to,
                learn,
                message.seq,
                f"this socket takes {' or '.join(map(repr, expected_kinds))}, got {message.kind!r}",
                "bad_request",
            )
            return
        if message.ct != self.ct.name:
            self.reject(
                reply_to,
                learn,
                message.seq,
                f"unknown CT {message.ct!r}: this endpoint serves {self.ct.name!r}",
                "config",
            )
            return
        if learn and message.agent_id not in self._live:
            # Only agents the manager registered may feed learn(); one that just joined gets a grace period.
            if len(self._held) < _MAX_HELD_FOR_REGISTRATION:
                self._held.append((message, reply_to, now))
            else:
                self._refuse_unregistered(message, reply_to)
            return
        if message.kind == STATISTICS:
            self._on_statistics(message, reply_to)
            return
        payload, own_inputs = message.payload, frozenset[str]()
        try:
            if learn:
                size, steps = check_learn(self.ct.specs, payload)
                check_finite(payload)
            else:
                payload, own_inputs = self._views.unpack(message.agent_id, payload)
                size, steps = self.ct.specs.check_predict(payload), 0
        except SpecError as exc:
            self.reject(reply_to, learn, message.seq, f"CT {self.ct.name!r}: {exc}", "spec")
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
        # An agent has at most a few requests on their way (its learn_ahead); more than this is a flood,
        # and refusing it keeps one peer from filling the batches of everyone else.
        if queue.pending(message.agent_id) >= _MAX_PENDING_PER_AGENT:
            self.reject(
                reply_to, learn, message.seq, f"more than {_MAX_PENDING_PER_AGENT} requests waiting", "bad_request"
            )
            return
        if not learn:
            self.stats.predict_requests += 1
            self._note_evaluation(message.agent_id, payload.get("evaluation"))
        queue.add(_Request(reply_to, message.agent_id, message.seq, payload, now, size, own_inputs))

    def _note_evaluation(self, agent_id: str, evaluation: np.ndarray | None) -> None:
        """An agent whose request holds evaluation rows only plays no training env: learn batches do not wait for it
        until a request of it holds a training row again (the request was checked, so the mask is one bool per row)."""
        if evaluation is not None and evaluation.all():
            self._evaluating.add(agent_id)
        else:
            self._evaluating.discard(agent_id)

    def _on_statistics(self, message: Message, reply_to: Any) -> None:
        """An agent's new observation counts: merged into the CT's, and the merged ones go back at once."""
        try:
            merged = self.ct.merge_statistics(check_statistics_request(self.ct.specs, message.payload))
        except SpecError as exc:
            self.reject(reply_to, True, message.seq, f"CT {self.ct.name!r}: {exc}", "spec")
            return
        reply = {"moments": {key: moments.to_wire() for key, moments in merged.items()}}
        self.reply(reply_to, True, Message(STATISTICS, reply, seq=message.seq, ct=self.ct.name))

    # ---- serving ---------------------------------------------------------------------

    def next_deadline(self, *, learning: bool = True) -> float | None:
        """When the oldest waiting request must be served; learn requests count only when ``learning``."""
        queues = (self._predict_queue, *self._learn_queues.values()) if learning else (self._predict_queue,)
        deadlines = [deadline for deadline in (queue.deadline() for queue in queues) if deadline is not None]
        return min(deadlines) if deadlines else None

    def _refuse_unregistered(self, message: Message, reply_to: Any) -> None:
        self.reject(
            reply_to, True, message.seq, f"agent {message.agent_id!r} is not registered with the manager", "config"
        )

    def refuse_overdue(self, now: float) -> None:
        """Refuse the held messages of agents the manager did not name within the grace period."""
        while self._held and now - self._held[0][2] >= _REGISTRATION_GRACE_S:
            message, reply_to, _ = self._held.pop(0)
            self._refuse_unregistered(message, reply_to)

    def serve_predictions(self, now: float) -> None:
        """Serve every prediction batch that the batching rule says is ready."""
        while self._predict_queue.ready(now, self.live):
            self._serve_predict(self._predict_queue.take(), now)

    def take_learn_batch(self, now: float, *, flush: bool = False) -> LearnBatch | None:
        """The next learn batch the batching rule says is ready (with ``flush``, any waiting one), assembled."""
        learners = self.live - self._evaluating if self._learn_queues else frozenset()
        for steps, queue in list(self._learn_queues.items()):
            if flush and queue.requests:
                batch = queue.take_all()
            elif queue.ready(now, learners):
                batch = queue.take()
            else:
                continue
            if not queue.requests:
                del self._learn_queues[steps]
            return LearnBatch(self, batch, self._experience(batch))
        return None

    def _fail(self, batch: list[_Request], learn: bool, what: str, text: str) -> NoReturn:
        reason = f"{what} of CT {self.ct.name!r} raised in the compute process"
        for request in batch:
            self.reply(
                request.reply_to,
                learn,
                Message(
                    ERROR, error_payload(reason, traceback=text, code="user_code"), seq=request.seq, ct=self.ct.name
                ),
            )
        raise UserCodeError(self.ct.name, what, text)

    def _serve_predict(self, batch: list[_Request], now: float) -> None:
        specs = self.ct.specs
        # Concatenated even for one request (not views of a message's bytes), but for the inputs it may take as they are.
        own = batch[0].own_inputs if len(batch) == 1 else frozenset()
        rows = {key: [r.payload["inputs"][key] for r in batch] for key in specs.inputs}
        inputs = {key: parts[0] if key in own else concat_rows(parts) for key, parts in rows.items()}
        states = {key: concat_rows([r.payload["states"][key] for r in batch]) for key in specs.states}
        # Rows of evaluation episodes get the action without exploration.
        greedy: bool | np.ndarray = False
        if any("evaluation" in r.payload for r in batch):
            greedy = np.concatenate([r.payload.get("evaluation", np.zeros(r.size, bool)) for r in batch])
        started = time.perf_counter()
        try:
            actions, next_states = self.ct.predict(inputs, states, greedy=greedy)
        except Exception:
            self._fail(batch, False, "predict", traceback.format_exc())
        self.stats.predict_seconds += time.perf_counter() - started
        version = self.ct.predicted_version
        start = 0
        for request in batch:
            stop = start + request.size
            if len(batch) == 1:
                reply = {"actions": actions, "states": next_states, "version": version}
            else:
                reply = {
                    "actions": {key: value[start:stop] for key, value in actions.items()},
                    "states": {key: value[start:stop] for key, value in next_states.items()},
                    "version": version,
                }
            self.reply(request.reply_to, False, Message(PREDICTION, reply, seq=request.seq, ct=self.ct.name))
            start = stop
        stats = self.stats
        stats.predict_batches += 1
        stats.predict_rows += start
        stats.max_predict_wait_ms = max(stats.max_predict_wait_ms, (now - batch[0].arrived) * 1000)

    def _experience(self, batch: list[_Request]) -> dict[str, Any]:
        """The batch's requests as one, still as they crossed: ``learn_with_lag`` spells it out just before learn()."""
        return concatenate(self.ct.specs, [request.payload for request in batch])

    def learned(self, batch: LearnBatch, result: Learned) -> None:
        """Reply to the requests of a learned batch and count it."""
        stats = self.stats
        # The CT's counts, which a resumed run continues.
        self.ct.learned_rows += result.lag_steps
        stats.learn_calls, stats.learned_rows = self.ct.learn_calls, self.ct.learned_rows
        stats.learned_requests += len(batch.requests)
        stats.policy_lag_sum += result.lag_sum
        stats.policy_lag_steps += result.lag_steps
        stats.learn_seconds += result.seconds
        for key, value in result.costs.items():
            stats.costs_sum[key] += value
        stats.costs_count += 1
        reply = {"costs": result.costs, "learn_calls": self.ct.learn_calls}
        for request in batch.requests:
            self.reply(request.reply_to, True, Message(LEARNED, reply, seq=request.seq, ct=self.ct.name))
        for follower in self.followers:
            follower.leader_learned(self.ct)

    def learn_failed(self, batch: LearnBatch, text: str) -> NoReturn:
        """``learn()`` raised (``text`` is its traceback): the requesters hear why, and the run must stop."""
        self._fail(batch.requests, True, "learn", text)
