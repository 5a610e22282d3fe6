"""OnlineHelper and stack_steps: the on-policy path from stored steps to a learn request."""

from __future__ import annotations

import numpy as np
import pytest

from flare2.core.helpers import OnlineHelper, stack_steps
from flare2.core.specs import CTSpecs, Spec
from flare2.errors import ConfigError

SPECS = CTSpecs(
    inputs={"obs": Spec((2,), "float32")},
    actions={"action": Spec((), "int64")},
    states={"hidden": Spec((3,), "float32")},
    rewards={"reward": Spec((), "float32")},
)


class Port:
    def __init__(self) -> None:
        self.learned: list[dict] = []

    def learn(self, payload: dict) -> None:
        self.learned.append(payload)


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
    payload = stack_steps([step(t, 3) for t in range(4)], SPECS)
    assert SPECS.check_learn(payload) == (3, 4)
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
