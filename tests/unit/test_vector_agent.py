"""GymAgent with several envs per process: one request per step, and the episode edges of every env."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from doubles import AnsweringPort, KeepingHelper

from flare2.core.agent import Agent
from flare2.core.envs import GymAgent
from flare2.core.helpers import stack_steps
from flare2.core.learn_requests import check_learn, pack
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import ConfigError
from flare2.runtime.agents.playing import StopRequested, check_envs_per_agent, make_agent, make_envs
from flare2.runtime.config import AgentConfig
from flare2.runtime.supervisor import AgentLaunch

SPECS = CTSpecs(
    inputs={"obs": Spec((1,), "float32")},
    actions={"action": Spec((), "int64")},
    states={},
    rewards={"reward": Spec((), "float32")},
)


class Countdown(gym.Env):
    """Observation: steps left. Ends after ``length`` steps, by termination or (``truncate``) by a time limit."""

    observation_space = gym.spaces.Box(-1e9, 1e9, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int, truncate: bool) -> None:
        self.length, self.truncate = length, truncate
        self.left = length
        self.seeds: list[int | None] = []

    def reset(self, *, seed=None, options=None):
        self.seeds.append(seed)
        self.left = self.length
        return np.array([self.left], np.float32), {}

    def step(self, action):
        self.left -= 1
        ended = self.left == 0
        return np.array([self.left], np.float32), 1.0, ended and not self.truncate, ended and self.truncate, {}


class ScriptedPort(AnsweringPort):
    """Answers every predict with action 0 and weights version 7; stops the agent after ``steps`` answers."""

    def __init__(self, steps: int) -> None:
        super().__init__(steps, lambda inputs: {"action": np.zeros(len(inputs["obs"]), np.int64)})

    @property
    def payloads(self) -> list[dict]:
        """The payloads of the requests that were answered."""
        return self.sent[: self.steps]

    def version(self, ticket: int) -> int:
        return 7


def play_countdowns(
    steps: int, *, eval_every: int = 0, double_buffer: bool = False, port: ScriptedPort | None = None
) -> tuple[GymAgent, ScriptedPort, KeepingHelper, dict]:
    """A GymAgent with 3 envs: episodes of 2 steps (terminated), 3 steps (truncated), 2 steps (truncated)."""
    agent = GymAgent(double_buffer=double_buffer)
    agent.num_envs = 3
    shapes = iter([(2, False), (3, True), (2, True), (4, False)])
    agent.make_env = lambda: Countdown(*next(shapes))
    stats = make_envs(agent, eval_every)
    port, helper = port or ScriptedPort(steps), KeepingHelper()
    agent.connect(agent_id="a0", seed=5, specs={"RL": SPECS}, ports={"RL": port}, helpers={"RL": helper})
    with pytest.raises(StopRequested):
        agent.run()
    return agent, port, helper, stats.take()


def test_one_request_of_one_row_per_env_each_step():
    _, port, helper, _ = play_countdowns(4)
    assert [payload["inputs"]["obs"].shape for payload in port.payloads] == [(3, 1)] * 4
    assert len(helper.steps) == 4 and helper.steps[0]["inputs"]["obs"].shape == (3, 1)
    assert helper.num_envs == 3


def test_an_ended_episode_keeps_its_final_observation_and_the_next_step_starts_from_the_reset():
    _, port, helper, _ = play_countdowns(4)
    second = helper.steps[1]
    # Env 0 terminated at its 2nd step, env 2 was truncated there; env 1 goes on.
    assert second["terminated"].tolist() == [True, False, False]
    assert second["truncated"].tolist() == [False, False, True]
    assert second["next_inputs"]["obs"][:, 0].tolist() == [0, 1, 0]
    # Their next step starts from a fresh episode; env 1 ends its 3-step episode by a time limit.
    assert helper.steps[2]["inputs"]["obs"][:, 0].tolist() == [2, 1, 2]
    assert helper.steps[2]["truncated"].tolist() == [False, True, False]
    assert port.payloads[2]["inputs"]["obs"][:, 0].tolist() == [2, 1, 2]


def test_every_step_carries_the_version_of_the_weights_that_chose_it():
    _, _, helper, _ = play_countdowns(2)
    assert all(step["policy_version"].tolist() == [7, 7, 7] for step in helper.steps)
    payload = stack_steps(helper.steps, SPECS)
    assert payload["policy_version"].shape == (3, 2) and payload["inputs"]["obs"].shape == (3, 2, 1)
    check_learn(SPECS, pack(SPECS, payload, 0))


def test_each_env_reports_its_own_episodes_and_is_seeded_apart():
    agent, _, _, stats = play_countdowns(6)
    assert stats["steps"] == 18
    assert sorted(stats["episodes"]) == sorted([[2.0, 2]] * 3 + [[3.0, 3]] * 2 + [[2.0, 2]] * 3)
    first_seeds = [env.env.seeds[0] for env in agent.envs]
    assert len(set(first_seeds)) == 3 and None not in first_seeds
    # Later resets continue each env's own random stream.
    assert all(seed is None for env in agent.envs for seed in env.env.seeds[1:])


def test_the_evaluation_env_plays_greedy_rows_that_are_not_stored():
    _, port, helper, stats = play_countdowns(8, eval_every=2)
    greedy = [payload.get("evaluation") for payload in port.payloads]
    # After two training episodes (step 2) the evaluation env joins as a fourth, greedy row, for its 4 steps;
    # by then more than four training episodes have ended, so the next evaluation starts at once.
    assert greedy[:2] == [None, None]
    assert [g.tolist() for g in greedy[2:]] == [[False, False, False, True]] * 6
    assert all(step["inputs"]["obs"].shape == (3, 1) for step in helper.steps)
    assert stats["eval_steps"] == 6 and stats["eval_episodes"] == [[4.0, 4]]
    assert stats["steps"] == 24


def test_with_double_buffering_the_halves_alternate_and_their_steps_are_stored_together_in_env_order():
    class VersionPerTicket(ScriptedPort):
        def version(self, ticket: int) -> int:
            return ticket

    _, port, helper, stats = play_countdowns(7, double_buffer=True, port=VersionPerTicket(7))
    # Env 0 is one half, envs 1 and 2 the other: one request each per step, in turn.
    assert [payload["inputs"]["obs"].shape[0] for payload in port.payloads] == [1, 2, 1, 2, 1, 2, 1]
    assert len(helper.steps) == 3 and all(step["inputs"]["obs"].shape == (3, 1) for step in helper.steps)
    assert helper.steps[1]["terminated"].tolist() == [True, False, False]
    assert helper.steps[1]["truncated"].tolist() == [False, False, True]
    assert helper.steps[2]["inputs"]["obs"][:, 0].tolist() == [2, 1, 2]
    # Each half keeps the version of the weights that answered its own request.
    assert [step["policy_version"].tolist() for step in helper.steps] == [[1, 2, 2], [3, 4, 4], [5, 6, 6]]
    assert stats["steps"] == 10  # the first half also stepped its fourth step before the stop


def test_a_one_env_agent_asked_for_several_envs_names_the_option_and_the_fix():
    class OneEnvAgent(Agent):
        pass

    with pytest.raises(ConfigError, match=r"--envs-per-agent 4: OneEnvAgent plays one env per process.*VectorAgent"):
        check_envs_per_agent(OneEnvAgent(), 4)
    with pytest.raises(ConfigError, match="--envs-per-agent must be >= 1"):
        check_envs_per_agent(GymAgent(), 0)
    check_envs_per_agent(OneEnvAgent(), 1)


class OneEnvCorridor(Agent):
    """A user's one-env Agent, as the FLARE way writes it (run_episode)."""


class EightEnvsByDefault(GymAgent):
    pass


class FourEnvsByDefault(GymAgent):
    default_envs = 4


class NoEnvsByDefault(GymAgent):
    default_envs = 0


def test_a_run_that_gives_no_layout_plays_what_the_agent_class_says():
    assert AgentConfig(path="x:Y", num_agents=4).envs_per_agent is None
    path = f"{__file__}:"
    assert make_agent(path + "OneEnvCorridor", {}, None).num_envs == 1
    assert make_agent(path + "EightEnvsByDefault", {}, None).num_envs == 8
    assert make_agent(path + "FourEnvsByDefault", {}, None).num_envs == 4
    assert make_agent(path + "FourEnvsByDefault", {}, 2).num_envs == 2
    with pytest.raises(ConfigError, match="--envs-per-agent 3: OneEnvCorridor plays one env per process"):
        make_agent(path + "OneEnvCorridor", {}, 3)
    with pytest.raises(ConfigError, match=r"NoEnvsByDefault.default_envs must be an int >= 1.*got 0"):
        make_agent(path + "NoEnvsByDefault", {}, None)
    # The agent process is told a count only where the run gave one.
    launch = AgentLaunch("tcp://127.0.0.1:1", "m:A", {}, None, 0)
    assert "--envs-per-agent" not in launch.command("a0", 0, 0)
    given = AgentLaunch("tcp://127.0.0.1:1", "m:A", {}, 3, 0).command("a0", 0, 0)
    assert given[given.index("--envs-per-agent") + 1] == "3"
