"""The learner process: learn() in a process of its own, its weights adopted by the compute side's CT."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from multiprocessing import resource_tracker
from pathlib import Path

import numpy as np
import pytest
import torch
from doubles import Scale, learn_payload

from flare2.core.algorithm import Algorithm
from flare2.core.computation_task import ComputationTask
from flare2.errors import ConfigError, LearnerDiedError, UserCodeError
from flare2.runtime.compute.cdp import ComputationDataProcessor
from flare2.runtime.compute.compute_process import build_cts, choose_learner
from flare2.runtime.compute.learner_group import join
from flare2.runtime.compute.learner_main import LearnerSettings
from flare2.runtime.compute.learner_process import LearnerProcess
from flare2.runtime.config import BatchingConfig, CTConfig
from flare2.wire.protocol import LEARN, LEARNED, Message


class AddsOneEachLearn(Algorithm):
    """learn() adds 1 to the scale and counts the sequences it saw; it raises on a batch whose inputs hold 7."""

    may_learn_in_own_process = True

    def __init__(self, model: Scale) -> None:
        super().__init__(model)
        self.learned_in_pid = 0

    def predict(self, inputs, states):
        return {"y": inputs["x"] * self.model.scale}, {}

    def learn(self, experience):
        if (experience.inputs["x"] == 7).any():
            raise ValueError("seven is not allowed")
        with torch.no_grad():
            self.model.scale += 1
            self.model.seen += experience.inputs["x"].shape[0]
        self.learned_in_pid = os.getpid()
        return {"pid": float(os.getpid()), "lag": float(experience.policy_lag.float().mean())}

    def state_dict(self):
        return {**super().state_dict(), "learned_in_pid": self.learned_in_pid}


class KeepsACounter(AddsOneEachLearn):
    may_learn_in_own_process = False


def build(kind: type = AddsOneEachLearn) -> Algorithm:
    return kind(Scale())


def build_fails_in_the_learner() -> Algorithm:
    if multiprocessing.current_process().name.startswith("flare2-learner"):
        raise RuntimeError("no model file on this side")
    return build()


def learn_message(agent: str, seq: int, fill: float = 1.0, version: int = 0) -> Message:
    payload = learn_payload(3, 2, fill=fill, version=version)
    return Message(LEARN, payload, agent, seq, "RL")


@pytest.fixture(autouse=True)
def _stop_the_resource_tracker():
    """Starting a process with spawn starts multiprocessing's resource tracker in the starting process. In a run that
    is the compute process, which the tracker ends with; here it is the test's, so the test ends it."""
    yield
    resource_tracker._resource_tracker._stop()


@pytest.fixture
def served():
    """A CT and its CDP as the compute process holds them, a learner process beside them, and the replies sent."""
    configs = (CTConfig(name="RL", build=build),)
    [ct] = build_cts(configs, device="cpu", seed=0, torch_threads=1)
    replies: list[Message] = []
    cdp = ComputationDataProcessor(
        ct, config=BatchingConfig(), reply=lambda to, learn, message: replies.append(message)
    )
    cdp.live = frozenset({"a"})
    settings = LearnerSettings(
        cts=configs, device="cpu", seed=0, torch_threads=1, resume_dir=None, parent_pid=os.getpid()
    )
    learner = LearnerProcess([ct], settings)
    try:
        yield ct, cdp, learner, replies
    finally:
        learner.close()


def learn_once(cdp, learner, message: Message) -> None:
    cdp.accept(message, "a", 0.0, learn=True)
    batch = cdp.take_learn_batch(0.0, flush=True)
    learner.submit(batch)
    assert not learner.idle
    learner.finish()
    assert learner.idle


def test_learn_runs_in_the_learner_process_and_its_weights_become_the_next_acting_version(served):
    ct, cdp, learner, replies = served
    learn_once(cdp, learner, learn_message("a", 1))
    [reply] = replies
    assert reply.kind == LEARNED
    assert reply.payload["costs"]["pid"] not in (0.0, float(os.getpid()))
    assert ct.version == 1 and ct.learn_calls == 1 and cdp.stats.learn_calls == 1
    # The learner's weights, parameter and buffer, now answer predictions here.
    assert ct.algorithm.model.scale.item() == 3.0 and ct.algorithm.model.seen.item() == 3
    actions, _ = ct.predict({"x": np.ones((1, 2), np.float32)}, {})
    assert actions["y"].tolist() == [[3.0, 3.0]]
    assert ct.predicted_version == 1

    # Steps acted by version 0 and learned by version 1 lag one update.
    learn_once(cdp, learner, learn_message("a", 2, version=0))
    assert replies[-1].payload["costs"]["lag"] == 1.0
    assert cdp.stats.policy_lag_sum == 6 and cdp.stats.policy_lag_steps == 12
    assert ct.algorithm.model.scale.item() == 4.0


def test_a_learn_that_raises_stops_the_run_with_its_traceback(served):
    ct, cdp, learner, replies = served
    with pytest.raises(UserCodeError, match="seven is not allowed"):
        learn_once(cdp, learner, learn_message("a", 1, fill=7.0))
    assert replies[-1].kind == "error" and "seven is not allowed" in replies[-1].payload["traceback"]
    assert ct.version == 0 and ct.algorithm.model.scale.item() == 2.0


def test_the_learner_process_writes_the_checkpoint_with_its_own_state(served, tmp_path):
    ct, cdp, learner, _ = served
    learn_once(cdp, learner, learn_message("a", 1))
    ct.predict({"x": np.ones((1, 2), np.float32)}, {})
    path = tmp_path / "RL.pt"
    learner.save([(ct, str(path))], {"env_steps": 40})
    state = torch.load(path, weights_only=True)
    assert state["algorithm"]["learned_in_pid"] not in (0, os.getpid())
    assert state["algorithm"]["model"]["scale"].item() == 3.0
    # The compute process counts predictions and learned rows (the batch's 6): the learner saves them with its own.
    assert state["counters"] == {"env_steps": 40, "predict_calls": 1, "learn_calls": 1, "learned_rows": 6}


def test_a_killed_learner_process_is_named_as_the_cause(served):
    ct, cdp, learner, _ = served
    os.kill(learner.pids[0], signal.SIGKILL)
    with pytest.raises(LearnerDiedError, match="the learner process died \\(killed by signal 9\\)"):
        learn_once(cdp, learner, learn_message("a", 1))


def test_auto_picks_a_learner_process_only_where_every_algorithm_allows_one():
    allowed = ComputationTask("RL", build(), device="cpu")
    refusing = ComputationTask("Aux", build(KeepsACounter), device="cpu")
    if (os.cpu_count() or 1) > 1:
        assert choose_learner("auto", [allowed]) == "process"
    assert choose_learner("auto", [allowed, refusing]) == "inline"
    assert choose_learner("thread", [refusing]) == "thread"
    with pytest.raises(ConfigError, match="CT 'Aux' \\(KeepsACounter\\).*use --learner thread or inline"):
        choose_learner("process", [allowed, refusing])


def test_the_learner_process_starts_from_the_compute_sides_weights():
    configs = (CTConfig(name="RL", build=build),)
    [ct] = build_cts(configs, device="cpu", seed=0, torch_threads=1)
    with torch.no_grad():
        ct.algorithm.model.scale.fill_(5.0)  # as a resumed checkpoint or another random draw would leave it
    cdp = ComputationDataProcessor(ct, config=BatchingConfig(), reply=lambda to, learn, message: None)
    cdp.live = frozenset({"a"})
    settings = LearnerSettings(
        cts=configs, device="cpu", seed=0, torch_threads=1, resume_dir=None, parent_pid=os.getpid()
    )
    learner = LearnerProcess([ct], settings)
    try:
        learn_once(cdp, learner, learn_message("a", 1))
    finally:
        learner.close()
    assert ct.algorithm.model.scale.item() == 6.0


def test_a_learner_process_that_cannot_build_ends_the_run_with_its_traceback():
    configs = (CTConfig(name="RL", build=build_fails_in_the_learner),)
    [ct] = build_cts(configs, device="cpu", seed=0, torch_threads=1)
    cdp = ComputationDataProcessor(ct, config=BatchingConfig(), reply=lambda to, learn, message: None)
    cdp.live = frozenset({"a"})
    settings = LearnerSettings(
        cts=configs, device="cpu", seed=0, torch_threads=1, resume_dir=None, parent_pid=os.getpid()
    )
    learner = LearnerProcess([ct], settings)
    try:
        with pytest.raises(LearnerDiedError, match="the learner process could not build the CTs") as caught:
            learn_once(cdp, learner, learn_message("a", 1))
        assert 'raise RuntimeError("no model file on this side")' in caught.value.remote_traceback
    finally:
        learner.close()


PEER_GONE = "FLARE2_TEST_PEER_GONE"
"""The file whose existence says that the other learner of the group has died."""


def build_once_the_other_learner_is_gone() -> Algorithm:
    """In the learner process, the CTs are built once the other learner died: the group's first collective call, as
    the build shares the weights, meets a dead peer."""
    if multiprocessing.current_process().name.startswith("flare2-learner"):
        marker, deadline = Path(os.environ[PEER_GONE]), time.monotonic() + 60
        while not marker.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{marker} did not appear within 60 s")
            time.sleep(0.01)
    return build()


def join_then_die(rendezvous: str) -> None:
    """A learner of another machine that joins the group, then dies before it takes part in anything."""
    join(rendezvous, 1, 2, device="cpu", rendezvous_timeout_s=60, timeout_s=60)
    os._exit(0)


def test_a_learner_that_dies_as_the_group_forms_is_a_lost_learner_not_a_failed_build(tmp_path, monkeypatch):
    # The group of learners formed, then one died before the weights went round: the run forms a new group (a
    # learner lost) rather than stopping as if the CTs could not be built.
    marker = tmp_path / "peer_gone"
    monkeypatch.setenv(PEER_GONE, str(marker))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        rendezvous = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    configs = (CTConfig(name="RL", build=build_once_the_other_learner_is_gone),)
    [ct] = build_cts(configs, device="cpu", seed=0, torch_threads=1)
    cdp = ComputationDataProcessor(ct, config=BatchingConfig(), reply=lambda to, learn, message: None)
    cdp.live = frozenset({"a"})
    settings = LearnerSettings(
        cts=configs,
        device="cpu",
        seed=0,
        torch_threads=1,
        resume_dir=None,
        parent_pid=os.getpid(),
        learners=2,
        remote_learners=1,
        rendezvous=rendezvous,
        rendezvous_timeout_s=60,
    )
    learner = LearnerProcess([ct], settings)
    other = multiprocessing.get_context("spawn").Process(target=join_then_die, args=(rendezvous,))
    other.start()
    try:
        other.join(60)
        assert other.exitcode == 0
        marker.touch()
        with pytest.raises(LearnerDiedError, match="could not build the CTs or join the other learners") as caught:
            learn_once(cdp, learner, Message(LEARN, learn_payload(2, 2), "a", 1, "RL"))  # a sequence each
        assert caught.value.lost and caught.value.elsewhere, caught.value.remote_traceback
        assert "a learner left while the group formed" in caught.value.remote_traceback
    finally:
        learner.close()
        other.kill()
        other.join()
