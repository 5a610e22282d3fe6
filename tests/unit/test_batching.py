"""The CDP batching rule of docs/architecture.md: Batching, over real ZeroMQ sockets on loopback.

The CDP runs in this thread: the test drives its poll loop the way the
compute process does, and agents are DEALER sockets of the same context.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq
from doubles import Scale, learn_payload

from flare2.core.algorithm import Algorithm
from flare2.core.computation_task import ComputationTask
from flare2.runtime.compute.cdp_sockets import SocketFront
from flare2.runtime.compute.compute_process import serve_ready
from flare2.runtime.compute.learners import InlineLearner, LearnerThread
from flare2.runtime.config import BatchingConfig
from flare2.wire.codec import DEFAULT_MAX_BYTES
from flare2.wire.protocol import ERROR, LEARN, LEARNED, PREDICT, PREDICTION, Message, pack, unpack
from flare2.wire.sockets import connect_dealer, poll_timeout_ms
from flare2.wire.streams import StreamClient


class DoublerAlgorithm(Algorithm):
    """Doubles its input; learn() reports the batch shape it was given."""

    def predict(self, inputs, states):
        return {"y": inputs["x"] * self.model.scale}, {}

    predict_greedy = predict

    def learn(self, experience):
        batch, steps = experience.inputs["x"].shape[:2]
        return {"batch": batch, "steps": steps}


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def make_cdp(ctx, **batching) -> SocketFront:
    ct = ComputationTask("RL", DoublerAlgorithm(Scale()), device="cpu")
    return SocketFront(ct, ctx, config=BatchingConfig(**batching))


class Agents:
    """DEALER sockets posing as agents, plus the CDP's serving loop."""

    def __init__(self, ctx, front: SocketFront, names: list[str]) -> None:
        self.front = front
        cdp = front
        self.predict = {name: connect_dealer(ctx, cdp.predict_endpoint, identity=name) for name in names}
        self.learn = {name: connect_dealer(ctx, cdp.learn_endpoint, identity=name) for name in names}
        self.replies: dict[str, Message] = {}
        self._seq = 0

    def send_predict(
        self, name: str, x: np.ndarray, *, header_id: str | None = None, evaluation: np.ndarray | None = None
    ) -> None:
        self._seq += 1
        payload = {"inputs": {"x": x}, "states": {}, **({"evaluation": evaluation} if evaluation is not None else {})}
        self.predict[name].send_multipart(pack(Message(PREDICT, payload, header_id or name, self._seq, "RL")))

    def send_learn(self, name: str, steps: int, sequences: int = 1) -> None:
        self._seq += 1
        payload = learn_payload(sequences, steps)
        self.learn[name].send_multipart(pack(Message(LEARN, payload, name, self._seq, "RL")))

    def serve(self, until, timeout_s: float, learner=None) -> bool:
        """Run the CDP loop until ``until()`` holds (True) or ``timeout_s`` passes (False)."""
        learner = learner or InlineLearner()
        poller = zmq.Poller()
        front = self.front
        sources = front.sources
        for source in (*sources, *self.predict.values(), *self.learn.values()):
            poller.register(source, zmq.POLLIN)
        learned = getattr(learner, "wake_socket", None)
        if learned is not None:
            poller.register(learned, zmq.POLLIN)
        deadline = time.monotonic() + timeout_s
        while not until():
            now = time.monotonic()
            if now >= deadline:
                return False
            # Wake at least every 50 ms: ``until`` may come true in another thread.
            wake = min(deadline, front.cdp.next_deadline() or deadline, now + 0.05)
            for sock, _ in poller.poll(poll_timeout_ms(wake - now)):
                if sock is learned:
                    learner.deliver()
                elif sock in sources:
                    front.drain(sources[sock], time.monotonic())
                else:
                    name = sock.getsockopt(zmq.IDENTITY).decode()
                    self.replies[name] = unpack(sock.recv_multipart())
            serve_ready([front.cdp], learner, time.monotonic())
        return True

    def have_replies(self, *names: str):
        return lambda: all(name in self.replies for name in names)


def test_a_batch_is_flushed_when_it_holds_max_batch_requests(ctx):
    front = make_cdp(ctx, max_batch=2, max_wait_ms=60_000)
    front.cdp.live = frozenset({"a", "b", "c"})
    agents = Agents(ctx, front, ["a", "b", "c"])
    agents.send_predict("a", np.ones((1, 2), np.float32))
    agents.send_predict("b", np.full((1, 2), 3, np.float32))

    # Agent c never asks and max_wait is a minute: only the size rule can flush.
    assert agents.serve(agents.have_replies("a", "b"), timeout_s=10)
    assert front.cdp.stats.predict_batches == 1 and front.cdp.stats.predict_rows == 2
    assert agents.replies["a"].kind == PREDICTION
    np.testing.assert_array_equal(agents.replies["b"].payload["actions"]["y"], np.full((1, 2), 6, np.float32))


def test_local_agents_reach_the_cdp_through_its_unix_streams_and_share_batches_with_tcp_agents(ctx, tmp_path):
    ct = ComputationTask("RL", DoublerAlgorithm(Scale()), device="cpu")
    front = SocketFront(ct, ctx, config=BatchingConfig(max_wait_ms=60_000), local_prefix=str(tmp_path / "ct0"))
    local = None
    try:
        assert front.local_predict_endpoint == f"unix://{tmp_path / 'ct0'}-predict"
        assert front.local_learn_endpoint == f"unix://{tmp_path / 'ct0'}-learn"
        front.cdp.live = frozenset({"local", "remote"})
        agents = Agents(ctx, front, ["remote"])
        local = StreamClient(front.local_predict_endpoint, max_bytes=DEFAULT_MAX_BYTES)
        local.send(
            pack(Message(PREDICT, {"inputs": {"x": np.ones((1, 2), np.float32)}, "states": {}}, "local", 1, "RL"))
        )
        agents.send_predict("remote", np.full((1, 2), 3, np.float32))

        def both_answered() -> bool:
            frames = local.receive(0)
            if frames is not None:
                agents.replies["local"] = unpack(frames)
            return "local" in agents.replies and "remote" in agents.replies

        # max_wait is a minute: only a batch that holds both (one from each kind of socket) is served.
        assert agents.serve(both_answered, timeout_s=10)
        assert front.cdp.stats.predict_batches == 1
        np.testing.assert_array_equal(agents.replies["local"].payload["actions"]["y"], np.full((1, 2), 2, np.float32))
        np.testing.assert_array_equal(agents.replies["remote"].payload["actions"]["y"], np.full((1, 2), 6, np.float32))
    finally:
        if local is not None:
            local.close()
        front.close()


def test_a_stream_keeps_the_agent_id_of_its_first_message(ctx, tmp_path):
    ct = ComputationTask("RL", DoublerAlgorithm(Scale()), device="cpu")
    front = SocketFront(ct, ctx, config=BatchingConfig(max_wait_ms=0), local_prefix=str(tmp_path / "ct0"))
    local = None
    try:
        front.cdp.live = frozenset({"a", "b"})
        agents = Agents(ctx, front, [])
        local = StreamClient(front.local_predict_endpoint, max_bytes=DEFAULT_MAX_BYTES)
        payload = {"inputs": {"x": np.ones((1, 2), np.float32)}, "states": {}}
        local.send(pack(Message(PREDICT, payload, "a", 1, "RL")))
        local.send(pack(Message(PREDICT, payload, "b", 2, "RL")))
        replies: list[Message] = []

        def two_replies() -> bool:
            frames = local.receive(0)
            if frames is not None:
                replies.append(unpack(frames))
            return len(replies) == 2

        assert agents.serve(two_replies, timeout_s=10)
        by_seq = {reply.seq: reply for reply in replies}
        assert by_seq[1].kind == PREDICTION
        assert by_seq[2].kind == ERROR and "does not match the connection's identity" in by_seq[2].payload["reason"]
        assert front.cdp.stats.rejected == 1
    finally:
        if local is not None:
            local.close()
        front.close()


def test_a_batch_is_flushed_when_every_live_agent_is_waiting(ctx):
    front = make_cdp(ctx, max_batch=64, max_wait_ms=60_000)
    front.cdp.live = frozenset({"a", "b"})
    agents = Agents(ctx, front, ["a", "b"])
    agents.send_predict("a", np.ones((1, 2), np.float32))
    # With one of two live agents waiting, nothing is flushed.
    assert not agents.serve(agents.have_replies("a"), timeout_s=0.2)
    agents.send_predict("b", np.ones((1, 2), np.float32))

    assert agents.serve(agents.have_replies("a", "b"), timeout_s=10)
    assert front.cdp.stats.predict_batches == 1 and front.cdp.stats.predict_rows == 2


def test_a_batch_is_flushed_when_its_oldest_request_has_waited_max_wait(ctx):
    max_wait_ms = 150
    front = make_cdp(ctx, max_batch=64, max_wait_ms=max_wait_ms)
    # Agent b is live but never asks, like a dead or slow agent.
    front.cdp.live = frozenset({"a", "b"})
    agents = Agents(ctx, front, ["a"])
    sent = time.monotonic()
    agents.send_predict("a", np.ones((1, 2), np.float32))

    assert agents.serve(agents.have_replies("a"), timeout_s=10)
    waited = time.monotonic() - sent
    assert waited >= max_wait_ms / 1000
    assert front.cdp.stats.predict_batches == 1 and front.cdp.stats.predict_rows == 1
    assert front.cdp.stats.max_predict_wait_ms >= max_wait_ms


def test_each_agent_gets_its_own_rows_of_a_batch(ctx):
    front = make_cdp(ctx, max_batch=64, max_wait_ms=60_000)
    front.cdp.live = frozenset({"a", "b"})
    agents = Agents(ctx, front, ["a", "b"])
    agents.send_predict("a", np.array([[1, 2], [3, 4]], np.float32))
    agents.send_predict("b", np.array([[5, 6]], np.float32))

    assert agents.serve(agents.have_replies("a", "b"), timeout_s=10)
    np.testing.assert_array_equal(agents.replies["a"].payload["actions"]["y"], [[2, 4], [6, 8]])
    np.testing.assert_array_equal(agents.replies["b"].payload["actions"]["y"], [[10, 12]])


def test_a_request_that_breaks_the_specs_gets_an_error_naming_key_expected_and_received(ctx):
    front = make_cdp(ctx, max_batch=64, max_wait_ms=1)
    agents = Agents(ctx, front, ["a", "b"])
    agents.send_predict("a", np.ones((1, 3), np.float32))

    assert agents.serve(agents.have_replies("a"), timeout_s=10)
    error = agents.replies["a"]
    assert error.kind == ERROR and error.payload["code"] == "spec"
    reason = error.payload["reason"]
    assert "inputs['x']" in reason and "(2,)" in reason and "(1, 3)" in reason
    assert front.cdp.stats.rejected == 1
    # The CDP keeps serving others.
    agents.send_predict("b", np.ones((1, 2), np.float32))
    assert agents.serve(agents.have_replies("b"), timeout_s=10)
    assert agents.replies["b"].kind == PREDICTION


def test_a_request_whose_header_names_another_agent_is_rejected(ctx):
    front = make_cdp(ctx, max_wait_ms=1)
    agents = Agents(ctx, front, ["a"])
    agents.send_predict("a", np.ones((1, 2), np.float32), header_id="someone-else")

    assert agents.serve(agents.have_replies("a"), timeout_s=10)
    assert agents.replies["a"].kind == ERROR
    assert "identity" in agents.replies["a"].payload["reason"]


def test_a_learn_batch_does_not_wait_for_an_agent_that_says_it_plays_an_evaluation_episode(ctx):
    # "c" says so in its requests: every row of its latest one is marked as an evaluation row.
    front = make_cdp(ctx, max_wait_ms=60_000, learn_max_batch=64, learn_max_wait_ms=60_000)
    front.cdp.live = frozenset({"a", "b", "c"})
    agents = Agents(ctx, front, ["a", "b", "c"])
    agents.send_predict("c", np.ones((1, 2), np.float32), evaluation=np.ones(1, bool))
    assert agents.serve(lambda: front.cdp.stats.predict_requests == 1, timeout_s=10)
    for name in ("a", "b"):
        agents.send_learn(name, steps=5)
    assert agents.serve(lambda: front.cdp.stats.learn_calls == 1, timeout_s=10)

    # Back in a training episode, "c" is waited for again.
    agents.send_predict("c", np.ones((1, 2), np.float32))
    assert agents.serve(lambda: front.cdp.stats.predict_requests == 2, timeout_s=10)
    for name in ("a", "b"):
        agents.send_learn(name, steps=5)
    assert not agents.serve(lambda: front.cdp.stats.learn_calls == 2, timeout_s=0.3)
    agents.send_learn("c", steps=5)
    assert agents.serve(lambda: front.cdp.stats.learn_calls == 2, timeout_s=10)


def test_an_evaluation_row_among_training_rows_does_not_make_an_agent_count_as_evaluating(ctx):
    # A VectorAgent's evaluation env is one marked row among its training rows: it goes on sending learn requests.
    front = make_cdp(ctx, max_wait_ms=60_000, learn_max_batch=64, learn_max_wait_ms=60_000)
    front.cdp.live = frozenset({"a", "b"})
    agents = Agents(ctx, front, ["a", "b"])
    agents.send_predict("a", np.ones((1, 2), np.float32))
    agents.send_predict("b", np.ones((2, 2), np.float32), evaluation=np.array([False, True]))
    assert agents.serve(agents.have_replies("a", "b"), timeout_s=10)
    agents.send_learn("a", steps=5)
    assert not agents.serve(lambda: front.cdp.stats.learn_calls == 1, timeout_s=0.3)


def test_a_predict_request_whose_evaluation_marks_are_not_one_boolean_per_row_is_refused(ctx):
    front = make_cdp(ctx, max_wait_ms=1)
    front.cdp.live = frozenset({"a"})
    agents = Agents(ctx, front, ["a"])
    agents.send_predict("a", np.ones((2, 2), np.float32), evaluation=np.ones(2, np.int64))
    assert agents.serve(agents.have_replies("a"), timeout_s=10)
    assert agents.replies["a"].kind == ERROR and "evaluation" in agents.replies["a"].payload["reason"]
    assert front.cdp.stats.rejected == 1


def test_learn_requests_of_all_live_agents_become_one_learn_call(ctx):
    front = make_cdp(ctx, learn_max_batch=64, learn_max_wait_ms=60_000)
    front.cdp.live = frozenset({"a", "b", "c"})
    agents = Agents(ctx, front, ["a", "b", "c"])
    for name in ("a", "b"):
        agents.send_learn(name, steps=5)
    agents.send_learn("c", steps=5, sequences=4)  # a replay sample: several sequences in one request

    assert agents.serve(agents.have_replies("a", "b", "c"), timeout_s=10)
    assert front.cdp.stats.learn_calls == 1
    reply = agents.replies["c"]
    assert reply.kind == LEARNED
    assert reply.payload["costs"] == {"batch": 6.0, "steps": 5.0}


def test_predictions_are_served_while_learn_runs_in_the_learner_thread(ctx):
    learning, served = threading.Event(), threading.Event()

    class SlowLearn(DoublerAlgorithm):
        def learn(self, experience):
            learning.set()
            # Returns as soon as a prediction was served meanwhile, or gives up after 10 s.
            return {"served_meanwhile": float(served.wait(timeout=10))}

    ct = ComputationTask("RL", SlowLearn(Scale()), device="cpu")
    ct.act_beside_learning()
    front = SocketFront(ct, ctx, config=BatchingConfig(max_wait_ms=1, learn_max_wait_ms=1))
    front.cdp.live = frozenset({"a"})
    learner = LearnerThread(ctx)
    try:
        agents = Agents(ctx, front, ["a"])
        agents.send_learn("a", steps=2)
        assert agents.serve(learning.is_set, timeout_s=10, learner=learner)
        agents.send_predict("a", np.ones((1, 2), np.float32))
        assert agents.serve(agents.have_replies("a"), timeout_s=10, learner=learner)
        served.set()
        # Served by the weights of before the learn() call: version 0.
        assert agents.replies["a"].kind == PREDICTION and agents.replies["a"].payload["version"] == 0
        assert agents.serve(lambda: agents.replies["a"].kind == LEARNED, timeout_s=10, learner=learner)
        assert agents.replies["a"].payload["costs"] == {"served_meanwhile": 1.0}
        agents.replies.clear()
        agents.send_predict("a", np.ones((1, 2), np.float32))
        assert agents.serve(agents.have_replies("a"), timeout_s=10, learner=learner)
        assert agents.replies["a"].payload["version"] == 1
    finally:
        served.set()
        learner.close()
