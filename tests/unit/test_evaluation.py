"""Evaluation episodes: which episodes they are, how they are counted, what the agent sends."""

from __future__ import annotations

import numpy as np
import pytest

from flare2.core.agent import Agent, EvaluationSchedule
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import SpecError
from flare2.runtime.agents.episodes import EpisodeRecorder, EpisodeStats
from flare2.runtime.agents.playing import StopRequested, play


class _OneStepEnv:
    def reset(self, **_):
        return np.zeros(1, np.float32), {}

    def step(self, _action):
        return np.zeros(1, np.float32), 2.0, True, False, {}


class _RecordingPort:
    def __init__(self):
        self.payloads = []

    def send_predict(self, payload):
        self.payloads.append(payload)
        return len(self.payloads)

    def wait_predict(self, ticket):
        return {"actions": {"action": np.zeros(1, np.int64)}, "states": {}, "version": 0}


class _RecordingHelper:
    def __init__(self):
        self.steps = []

    def attach(self, ct, specs, port, *, num_envs=1):
        pass

    def store(self, step):
        self.steps.append(step)


SPECS = CTSpecs(
    inputs={"obs": Spec((1,), "float32")},
    actions={"action": Spec((), "int64")},
    states={},
    rewards={"reward": Spec((), "float32")},
)


def episode_kinds(eval_every: int, episodes: int) -> list[bool]:
    """Whether each of an Agent's first ``episodes`` episodes is an evaluation episode, as the runtime plays them."""
    schedule, kinds = EvaluationSchedule(eval_every), []
    for _ in range(episodes):
        kinds.append(schedule.start_if_due())
        if not kinds[-1]:
            schedule.training_episodes_ended()
    return kinds


def test_every_nth_plus_one_episode_is_an_evaluation_after_n_training_episodes():
    assert episode_kinds(2, 6) == [False, False, True, False, False, True]
    assert not any(episode_kinds(0, 5))


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
    step = {
        "inputs": {"obs": np.zeros(1)},
        "actions": {"action": 0},
        "rewards": {"reward": 1.0},
        "next_inputs": {"obs": np.zeros(1)},
        "terminated": False,
        "truncated": False,
    }
    agent.predict("RL", {"obs": np.zeros(1, np.float32)})
    agent.store("RL", **step)
    agent.evaluating = True
    agent.predict("RL", {"obs": np.zeros(1, np.float32)})
    agent.store("RL", **step)
    assert [payload["evaluation"].tolist() if "evaluation" in payload else [False] for payload in port.payloads] == [
        [False],
        [True],
    ]
    assert len(helper.steps) == 1


def test_a_predict_request_with_a_non_boolean_evaluation_flag_is_refused():
    with pytest.raises(SpecError, match="evaluation"):
        SPECS.check_predict({"inputs": {"obs": np.zeros((1, 1), np.float32)}, "evaluation": 1})


class _OneStepAgent(Agent):
    def run_episode(self):
        self.env.reset()
        actions, _ = self.predict("RL", {"obs": np.zeros(1, np.float32)})
        self.env.step(actions["action"])


def test_an_agent_marks_every_request_of_its_evaluation_episodes_and_they_are_counted_apart():
    agent, port = _OneStepAgent(), _RecordingPort()
    agent.num_envs, agent.eval_every = 1, 2
    agent.env = EpisodeRecorder(_OneStepEnv(), stats := EpisodeStats())
    agent.connect(agent_id="a0", seed=0, specs={"RL": SPECS}, ports={"RL": port}, helpers={"RL": _RecordingHelper()})
    episodes = 0

    def between_episodes():
        nonlocal episodes
        episodes += 1
        if episodes == 6:
            raise StopRequested()

    with pytest.raises(StopRequested):
        play(agent, between_episodes)
    assert ["evaluation" in payload for payload in port.payloads] == [False, False, True, False, False, True]
    assert stats.take() == {"steps": 4, "episodes": [[2.0, 1]] * 4, "eval_steps": 2, "eval_episodes": [[2.0, 1]] * 2}
