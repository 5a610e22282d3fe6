"""Action masks: the zoo's actor-critic never samples or prefers an illegal action, and its entropy counts legal ones."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flare2.core.computation_task import ComputationTask
from flare2.errors import ConfigError
from flare2.zoo.models import ActorCritic, masked_logits
from flare2.zoo.ppo import PPO

ACTIONS = 6
MASKED_SPACE = gym.spaces.Dict({"obs": gym.spaces.Box(-1, 1, (3,)), "action_mask": gym.spaces.MultiBinary(ACTIONS)})


@settings(max_examples=200, deadline=None, database=None)
@given(
    logits=hnp.arrays(np.float32, (16, ACTIONS), elements=st.floats(-30, 30, width=32)),
    mask=hnp.arrays(bool, (16, ACTIONS)),
)
def test_masked_sampling_never_picks_an_illegal_action(logits, mask):
    mask[:, 0] |= ~mask.any(axis=1)  # at least one legal action per row
    model = ActorCritic(MASKED_SPACE, gym.spaces.Discrete(ACTIONS))
    policy = masked_logits(torch.from_numpy(logits), torch.from_numpy(mask))
    for _ in range(20):
        sampled = model.sample(policy).numpy()
        assert mask[np.arange(16), sampled].all()
    assert mask[np.arange(16), model.best_action(policy).numpy()].all()
    # The entropy is that of the distribution over the legal actions alone.
    _, entropy = model.log_prob_and_entropy(policy, model.best_action(policy))
    for row in range(16):
        legal = torch.distributions.Categorical(logits=torch.from_numpy(logits[row][mask[row]]))
        assert entropy[row].item() == pytest.approx(legal.entropy().item(), abs=1e-4)


def test_ppo_on_a_masked_space_declares_the_mask_and_acts_legally_through_the_computation_task():
    ct = ComputationTask("RL", PPO.for_env(_MaskedEnv()), device="cpu")
    assert ct.specs.inputs["action_mask"].shape == (ACTIONS,) and ct.specs.inputs["action_mask"].dtype == "bool"
    rng = np.random.default_rng(0)
    mask = rng.random((64, ACTIONS)) < 0.3
    mask[:, 4] = True
    for greedy in (False, True):
        actions, _ = ct.predict(
            {"obs": rng.standard_normal((64, 3)).astype(np.float32), "action_mask": mask}, {}, greedy=greedy
        )
        assert mask[np.arange(64), actions["action"]].all()
        assert np.isfinite(actions["log_prob"]).all()


def test_a_mask_that_does_not_fit_the_actions_is_refused_naming_both():
    with pytest.raises(ConfigError, match="needs Discrete actions with one entry per action"):
        ActorCritic(MASKED_SPACE, gym.spaces.Discrete(ACTIONS + 1))
    with pytest.raises(ConfigError, match=r"needs an observation besides action_mask"):
        ActorCritic(gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(2)}), gym.spaces.Discrete(2))


class _MaskedEnv:
    observation_space = MASKED_SPACE
    action_space = gym.spaces.Discrete(ACTIONS)
