"""OnlineHelper and stack_steps: the on-policy path from stored steps to a learn request."""

from __future__ import annotations

import numpy as np
import pytest
from doubles import received

from flare2.core.helpers import OnlineHelper, stack_steps
from flare2.core.learn_requests import pack
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import ConfigError

SPECS = CTSpecs(
    inputs={"obs": Spec((2,), "float32")},
    actions={"action": Spec((), "int64")},
    states={"hidden": Spec((3,), "float32")},
    rewards={"reward": Spec((), "float32")},
)


class Port:
    """Keeps each learn request as learn() would get it."""

    def __init__(self, specs: CTSpecs = SPECS) -> None:
        self.specs = specs
        self.learned: list[dict] = []

    def learn(self, payload: dict) -> None:
        self.learned.append(received(self.specs, payload))


def step(t: int, envs: int, *, terminated_env: int | None = None) -> dict:
    """Step ``t`` of ``envs`` envs, in the dtypes an env and an agent hand over (float64 observations, int rewards)."""
    rows = np.arange(envs)
    return {
        "inputs": {"obs": np.stack([rows * 100.0 + t, -rows - t], axis=1)},
        "next_inputs": {"obs": np.stack([rows * 100.0 + t + 1, -rows - t - 1], axis=1)},
        "actions": {"action": (rows + t) % 2},
        "rewards": {"reward": np.full(envs, t)},
        "states": {"hidden": np.full((envs, 3), t, np.float32)},
        "terminated": rows == terminated_env,
        "truncated": np.zeros(envs, bool),
        "policy_version": np.full(envs, 10 + t),
    }


def test_steps_stack_into_one_sequence_per_env_with_the_spec_dtypes():
    payload = received(SPECS, pack(SPECS, stack_steps([step(t, 3) for t in range(4)], SPECS), 0))
    obs = payload["inputs"]["obs"]
    assert obs.dtype == np.float32 and obs.shape == (3, 4, 2)
    # Sequence k is env k, oldest step first.
    assert obs[1, :, 0].tolist() == [100.0, 101.0, 102.0, 103.0]
    assert payload["next_inputs"]["obs"][2, 3].tolist() == [204.0, -6.0]
    assert payload["rewards"]["reward"].dtype == np.float32 and payload["rewards"]["reward"][0].tolist() == [0, 1, 2, 3]
    assert payload["actions"]["action"].dtype == np.int64
    assert payload["states"]["hidden"].shape == (3, 4, 3)
    assert payload["policy_version"][0].tolist() == [10, 11, 12, 13]


def test_every_sample_interval_steps_go_out_as_one_request_and_episode_ends_go_with_them():
    helper, port = OnlineHelper(sample_interval=3), Port()
    helper.attach("RL", SPECS, port, num_envs=2)
    for t in range(7):
        helper.store(step(t, 2, terminated_env=1 if t == 4 else None))
    assert len(port.learned) == 2
    first, second = port.learned
    assert first["inputs"]["obs"][0, :, 0].tolist() == [0.0, 1.0, 2.0]
    assert second["inputs"]["obs"][0, :, 0].tolist() == [3.0, 4.0, 5.0]
    # Env 1 ended at t = 4, the second step of the second request; its next steps belong to a new episode.
    assert second["terminated"].tolist() == [[False, False, False], [False, True, False]]
    # The seventh step waits for the next two.
    helper.store(step(7, 2))
    helper.store(step(8, 2))
    assert len(port.learned) == 3 and port.learned[2]["inputs"]["obs"][0, :, 0].tolist() == [6.0, 7.0, 8.0]


def test_a_sample_interval_below_one_is_refused():
    with pytest.raises(ConfigError, match="sample_interval must be >= 1, got 0"):
        OnlineHelper(sample_interval=0)


EXTRA_SPECS = CTSpecs(
    inputs={"obs": Spec((2,), "float32"), "items": Spec((None,), "int64")},
    actions={"action": Spec((), "int64")},
    states={},
    rewards={"reward": Spec((), "float32")},
    extras={"returns": Spec((), "float32")},
)


def episodic_step(t: int, ends: list[int]) -> dict:
    """Step ``t`` of len(ends) envs; env i's episodes last ends[i] steps. Observation (i, t); reward 1; env i shows
    t % 3 items of value 10 * i + t; the last env's episodes are cut by a time limit, the others' terminate."""
    from flare2.wire.ragged import Ragged

    rows = np.arange(len(ends))
    ended = np.array([(t + 1) % length == 0 for length in ends])
    last = rows == len(ends) - 1
    obs = np.stack([rows, np.full(len(ends), t)], axis=1).astype(np.float32)
    return {
        "inputs": {"obs": obs, "items": Ragged.from_items([np.full(t % 3, 10 * i + t) for i in rows], (), "int64")},
        "next_inputs": {"obs": obs + [0, 1], "items": Ragged.from_items([np.zeros(0)] * len(ends), (), "int64")},
        "actions": {"action": rows},
        "rewards": {"reward": np.ones(len(ends), np.float32)},
        "states": {},
        "extras": {"returns": np.zeros(len(ends), np.float32)},
        "terminated": ended & ~last,
        "truncated": ended & last,
        "policy_version": np.zeros(len(ends), np.int64),
    }


class Returns(OnlineHelper):
    """Fills extras["returns"] with each step's discounted return to the end of its sequence (gamma 0.5)."""

    def postprocess(self, sequence):
        rewards, returns = sequence["rewards"]["reward"], sequence["extras"]["returns"]
        following = 0.0
        for t in reversed(range(len(rewards))):
            following = returns[t] = rewards[t] + 0.5 * following


def test_complete_episodes_go_whole_one_after_another_in_one_sequence_once_enough_steps_ended():
    helper, port = Returns(sample_interval=2, complete_episodes=True), Port(EXTRA_SPECS)
    ends = [2, 3, 5]
    helper.attach("RL", EXTRA_SPECS, port, num_envs=3)
    for t in range(30):
        helper.store(episodic_step(t, ends))
    sent = []
    for payload in port.learned:
        assert len(payload["terminated"]) == 1
        flags = payload["terminated"][0] | payload["truncated"][0]
        # At least sample_interval * 3 steps of ended episodes, and only whole ones: the sequence ends with an end.
        assert len(flags) >= 6 and flags[-1]
        starts = np.concatenate([[0], np.flatnonzero(flags)[:-1] + 1])
        for start, stop in zip(starts, np.flatnonzero(flags) + 1):
            obs = payload["inputs"]["obs"][0, start:stop]
            env, times = int(obs[0, 0]), obs[:, 1].astype(int)
            # One env's episode, its steps in order, from its first to its last.
            assert (obs[:, 0] == env).all() and times.tolist() == list(range(times[0], times[0] + ends[env]))
            assert times[0] % ends[env] == 0
            assert bool(payload["truncated"][0, stop - 1]) == (env == 2)
            items = payload["inputs"]["items"].items()
            assert [i.tolist() for i in items[start:stop]] == [[10 * env + t] * (t % 3) for t in times]
            # The hook saw the whole episode: returns of 1 + 0.5 + ... to its own end.
            returns = payload["extras"]["returns"][0, start:stop]
            np.testing.assert_allclose(returns, [2 * (1 - 0.5 ** (ends[env] - k)) for k in range(ends[env])])
            sent.append((env, int(times[0])))
    # Every episode that ended in time went, exactly once.
    expected = {
        (env, first) for env, length in enumerate(ends) for first in range(0, 30, length) if first + length <= 30
    }
    pending = {(env, first) for env, first in expected if (env, first) not in sent}
    assert len(sent) == len(set(sent)) and set(sent) <= expected
    # What is left is less than one request's worth of ended episodes.
    assert sum(ends[env] for env, _ in pending) < 6


def test_with_fragments_the_hook_sees_each_envs_part_of_a_request_and_writes_into_it():
    helper, port = Returns(sample_interval=4), Port(EXTRA_SPECS)
    helper.attach("RL", EXTRA_SPECS, port, num_envs=3)
    for t in range(8):
        helper.store(episodic_step(t, [2, 3, 5]))
    assert [payload["extras"]["returns"].shape for payload in port.learned] == [(3, 4)] * 2
    for payload in port.learned:
        np.testing.assert_allclose(payload["extras"]["returns"], np.tile([1.875, 1.75, 1.5, 1.0], (3, 1)))
