"""GymAgent between an env and a CT: observations and rewards in the spec dtypes, Box actions clipped for the env only."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from doubles import AnsweringPort, KeepingHelper

from flare2.core.envs import GymAgent
from flare2.core.spaces import action_specs, input_specs
from flare2.core.specs import CTSpecs, Spec
from flare2.runtime.agents.playing import StopRequested, make_envs
from flare2.wire.ragged import Ragged

SPECS = CTSpecs(
    inputs={"obs": Spec((3,), "float32")},
    actions={"action": Spec((2,), "float32")},
    states={},
    rewards={"reward": Spec((), "float32")},
)


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


def out_of_bounds(inputs):
    """Actions outside the Box: [5, -5] for every row."""
    return {"action": np.tile(np.array([5.0, -5.0], np.float32), (len(inputs["obs"]), 1))}


def test_observations_and_rewards_take_the_spec_dtypes_and_actions_are_clipped_for_the_env_only():
    agent = GymAgent()
    agent.num_envs = 2
    agent.make_env = Reacher
    make_envs(agent, 0)
    port, helper = AnsweringPort(3, out_of_bounds), KeepingHelper()
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
    assert first["rewards"]["reward"].dtype == np.float32 and first["rewards"]["reward"].tolist() == pytest.approx(
        [0.1] * 2
    )
    # What is learned from is the action the CT chose, not the clipped one.
    assert first["actions"]["action"].tolist() == [[5.0, -5.0]] * 2


class Crates(gym.Env):
    """Entities: env i shows (i + t) % 3 crates at step t, crate j at (10 * i + j, t); an episode lasts 3 steps.

    It records each action it gets: one push (0-2) per crate it showed, and which crate to pick.
    """

    observation_space = gym.spaces.Dict(
        {
            "crates": gym.spaces.Sequence(gym.spaces.Box(-100.0, 100.0, (2,))),
            "me": gym.spaces.Box(-1.0, 1.0, (1,)),
        }
    )
    action_space = gym.spaces.Dict(
        {"push": gym.spaces.Sequence(gym.spaces.Discrete(3)), "pick": gym.spaces.Discrete(4)}
    )

    def __init__(self, index: int) -> None:
        self.index, self.t, self.actions = index, 0, []

    def observe(self):
        count = (self.index + self.t) % 3
        crates = tuple(np.array([10.0 * self.index + j, self.t]) for j in range(count))
        return {"crates": crates, "me": np.array([self.t / 10])}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.observe(), {}

    def step(self, action):
        self.actions.append((self.observe(), action))
        self.t += 1
        return self.observe(), 1.0, self.t == 3, False, {}


def push_each_crate(inputs):
    """Pushes each crate by its index within the env mod 3, and picks the number of crates."""
    crates = inputs["crates"]
    push = Ragged.from_items([np.arange(len(items)) % 3 for items in crates.items()], (), "int64")
    return {"push": push, "pick": crates.lengths.copy()}


def test_dict_and_sequence_spaces_go_as_ragged_rows_and_each_env_gets_its_own_entities_actions():
    made = iter(range(10))
    agent = GymAgent()
    agent.num_envs = 3
    agent.make_env = lambda: Crates(next(made))
    make_envs(agent, 0)
    specs = CTSpecs(
        inputs={"crates": Spec((None, 2), "float32"), "me": Spec((1,), "float32")},
        actions={"push": Spec((None,), "int64"), "pick": Spec((), "int64")},
        states={},
        rewards={"reward": Spec((), "float32")},
    )
    assert {
        "inputs": input_specs(agent.envs[0].observation_space),
        "actions": action_specs(agent.envs[0].action_space),
    } == {"inputs": specs.inputs, "actions": specs.actions}
    port, helper = AnsweringPort(4, push_each_crate), KeepingHelper()
    agent.connect(agent_id="a0", seed=0, specs={"RL": specs}, ports={"RL": port}, helpers={"RL": helper})
    agent.check_specs({"RL": specs})
    with pytest.raises(StopRequested):
        agent.run()

    first = port.sent[0]["inputs"]["crates"]
    assert isinstance(first, Ragged) and first.lengths.tolist() == [0, 1, 2] and first.dtype == np.float32
    for env in agent.envs:
        env = env.unwrapped
        for observation, action in env.actions:
            assert action["push"].tolist() == [j % 3 for j in range(len(observation["crates"]))]
            assert action["pick"] == len(observation["crates"])
    # Step 3 ended every episode: the stored next_inputs keep the final crates, the next request the reset ones.
    last = helper.steps[2]
    assert last["terminated"].tolist() == [True] * 3
    assert [row.tolist() for row in last["next_inputs"]["crates"].items()] == [[], [[10, 3]], [[20, 3], [21, 3]]]
    assert port.sent[3]["inputs"]["crates"].lengths.tolist() == [0, 1, 2]
    assert port.sent[3]["inputs"]["crates"].values[:, 1].tolist() == [0, 0, 0]
    assert last["next_inputs"]["crates"].values[:, 1].tolist() == [3, 3, 3]


class Informative(gym.Env):
    """Gives info {"hits": t} on odd steps t, nothing on even ones."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,))
    action_space = gym.spaces.Box(-1.0, 1.0, (2,))

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        info = {"hits": self.t} if self.t % 2 else {}
        return np.zeros(3, np.float32), 0.0, False, False, info


def run_informative(infos, extras, steps=4):
    specs = CTSpecs(inputs=SPECS.inputs, actions=SPECS.actions, states={}, rewards=SPECS.rewards, extras=extras)
    agent = GymAgent(infos=infos)
    agent.num_envs = 2
    agent.make_env = Informative
    make_envs(agent, 0)
    port, helper = AnsweringPort(steps, out_of_bounds), KeepingHelper()
    agent.connect(agent_id="a0", seed=0, specs={"RL": specs}, ports={"RL": port}, helpers={"RL": helper})
    with pytest.raises(StopRequested):
        agent.run()
    return helper.steps


def test_named_info_entries_travel_with_each_step_as_extras_and_a_step_without_one_stores_zeros():
    steps = run_informative(["hits"], {"hits": Spec((), "int64"), "returns": Spec((), "float32")})
    assert [step["extras"]["hits"].tolist() for step in steps] == [[1, 1], [0, 0], [3, 3], [0, 0]]
    # An extra no info names is zeros, for a helper's postprocess to fill.
    assert [step["extras"]["returns"].tolist() for step in steps] == [[0.0, 0.0]] * 4


def test_an_info_entry_that_is_no_extra_spec_or_does_not_fit_one_is_named():
    from flare2.errors import ConfigError, SpecError

    with pytest.raises(ConfigError, match=r"infos \['hits'\] are not among the extra specs"):
        run_informative(["hits"], {})
    with pytest.raises(
        SpecError, match=r"info\['hits'\] of env 'CartPole-v1' is a int64 of shape \(\), which does not fit"
    ):
        run_informative(["hits"], {"hits": Spec((2,), "int64")})
    with pytest.raises(SpecError, match=r"info\['hits'\].*does not fit extra spec Spec\(shape=\(\), dtype='bool'\)"):
        run_informative(["hits"], {"hits": Spec((), "bool")})
