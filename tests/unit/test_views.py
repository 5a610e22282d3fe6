"""Trajectory views: a frame stack, the previous actions and rewards, built by the agent against hand-made
expectations across episode ends, the same in what it sends, what it stores and what a replay buffer gives back."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from doubles import AnsweringPort, KeepingHelper, received

from flare2.core.acting import Acting
from flare2.core.algorithm import Algorithm
from flare2.core.computation_task import ComputationTask
from flare2.core.envs import GymAgent
from flare2.core.helpers import ROW_IDS, OnlineHelper
from flare2.core.model import Model
from flare2.core.replay import ExpReplayHelper
from flare2.core.specs import CTSpecs, Spec, View
from flare2.core.transforms import Transform, Transforms
from flare2.errors import ConfigError, SpecError
from flare2.runtime.agents.playing import StopRequested, make_envs

EPISODE = 3


class Counter(gym.Env):
    """Env i observes 100 * i + t at step t of an episode of EPISODE steps; the reward of a step is t + 1."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (1,), np.float32)
    action_space = gym.spaces.Discrete(1000)

    def __init__(self, index: int) -> None:
        self.index, self.t = index, 0

    def obs(self):
        return np.array([100.0 * self.index + self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.obs(), {}

    def step(self, action):
        self.t += 1
        return self.obs(), float(self.t), self.t == EPISODE, False, {}


class ViewModel(Model):
    def input_specs(self):
        return {"obs": Spec((1,), "float32")}

    def action_specs(self):
        return {"action": Spec((), "int64")}

    def view_specs(self):
        return {
            "stack": View.last_observations(3),
            "last_action": View.previous_actions(1),
            "last_rewards": View.previous_rewards(2),
        }


def view_specs() -> CTSpecs:
    class Noop(Algorithm):
        def predict(self, inputs, states):
            raise AssertionError

    return ComputationTask("RL", Noop(ViewModel()), device="cpu").specs


def obs_plus_one(inputs):
    return {"action": inputs["obs"][:, 0].astype(np.int64) + 1}


def expected_views(index: int, t: int) -> dict[str, list]:
    """By hand: env ``index`` at step ``t`` of an episode (frames before its start are zeros)."""
    obs = [100 * index + s if s >= 0 else 0 for s in (t - 2, t - 1, t)]
    # The action at step s was obs(s) + 1; the reward of step s was s + 1.
    last_action = [100 * index + t - 1 + 1] if t >= 1 else [0]
    last_rewards = [s + 1 if s >= 0 else 0 for s in (t - 2, t - 1)]
    return {"stack": [[v] for v in obs], "last_action": last_action, "last_rewards": last_rewards}


def play(steps: int, helper, port_class=AnsweringPort) -> tuple[GymAgent, AnsweringPort]:
    made = iter(range(10))
    agent = GymAgent()
    agent.num_envs = 2
    agent.make_env = lambda: Counter(next(made))
    make_envs(agent, 0)
    specs = view_specs()
    port = port_class(steps, obs_plus_one)
    agent.connect(agent_id="a0", seed=0, specs={"RL": specs}, ports={"RL": port}, helpers={"RL": helper})
    agent.check_specs({"RL": specs})
    with pytest.raises(StopRequested):
        agent.run()
    return agent, port


def as_lists(views: dict, row: int) -> dict[str, list]:
    return {name: views[name][row].tolist() for name in ("stack", "last_action", "last_rewards")}


class LearningPort(AnsweringPort):
    """Also keeps the learn requests it is sent."""

    def __init__(self, steps, answer) -> None:
        super().__init__(steps, answer)
        self.learned: list[dict] = []

    def learn(self, payload):
        self.learned.append(received(view_specs(), payload))


def play_learning(helper) -> LearningPort:
    """Nine steps of two Counter envs with ``helper``; the port that kept the learn requests."""
    return play(9, helper, LearningPort)[1]


def test_views_sent_and_learned_match_the_hand_built_ones_across_episode_and_request_ends():
    # Episodes of 3 steps, requests of 2: views reach back across both kinds of edge.
    port = play_learning(OnlineHelper(sample_interval=2))
    for step, sent in enumerate(payload["inputs"] for payload in port.sent[:9]):
        for row in range(2):
            assert as_lists(sent, row) == expected_views(row, step % EPISODE), (step, row)
    assert [payload["inputs"]["obs"].shape[:2] for payload in port.learned] == [(2, 2)] * 4
    for step in range(8):
        payload, t = port.learned[step // 2], step % EPISODE
        for row in range(2):
            # What learning sees is what acting saw.
            assert as_lists(payload["inputs"], (row, step % 2)) == expected_views(row, t), (step, row)
            # The next step's views continue this episode, even where it ended (the final frame stack).
            nxt = as_lists(payload["next_inputs"], (row, step % 2))
            assert nxt["stack"] == [[100 * row + s if s >= 0 else 0] for s in (t - 1, t, t + 1)]
            assert nxt["last_action"] == [100 * row + t + 1] and nxt["last_rewards"] == [t if t >= 1 else 0, t + 1]


def test_stored_steps_hold_no_views_only_what_they_are_made_of():
    helper = KeepingHelper()
    play(4, helper)
    assert all(set(step["inputs"]) == set(step["next_inputs"]) == {"obs"} for step in helper.steps)


@pytest.mark.parametrize("capacity, steps", [(64, 9), (14, 40), (14, 41)])
def test_replayed_steps_carry_the_views_their_actions_were_chosen_from(capacity, steps):
    # (14, 40/41): the buffer of 7 steps per env went round several times, and views reach back 2 steps.
    replay = ExpReplayHelper(
        capacity=capacity, warmup=8, sample_interval=1_000_000, batch_size=4, sequence_length=3, seed=1
    )
    play(steps, replay)
    sample = received(view_specs(), replay.sample(50))
    obs, stack = sample["inputs"]["obs"][..., 0], sample["inputs"]["stack"][..., 0]
    assert (stack[..., -1] == obs).all()
    for sequence in range(50):
        for t in range(3):
            env, step = int(obs[sequence, t]) // 100, int(obs[sequence, t]) % 100
            assert as_lists(sample["inputs"], (sequence, t)) == expected_views(env, step), (sequence, t)
    # The buffer keeps the observations once (and next ones), not their frame stacks.
    assert "stack" not in replay._buffers["inputs"]


def test_replayed_rows_that_come_and_go_carry_the_views_of_their_own_steps():
    # Row i acts at its own times (turns of a game: row 0 at even ones, row 1 at odd ones, row 2 at every third), its
    # step s of an episode observing 100 * i + s, as Counter env i does: each view is made of the row's own steps.
    replay = ExpReplayHelper(capacity=45, warmup=8, sample_interval=1_000_000, batch_size=4, sequence_length=3, seed=1)
    replay.attach("RL", view_specs(), AnsweringPort(0, obs_plus_one), num_envs=3)
    steps = {0: 0, 1: 0, 2: 0}
    for time in range(70):
        rows = [time % 2, *([2] if time % 3 == 0 else [])]
        t = np.array([steps[row] % EPISODE for row in rows])
        obs = np.array([[100.0 * row + s] for row, s in zip(rows, t)], np.float32)
        replay.store(
            {
                "inputs": {"obs": obs},
                "next_inputs": {"obs": obs + 1},
                "actions": {"action": obs[:, 0].astype(np.int64) + 1},
                "rewards": {"reward": (t + 1).astype(np.float32)},
                "states": {},
                "extras": {},
                "terminated": t == EPISODE - 1,
                "truncated": np.zeros(len(rows), bool),
                "policy_version": np.zeros(len(rows), np.int64),
                ROW_IDS: np.array(rows, np.int64),
            }
        )
        for row in rows:
            steps[row] += 1
    sample = received(view_specs(), replay.sample(60))
    obs = sample["inputs"]["obs"][..., 0]
    assert set(np.unique(obs // 100)) == {0, 1, 2}
    for sequence in range(60):
        for t in range(3):
            row, step = int(obs[sequence, t]) // 100, int(obs[sequence, t]) % 100
            assert as_lists(sample["inputs"], (sequence, t)) == expected_views(row, step), (sequence, t)


def test_views_of_what_the_specs_lack_or_of_ragged_data_are_refused():
    with pytest.raises(SpecError, match=r"view 'v' is made of actions\['nope'\], which the specs do not have"):
        CTSpecs(inputs={"v": Spec((1,))}, actions={}, states={}, rewards={}, views={"v": View("actions", "nope")})
    with pytest.raises(SpecError, match="View frames must be an int from 1 to 1024"):
        View.last_observations(0)

    class Clash(ViewModel):
        def view_specs(self):
            return {"obs": View.previous_actions()}

    class Noop(Algorithm):
        pass

    with pytest.raises(
        ConfigError, match="view 'obs' of CT 'RL': it needs actions\\['action'\\] among the model's specs and a name"
    ):
        ComputationTask("RL", Noop(Clash()), device="cpu")
    specs = view_specs()
    assert CTSpecs.from_wire(specs.to_wire()) == specs and specs.inputs["stack"] == Spec((3, 1), "float32")
    assert set(specs.acting_inputs) == {"obs"}


def test_complete_episodes_carry_the_views_their_actions_were_chosen_from():
    port = play_learning(OnlineHelper(sample_interval=1, complete_episodes=True))
    # Three rounds of two 3-step episodes.
    assert [payload["inputs"]["obs"].shape[:2] for payload in port.learned] == [(1, 6)] * 3
    for payload in port.learned:
        for t, obs in enumerate(payload["inputs"]["obs"][0, :, 0]):
            env, step = int(obs) // 100, int(obs) % 100
            assert step == t % EPISODE and as_lists(payload["inputs"], (0, t)) == expected_views(env, step)


class AddOne(Transform):
    """Changes observations in place, as normalising them does."""

    def observations(self, inputs, rows, *, count):
        inputs["obs"][slice(None) if rows is None else rows] += 1


def test_a_request_names_each_rows_observation_where_its_views_keep_it():
    # Through steps, episode ends and regroups (agents of a multi-agent env leaving and joining), with a transform
    # changing the observations in place, the frames a request names are the rows' own observations.
    rng = np.random.default_rng(0)
    count = 4

    def observations(n):
        return list(rng.integers(0, 100, (n, 1)).astype(np.float32))

    acting = Acting(
        specs=view_specs(),
        observation_space=Counter.observation_space,
        action_space=Counter.action_space,
        transforms=Transforms([AddOne()]),
        count=count,
    )
    acting.start(observations(count))
    for step in range(60):
        stored, request, _ = acting.request()
        assert not request["obs"].flags.writeable, "named in the views, not the rows' own array"
        np.testing.assert_array_equal(request["obs"], stored["obs"], err_msg=f"step {step}")
        np.testing.assert_array_equal(request["stack"][:, -1], stored["obs"])
        next_rows = acting.next_rows()
        for index, observation in enumerate(observations(acting.count)):
            next_rows.set(index, observation)
        actions = {"action": rng.integers(0, 1000, acting.count)}
        acting.stepped(next_rows, rng.random(acting.count, np.float32), actions, {})
        ended = np.flatnonzero(rng.random(acting.count) < 0.2)
        acting.restart(ended, observations(len(ended)))
        if step % 7 == 6:
            kept = rng.permutation(acting.count)[: rng.integers(0, acting.count + 1)]
            acting.regroup(kept, observations(int(rng.integers(0, 3))))
