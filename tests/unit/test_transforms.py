"""Data transforms: running statistics merged across agents through a CT, kept in its checkpoint, refused when
malformed; and GymAgent acting on and storing the transformed data."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from doubles import AnsweringPort, KeepingHelper, Scale

from flare2.core.algorithm import Algorithm
from flare2.core.computation_task import ComputationTask
from flare2.core.envs import GymAgent
from flare2.core.specs import CTSpecs, Spec
from flare2.core.transforms import NormalizeObservations, NormalizeRewards, RunningMoments, Transforms
from flare2.errors import ConfigError, FlareError
from flare2.runtime.agents.playing import StopRequested, make_envs
from flare2.runtime.compute.cdp import ComputationDataProcessor
from flare2.runtime.config import BatchingConfig
from flare2.wire.protocol import STATISTICS, Message
from flare2.wire.sockets import raise_for_error


class Scaler(Algorithm):
    def predict(self, inputs, states):
        return {"y": inputs["x"] * self.model.scale}, {}

    def learn(self, experience):
        return {}


class CDPPort:
    """A port of agent ``agent_id`` to a CDP in this thread: statistics are answered as the CDP answers them."""

    def __init__(self, cdp: ComputationDataProcessor, agent_id: str) -> None:
        self.cdp, self.agent_id = cdp, agent_id
        self.replies: dict[int, Message] = {}
        self.seq = 0

    def send_statistics(self, payload):
        self.seq += 1
        self.cdp.reply = lambda _to, _learn, message: self.replies.__setitem__(message.seq, message)
        self.cdp.accept(Message(STATISTICS, payload, self.agent_id, self.seq, "RL"), self, 0.0, learn=True)
        return self.seq

    def wait_statistics(self, ticket):
        reply = self.replies.pop(ticket)
        raise_for_error(reply, "statistics")
        return reply.payload


def served_ct(*agents: str) -> tuple[ComputationTask, ComputationDataProcessor]:
    ct = ComputationTask("RL", Scaler(Scale()), device="cpu")
    cdp = ComputationDataProcessor(ct, config=BatchingConfig(), reply=None)
    cdp.live = frozenset(agents)
    return ct, cdp


def normalizer(port, **options) -> NormalizeObservations:
    transform = NormalizeObservations(["x"], **options)
    transform.bind("RL", port.cdp.ct.specs, port)
    return transform


@pytest.mark.parametrize("seed", range(5))
def test_moments_counted_in_any_split_and_merged_equal_those_of_all_samples(seed):
    rng = np.random.default_rng(seed)
    samples = rng.normal(rng.uniform(-5, 5, 3), rng.uniform(0.1, 4, 3), size=(200, 3))
    cuts = np.sort(rng.choice(np.arange(1, 200), size=rng.integers(1, 12), replace=False))
    parts = [RunningMoments((3,)) for _ in range(len(cuts) + 1)]
    for moments, chunk in zip(parts, np.split(samples, cuts)):
        for rows in np.array_split(chunk, rng.integers(1, 4)):
            moments.update(rows)
    merged = RunningMoments((3,))
    for index in rng.permutation(len(parts)):
        merged.merge(parts[index])
    assert merged.count == 200
    np.testing.assert_allclose(merged.mean, samples.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(merged.variance, samples.var(axis=0), rtol=1e-10)


def test_the_statistics_of_two_agents_are_merged_through_the_ct_and_each_normalises_with_both():
    ct, cdp = served_ct("a", "b")
    first, second = normalizer(CDPPort(cdp, "a"), sync_every=10), normalizer(CDPPort(cdp, "b"), sync_every=10)
    rng = np.random.default_rng(0)
    seen = {"a": [], "b": []}
    for _ in range(8):
        for name, transform, centre in (("a", first, 5.0), ("b", second, -5.0)):
            rows = rng.normal(centre, 1.0, size=(5, 2)).astype(np.float32)
            seen[name].append(rows.copy())
            transform.observations({"x": rows}, None, count=True)
    everything = np.concatenate(seen["a"] + seen["b"]).astype(np.float64)
    # 40 rows each, traded every 10: all of them reached the CT.
    assert ct.statistics["x"].count == 80
    np.testing.assert_allclose(ct.statistics["x"].mean, everything.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(ct.statistics["x"].variance, everything.var(axis=0), rtol=1e-5)

    # Each agent normalises with the rows the other had traded when it last heard back (a trade's answer is read at
    # the next trade), and with all of its own.
    def rows(name, batches):
        return np.concatenate(seen[name][:batches]).astype(np.float64)

    for transform, known in (
        (first, np.concatenate([rows("a", 8), rows("b", 4)])),
        (second, np.concatenate([rows("a", 6), rows("b", 8)])),
    ):
        moments = transform.moments["x"]
        assert moments.count == len(known)
        np.testing.assert_allclose(moments.mean, known.mean(axis=0), rtol=1e-6)
        row = np.array([[1.0, -1.0]], np.float32)
        expected = (row - moments.mean) / np.sqrt(moments.variance + 1e-8)
        transform.observations({"x": row}, None, count=False)
        np.testing.assert_allclose(row, expected, rtol=1e-5)


def test_the_statistics_survive_a_checkpoint_and_an_agent_of_the_resumed_run_starts_from_them(tmp_path):
    ct, cdp = served_ct("a")
    transform = normalizer(CDPPort(cdp, "a"), sync_every=4)
    rows = np.array([[1.0, 10.0], [3.0, 30.0], [5.0, 50.0], [7.0, 70.0]], np.float32)
    transform.observations({"x": rows.copy()}, None, count=True)
    ct.save(tmp_path / "RL.pt", {"steps": 4})

    resumed, resumed_cdp = served_ct("b")
    resumed.load(tmp_path / "RL.pt")
    assert resumed.statistics["x"].count == 4
    np.testing.assert_allclose(resumed.statistics["x"].mean, [4.0, 40.0])
    fresh = normalizer(CDPPort(resumed_cdp, "b"))
    np.testing.assert_allclose(fresh.moments["x"].variance, [5.0, 500.0])
    row = np.array([[4.0 + np.sqrt(5.0), 40.0]], np.float32)
    fresh.observations({"x": row}, None, count=False)
    np.testing.assert_allclose(row, [[1.0, 0.0]], atol=1e-6)


@pytest.mark.parametrize(
    "moments, named",
    [
        ({"z": {"count": 1, "mean": np.zeros(2), "m2": np.zeros(2)}}, "no fixed-shape input of that name"),
        ({"return:bonus": {"count": 1, "mean": np.zeros(()), "m2": np.zeros(())}}, "nor a reward after 'return:'"),
        ({"return:reward": {"count": 1, "mean": np.zeros(2), "m2": np.zeros(2)}}, "float64 array of shape ()"),
        ({"x": {"count": 1, "mean": np.zeros(3), "m2": np.zeros(3)}}, "float64 array of shape (2,)"),
        ({"x": {"count": 1, "mean": np.zeros(2, np.float32), "m2": np.zeros(2)}}, "float64 array of shape (2,)"),
        ({"x": {"count": 1, "mean": np.array([np.nan, 0.0]), "m2": np.zeros(2)}}, "NaN or infinity"),
        ({"x": {"count": -1, "mean": np.zeros(2), "m2": np.zeros(2)}}, "count must be an int"),
        ({"x": {"count": 2, "mean": np.zeros(2), "m2": np.array([-1.0, 0.0])}}, "m2 must be >= 0"),
        ({"x": {"count": 2, "mean": np.zeros(2)}}, "must be a map of count, mean, m2"),
        ({}, "carries 'moments'"),
        ({"x": {"count": 2, "mean": np.full(2, 1e200), "m2": np.full(2, 1e300)}}, "overflow to infinity"),
    ],
)
def test_malformed_statistics_are_refused_naming_what_is_wrong_and_leave_the_merged_ones_as_they_were(moments, named):
    ct, cdp = served_ct("a")
    port = CDPPort(cdp, "a")
    good = {"x": {"count": 2, "mean": -np.full(2, 1e200), "m2": np.ones(2)}}
    assert port.wait_statistics(port.send_statistics({"moments": good}))["moments"]["x"]["count"] == 2
    with pytest.raises(FlareError, match=named.replace("(", r"\(").replace(")", r"\)")):
        port.wait_statistics(port.send_statistics({"moments": moments}))
    assert ct.statistics["x"].count == 2
    reply = port.wait_statistics(port.send_statistics({"moments": good}))
    assert reply["moments"]["x"]["count"] == 4


def test_a_pipeline_from_options_names_an_unknown_transform_and_bad_arguments():
    pipeline = Transforms.from_options(["normalize_observations", ["clip_rewards", {"low": -1, "high": 1}]])
    assert [type(t).__name__ for t in pipeline.transforms] == ["NormalizeObservations", "ClipRewards"]
    with pytest.raises(ConfigError, match="normalize_actions"):
        Transforms.from_options(["normalize_actions"])
    with pytest.raises(ConfigError, match="NormalizeRewards needs 0 <= gamma <= 1"):
        Transforms.from_options([["normalize_rewards", {"gamma": 1.5}]])
    with pytest.raises(ConfigError, match="scale_rewards.*does not take"):
        Transforms.from_options([["scale_rewards", {"scale": 2}]])
    with pytest.raises(ConfigError, match="NormalizeObservations\\('y'\\).*name one of those"):
        NormalizeObservations(["y"]).bind("RL", served_ct()[0].specs, None)


class Drifting(gym.Env):
    """Observations (t, 100 + t) and a reward of 3t, over 4-step episodes."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self) -> None:
        self.t = 0

    def observe(self):
        return np.array([self.t, 100 + self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.observe(), {}

    def step(self, action):
        self.t += 1
        return self.observe(), 3.0 * self.t, self.t == 4, False, {}


class StatisticsPort(AnsweringPort):
    """Answers predictions with zeros, and statistics from RunningMoments of its own (the CT's part)."""

    def __init__(self, steps: int) -> None:
        super().__init__(steps, lambda inputs: {"action": np.zeros_like(inputs["obs"])})
        self.merged = {"obs": RunningMoments((2,)), "return:reward": RunningMoments(())}
        self.answers: list[dict] = []

    def send_statistics(self, payload):
        for key, moments in payload["moments"].items():
            self.merged[key].merge(RunningMoments.from_wire(moments, self.merged[key].shape, key))
        self.answers.append({"moments": {key: self.merged[key].copy().to_wire() for key in payload["moments"]}})
        return len(self.answers)

    def wait_statistics(self, ticket):
        return self.answers[ticket - 1]


def played_drifting(transforms: list) -> tuple[StatisticsPort, KeepingHelper]:
    """A GymAgent with ``transforms`` played 6 steps of 2 Drifting envs: the port it traded with, and what it stored."""
    specs = CTSpecs(
        inputs={"obs": Spec((2,), "float32")},
        actions={"action": Spec((2,), "float32")},
        states={},
        rewards={"reward": Spec((), "float32")},
    )
    agent = GymAgent(transforms=transforms)
    agent.num_envs = 2
    agent.make_env = Drifting
    make_envs(agent, 0)
    port, helper = StatisticsPort(6), KeepingHelper()
    agent.connect(agent_id="a0", seed=0, specs={"RL": specs}, ports={"RL": port}, helpers={"RL": helper})
    with pytest.raises(StopRequested):
        agent.run()
    return port, helper


def test_a_gym_agent_acts_on_and_stores_the_transformed_observations_and_rewards():
    port, helper = played_drifting(
        [
            ["normalize_observations", {"sync_every": 4, "clip": 1.5}],
            ["scale_rewards", {"factor": 0.5}],
            ["clip_rewards", {"low": -1.0, "high": 1.0}],
        ]
    )

    # Counted and traded every 4 rows: the first observations of the 2 envs, their next ones over 6 steps, and the
    # first observations of their second episodes.
    assert port.merged["obs"].count == 2 + 6 * 2 + 2
    for step, sent in zip(helper.steps, port.sent):
        # What was asked with is what is learned from, clipped to the transform's limit.
        np.testing.assert_array_equal(step["inputs"]["obs"], sent["inputs"]["obs"])
        assert np.abs(step["inputs"]["obs"]).max() <= 1.5
    # The first step's reward 3 is scaled to 1.5 and clipped to 1, the second's 6 likewise; never the env's own.
    assert [step["rewards"]["reward"].tolist() for step in helper.steps[:2]] == [[1.0, 1.0]] * 2
    # The second coordinate is the first plus 100: normalised, the two are equal.
    for step in helper.steps:
        np.testing.assert_allclose(step["next_inputs"]["obs"][:, 0], step["next_inputs"]["obs"][:, 1], atol=1e-4)


def test_rewards_are_divided_by_the_running_deviation_of_the_discounted_return_as_sb3_normalises_them():
    """SB3's VecNormalize(norm_reward=True), step by step: R = gamma R + r, zero again after an episode's end; each
    reward over the standard deviation of every R so far (this step's included), clipped."""
    port, helper = played_drifting([["normalize_rewards", {"gamma": 0.9, "sync_every": 3, "clip": 2.5}]])

    returns, counted, expected = np.zeros(2), [], []
    for t in range(1, 7):
        reward = 3.0 * ((t - 1) % 4 + 1)  # Drifting's episodes end after 4 steps
        returns = 0.9 * returns + reward
        counted.extend(returns)
        expected.append(np.clip(reward / np.sqrt(np.var(counted) + 1e-8), -2.5, 2.5))
        if t % 4 == 0:
            returns = np.zeros(2)
    stored = [step["rewards"]["reward"].tolist() for step in helper.steps]
    np.testing.assert_allclose(stored, np.repeat(np.array(expected)[:, None], 2, axis=1), rtol=1e-5)
    assert max(expected) == 2.5 and min(expected) < 2.5  # the clip was met, and not everywhere
    # Traded every second step (4 returns, at least 3): all 12 reached the run's statistics.
    assert port.merged["return:reward"].count == 12


def test_the_return_statistics_of_two_agents_meet_in_the_ct_and_survive_its_checkpoint(tmp_path):
    ct, cdp = served_ct("a", "b")
    first, second = NormalizeRewards(0.5, sync_every=2), NormalizeRewards(0.5, sync_every=2)
    for name, transform in (("a", first), ("b", second)):
        transform.bind("RL", ct.specs, CDPPort(cdp, name))
    states = [first.reward_state(2), second.reward_state(2)]
    for rewards in ([1.0, 2.0], [3.0, 4.0]):
        for transform, state in zip((first, second), states):
            transform.rewards(np.array(rewards, np.float32), state, count=True)
    # Returns 1, 2, then 0.5 + 3, 1 + 4, from each agent.
    everything = [1.0, 2.0, 3.5, 5.0] * 2
    assert ct.statistics["return:reward"].count == 8
    np.testing.assert_allclose(ct.statistics["return:reward"].variance, np.var(everything))
    first.episodes_ended(states[0], np.array([1]))
    np.testing.assert_array_equal(states[0], [3.5, 0.0])

    ct.save(tmp_path / "RL.pt", {"steps": 8})
    resumed, resumed_cdp = served_ct("c")
    resumed.load(tmp_path / "RL.pt")
    fresh = NormalizeRewards(0.5)
    fresh.bind("RL", resumed.specs, CDPPort(resumed_cdp, "c"))
    rewards = np.array([2.0], np.float32)
    fresh.rewards(rewards, fresh.reward_state(1), count=False)
    np.testing.assert_allclose(rewards, 2.0 / np.std(everything), rtol=1e-6)


def test_a_reward_normaliser_needs_a_scalar_reward_and_names_the_ones_there_are():
    specs = CTSpecs(
        inputs={"obs": Spec((2,), "float32")},
        actions={"action": Spec((2,), "float32")},
        states={},
        rewards={"team": Spec((3,), "float32")},
    )
    with pytest.raises(ConfigError, match="no scalar reward 'reward' \\(its rewards: \\{'team': \\(3,\\)\\}\\)"):
        NormalizeRewards().bind("RL", specs, None)
