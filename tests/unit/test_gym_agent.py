"""GymAgent between an env and a CT: observations and rewards in the spec dtypes, Box actions clipped for the env only."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from flare2.core.envs import GymAgent
from flare2.core.specs import CTSpecs, Spec
from flare2.runtime.agent_process import StopRequested, make_envs

from doubles import KeepingHelper

SPECS = CTSpecs(inputs={"obs": Spec((3,), "float32")}, actions={"action": Spec((2,), "float32")}, states={},
                rewards={"reward": Spec((), "float32")})


class Reacher(gym.Env):
    """float64 observations and rewards; records the actions it was given."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (3,), np.float64)
    action_space = gym.spaces.Box(np.array([-1.0, 0.0]), np.array([1.0, 0.5]), dtype=np.float64)

    def __init__(self) -> None:
        self.actions: list[np.ndarray] = []

    def reset(self, *, seed=None, options=None):
        return np.full(3, 1 / 3), {}

    def step(self, action):
        self.actions.append(np.array(action))
        return np.full(3, 2 / 3), 0.1, False, False, {}


class OutOfBoundsPort:
    """Answers with actions outside the Box: [5, -5] for every row; stops the agent after ``steps`` answers."""

    learn_ahead = 0

    def __init__(self, steps: int) -> None:
        self.steps, self.sent = steps, []

    def send_predict(self, payload):
        self.sent.append(payload)
        return len(self.sent)

    def wait_predict(self, ticket):
        if ticket > self.steps:
            raise StopRequested()
        rows = len(self.sent[ticket - 1]["inputs"]["obs"])
        return {"actions": {"action": np.tile(np.array([5.0, -5.0], np.float32), (rows, 1))}, "states": {}, "version": 0}


def test_observations_and_rewards_take_the_spec_dtypes_and_actions_are_clipped_for_the_env_only():
    agent = GymAgent()
    agent.num_envs = 2
    agent.make_env = Reacher
    make_envs(agent, 0)
    port, helper = OutOfBoundsPort(3), KeepingHelper()
    agent.connect(agent_id="a0", seed=0, specs={"RL": SPECS}, ports={"RL": port}, helpers={"RL": helper})
    with pytest.raises(StopRequested):
        agent.run()

    assert port.sent[0]["inputs"]["obs"].dtype == np.float32
    np.testing.assert_allclose(port.sent[0]["inputs"]["obs"], np.full((2, 3), 1 / 3, np.float32))
    for env in agent.envs:
        env = env.unwrapped
        assert [action.tolist() for action in env.actions] == [[1.0, 0.0]] * 3
    first = helper.steps[0]
    assert first["inputs"]["obs"].dtype == np.float32 and first["next_inputs"]["obs"].dtype == np.float32
    assert first["rewards"]["reward"].dtype == np.float32 and first["rewards"]["reward"].tolist() == pytest.approx([0.1] * 2)
    # What is learned from is the action the CT chose, not the clipped one.
    assert first["actions"]["action"].tolist() == [[5.0, -5.0]] * 2
