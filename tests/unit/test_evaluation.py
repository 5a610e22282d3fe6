"""Evaluation episodes: which episodes they are, how they are counted, what the agent sends."""

from __future__ import annotations

import numpy as np
import pytest

from flare2.core.agent import Agent
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import SpecError
from flare2.runtime.agents.episodes import EpisodeRecorder, EpisodeStats, is_evaluation_episode


class _OneStepEnv:
    def reset(self, **_):
        return np.zeros(1, np.float32), {}

    def step(self, _action):
        return np.zeros(1, np.float32), 2.0, True, False, {}


class _RecordingPort:
    def __init__(self):
        self.payloads = []
        self.evaluating = []

    def set_evaluating(self, evaluating):
        self.evaluating.append(evaluating)

    def predict(self, payload):
        self.payloads.append(payload)
        return {"actions": {"action": np.zeros(1, np.int64)}, "states": {}, "version": 0}


class _RecordingHelper:
    def __init__(self):
        self.steps = []

    def attach(self, ct, specs, port, *, num_envs=1):
        pass

    def store(self, step):
        self.steps.append(step)


SPECS = CTSpecs(inputs={"obs": Spec((1,), "float32")}, actions={"action": Spec((), "int64")}, states={},
                rewards={"reward": Spec((), "float32")})


def test_every_nth_plus_one_episode_is_an_evaluation_after_n_training_episodes():
    assert [is_evaluation_episode(i, 2) for i in range(6)] == [False, False, True, False, False, True]
    assert not any(is_evaluation_episode(i, 0) for i in range(5))


def test_evaluation_episodes_are_counted_apart_from_training_episodes():
    stats = EpisodeStats()
    recorder = EpisodeRecorder(_OneStepEnv(), stats)
    recorder.reset()
    recorder.step(0)
    recorder.evaluating = True
    recorder.reset()
    recorder.step(0)
    assert stats.take() == {"steps": 1, "episodes": [[2.0, 1]], "eval_steps": 1, "eval_episodes": [[2.0, 1]]}
    assert stats.take() == {"steps": 0, "episodes": []}


def test_an_evaluating_agent_asks_for_greedy_actions_and_stores_nothing():
    agent, port, helper = Agent(), _RecordingPort(), _RecordingHelper()
    agent.connect(agent_id="a0", seed=0, specs={"RL": SPECS}, ports={"RL": port}, helpers={"RL": helper})
    step = dict(inputs={"obs": np.zeros(1)}, actions={"action": 0}, rewards={"reward": 1.0},
                next_inputs={"obs": np.zeros(1)}, terminated=False, truncated=False)
    agent.predict("RL", {"obs": np.zeros(1, np.float32)})
    agent.store("RL", **step)
    agent.evaluating = True
    agent.predict("RL", {"obs": np.zeros(1, np.float32)})
    agent.store("RL", **step)
    assert [payload.get("greedy", [False]).tolist() if "greedy" in payload else [False] for payload in port.payloads] == [
        [False], [True]]
    assert len(helper.steps) == 1


def test_a_predict_request_with_a_non_boolean_greedy_flag_is_refused():
    with pytest.raises(SpecError, match="greedy"):
        SPECS.check_predict({"inputs": {"obs": np.zeros((1, 1), np.float32)}, "greedy": 1})


def test_an_agent_tells_each_of_its_cts_when_an_evaluation_episode_starts_and_ends():
    agent, ports = Agent(), {"RL": _RecordingPort(), "aux": _RecordingPort()}
    agent.connect(agent_id="a0", seed=0, specs={"RL": SPECS, "aux": SPECS}, ports=ports,
                  helpers={"RL": _RecordingHelper(), "aux": _RecordingHelper()})
    for evaluating in (False, False, True, True, False):
        agent.start_episode(evaluating=evaluating)
        assert agent.evaluating is evaluating
    # Only the changes travel, and every CT hears them, asked in the episode or not.
    assert ports["RL"].evaluating == ports["aux"].evaluating == [True, False]
