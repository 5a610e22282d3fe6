"""Learn requests on the way to learn(): each observation crosses once, and learn() gets every step spelled out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from doubles import ATARI_SPECS

from flare2.core.algorithm import Experience
from flare2.core.learn_requests import check_learn, concatenate, least_bytes, pack, unpack
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import ConfigError, SpecError
from flare2.wire.codec import encode

SPECS = CTSpecs(
    inputs={"obs": Spec((4,), "float32"), "mask": Spec((2,), "bool")},
    actions={"action": Spec((), "int64")},
    states={"h": Spec((8,), "float32")},
    rewards={"reward": Spec((), "float32")},
)


def stored(sequences: int = 2, steps: int = 5, *, ends: tuple[tuple[int, int], ...] = ((0, 1),)) -> dict:
    """Steps as a helper keeps them: observation t of sequence n is (n, t, ...); after each (n, t) of ``ends`` the
    episode ended, so the next observation stored there is the final one (-1, t + 1, ...), not the following step's."""
    lead = (sequences, steps)
    obs = np.zeros((*lead, 4), np.float32)
    obs[..., 0] = np.arange(sequences)[:, None]
    obs[..., 1] = np.arange(steps)[None, :]
    following = np.concatenate([obs[:, 1:], obs[:, -1:] + np.float32([0, 1, 0, 0])], axis=1)
    terminated = np.zeros(lead, bool)
    for n, t in ends:
        following[n, t] = [-1, t + 1, 0, 0]
        terminated[n, t] = True
    mask = np.ones((*lead, 2), bool)
    return {
        "inputs": {"obs": obs, "mask": mask},
        "next_inputs": {"obs": following, "mask": mask.copy()},
        "actions": {"action": np.arange(sequences * steps, dtype=np.int64).reshape(lead)},
        "rewards": {"reward": np.ones(lead, np.float32)},
        "states": {"h": np.zeros((*lead, 8), np.float32)},
        "terminated": terminated,
        "truncated": np.zeros(lead, bool),
        "policy_version": np.full(lead, 3, np.int64),
    }


def test_each_observation_crosses_once_and_learn_gets_every_step_back():
    steps = stored(ends=((0, 1), (1, 3)))
    payload = pack(SPECS, steps, 0)
    assert check_learn(SPECS, payload) == (2, 5)
    # The 5 steps' observations and the last one's next; of the other next ones only the two episode ends.
    assert payload["inputs"]["obs"].shape == (2, 6, 4)
    assert payload["next_at"].tolist() == [1, 8] and payload["next_inputs"]["obs"][:, 0].tolist() == [-1, -1]
    experience = unpack(SPECS, payload)
    for group in ("inputs", "next_inputs"):
        for key, array in steps[group].items():
            np.testing.assert_array_equal(experience[group][key], array)
    np.testing.assert_array_equal(experience["actions"]["action"], steps["actions"]["action"])


def test_next_observations_that_differ_from_the_following_step_cross_even_without_an_episode_end():
    # A custom agent may store any next inputs: they are compared, not assumed from the flags.
    steps = stored(ends=())
    steps["next_inputs"]["obs"][1, 2, 3] = 7.0
    payload = pack(SPECS, steps, 0)
    assert payload["next_at"].tolist() == [7]
    np.testing.assert_array_equal(unpack(SPECS, payload)["next_inputs"]["obs"], steps["next_inputs"]["obs"])


def test_requests_batched_together_keep_each_ones_episode_ends():
    first, second = stored(2, 5, ends=((1, 0),)), stored(3, 5, ends=((0, 2), (2, 3)))
    payloads = [pack(SPECS, first, 0), pack(SPECS, second, 0)]
    for payload in payloads:
        check_learn(SPECS, payload)
    experience = unpack(SPECS, concatenate(SPECS, payloads))
    expected = np.concatenate([first["next_inputs"]["obs"], second["next_inputs"]["obs"]])
    np.testing.assert_array_equal(experience["next_inputs"]["obs"], expected)


def test_the_values_of_next_inputs_are_taken_from_the_following_steps_and_computed_only_where_they_differ():
    # Episode ends, a next observation a custom agent changed and each sequence's last step: those rows alone reach
    # value(), and the result is value(next_inputs) computed in full.
    steps = stored(3, 5, ends=((0, 1), (2, 3)))
    steps["next_inputs"]["obs"][1, 2, 3] = 7.0
    spelled_out = unpack(SPECS, concatenate(SPECS, [pack(SPECS, steps, 0)]))
    follow = spelled_out["next_inputs_follow"]
    assert sorted(zip(*np.nonzero(~follow))) == [(0, 1), (0, 4), (1, 2), (1, 4), (2, 3), (2, 4)]
    weights = torch.tensor([0.5, -2.0, 3.0, 1.5])
    seen = []

    def value(inputs: dict) -> torch.Tensor:
        seen.append(inputs["obs"].shape[:-1].numel())
        return inputs["obs"] @ weights

    tensors = {
        group: {key: torch.from_numpy(array) for key, array in spelled_out[group].items()}
        for group in ("inputs", "next_inputs")
    }
    flags = torch.from_numpy(spelled_out["terminated"])
    experience = Experience(
        **tensors,
        actions={},
        rewards={},
        states={},
        terminated=flags,
        truncated=torch.zeros_like(flags),
        next_inputs_follow=torch.from_numpy(follow),
    )
    values = value(experience.inputs)
    next_values = experience.next_values(value, values)
    assert seen == [15, 6]
    torch.testing.assert_close(next_values, tensors["next_inputs"]["obs"] @ weights)
    unknown = Experience(**tensors, actions={}, rewards={}, states={}, terminated=flags, truncated=flags)
    torch.testing.assert_close(unknown.next_values(value, values), next_values)


def test_an_atari_sized_request_is_an_eighth_of_the_spelled_out_one():
    # 8 envs x 128 steps of 84x84 frames and a view of the last 4 (the PPO preset's request).
    rng = np.random.default_rng(0)
    lead = (8, 131)  # 3 steps before the first, which the views reach back to
    frames = rng.integers(0, 255, (8, 132, 84, 84), dtype=np.uint8)
    steps = {
        "inputs": {"obs": frames[:, :-1]},
        "next_inputs": {"obs": frames[:, 1:].copy()},
        "actions": {"action": np.zeros(lead, np.int64)},
        "rewards": {"reward": np.zeros(lead, np.float32)},
        "states": {},
        "terminated": np.zeros(lead, bool),
        "truncated": np.zeros(lead, bool),
        "policy_version": np.zeros(lead, np.int64),
    }
    steps["terminated"][:, 50] = True
    ages = np.tile(np.arange(131), (8, 1))
    ages[:, 51:] = np.arange(80)
    payload = pack(ATARI_SPECS, steps, 3, ages)
    assert check_learn(ATARI_SPECS, payload) == (8, 128)
    experience = unpack(ATARI_SPECS, payload)
    assert experience["inputs"]["obs_frames"].shape == (8, 128, 4, 84, 84)
    spelled_out = sum(len(encode(experience[group])) for group in ("inputs", "next_inputs"))
    assert len(encode(payload)) * 8 < spelled_out
    # What the agent checks against the message limit before its first step: all but the one episode end's frame.
    assert (
        least_bytes(ATARI_SPECS, 8, 128) <= len(encode(payload)) < least_bytes(ATARI_SPECS, 8, 128) + 8 * 84 * 84 + 4096
    )
    # The stack of the step after an episode's start holds zeros before it, then its frames.
    start = 51 - 3
    assert not experience["inputs"]["obs_frames"][:, start, :3].any()
    np.testing.assert_array_equal(experience["inputs"]["obs_frames"][:, start + 1, 2:], frames[:, 51:53])


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p["next_at"].__setitem__(0, 9), "next_at must be ascending steps"),
        (lambda p: p["next_at"].__setitem__(0, 4), "next_at must be ascending steps"),
        (
            lambda p: p.__setitem__("next_at", np.array([1, 1])),
            "next_inputs\\['obs'\\]: expected leading dims \\(2,\\)",
        ),
        (lambda p: p["inputs"].__setitem__("obs", np.zeros((2, 5, 4), np.float32)), "expected leading dims \\(2, 6\\)"),
        (lambda p: p["inputs"].pop("mask"), "inputs must map each input"),
        (lambda p: p.__setitem__("ages", np.zeros((2, 5), np.int64)), "ages come with the requests of a CT with views"),
        (lambda p: p["rewards"].__setitem__("reward", np.zeros((2, 5, 2), np.float32)), "rewards\\['reward'\\]"),
        (lambda p: p.__setitem__("terminated", np.zeros((2, 4), bool)), "step flags"),
    ],
)
def test_a_request_that_is_not_as_pack_makes_it_is_refused_naming_what_is_wrong(change, message):
    payload = pack(SPECS, stored(ends=((0, 1),)), 0)
    change(payload)
    with pytest.raises(SpecError, match=message):
        check_learn(SPECS, payload)


def test_a_request_to_a_ct_without_arrays_is_counted_by_its_step_flags():
    specs = CTSpecs(inputs={}, actions={}, states={}, rewards={})
    flags = {
        "terminated": np.zeros((2, 3), bool),
        "truncated": np.zeros((2, 3), bool),
        "policy_version": np.zeros((2, 3), np.int64),
    }
    payload = {"inputs": {}, "next_inputs": {}, "next_at": np.zeros(0, np.int64), "actions": {}, "rewards": {}}
    assert check_learn(specs, {**payload, **flags}) == (2, 3)


def test_an_agent_whose_requests_cannot_fit_the_message_limit_stops_before_its_first_step_naming_both_sizes():
    from flare2.core.helpers import OnlineHelper
    from flare2.core.replay import ExpReplayHelper
    from flare2.runtime.agents.playing import check_request_sizes

    online = OnlineHelper(sample_interval=128)
    online.attach("RL", SPECS, None, num_envs=8)
    replay = ExpReplayHelper(capacity=100, warmup=10, batch_size=32, sample_interval=4, sequence_length=3)
    replay.attach("RL", SPECS, None, num_envs=8)
    assert online.largest_request() == (8, 128) and replay.largest_request() == (64, 3)
    check_request_sizes({"RL": online}, {"RL": SPECS}, {"RL": 16 << 20})
    with pytest.raises(
        ConfigError, match=r"128 steps, at least 73,872 bytes, more than the 50,000 a message to it may"
    ):
        check_request_sizes({"RL": online}, {"RL": SPECS}, {"RL": 50_000})
    assert OnlineHelper(sample_interval=8, complete_episodes=True).largest_request() is None
