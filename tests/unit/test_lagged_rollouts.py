"""PPO and APPO weigh each step by pi/mu with mu the behaviour policy's log-probability stored at acting time."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from flare2.core.algorithm import Experience
from flare2.errors import ConfigError
from flare2.zoo.appo import APPO
from flare2.zoo.ppo import PPO, PPOActorCritic
from flare2.zoo.records.appo import APPOConfig
from flare2.zoo.records.ppo import PPOConfig
from flare2.zoo.returns import gae, vtrace

RATIOS = [0.5, 2.0, 1.0, 4.0]
"""pi/mu of the four steps: mu is the current policy's probability divided by these (two above rho_bar 1)."""


def lagged_experience(algorithm: PPO) -> Experience:
    """Four steps of one CartPole sequence, terminated after step 1, acted by a policy two updates old whose stored
    log-probabilities are the current policy's minus log(ratio)."""
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(1, 5, 4, generator=generator)
    inputs, next_inputs = {"obs": obs[:, :4]}, {"obs": obs[:, 1:]}
    action = torch.tensor([[0, 1, 1, 0]])
    with torch.no_grad():
        current, _ = algorithm.model.log_prob_and_entropy(algorithm.model.policy({"obs": obs[0, :4]}), action[0])
    stored = current - torch.tensor(RATIOS).log()
    return Experience(
        inputs=inputs,
        next_inputs=next_inputs,
        actions={"action": action, "log_prob": stored[None]},
        rewards={"reward": torch.tensor([[1.0, 1.0, 1.0, 1.0]])},
        states={},
        terminated=torch.tensor([[False, True, False, False]]),
        truncated=torch.zeros(1, 4, dtype=torch.bool),
        policy_version=torch.tensor([[3, 3, 4, 4]]),
        version=5,
    )


def cartpole_model() -> PPOActorCritic:
    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    return PPOActorCritic(env.observation_space, env.action_space, hidden=(8,))


# One epoch of one minibatch: the costs learn() reports are those of the weights it started from.
ONE_STEP = {"epochs": 1, "minibatch_size": 64, "anneal_steps": None, "gamma": 0.9, "gae_lambda": 0.95}


def make_appo() -> APPO:
    return APPO(cartpole_model(), APPOConfig(**ONE_STEP))


def make_ppo() -> PPO:
    return PPO(cartpole_model(), PPOConfig(**ONE_STEP))


@pytest.mark.parametrize("make", [make_appo, make_ppo], ids=["appo", "ppo"])
def test_the_importance_weights_are_taken_against_the_stored_log_probabilities_not_recomputed_ones(make):
    algorithm = make()

    costs = algorithm.learn(lagged_experience(algorithm))

    # Weights recomputed at learn time would all be 1, with none truncated.
    assert costs["importance_weight"] == pytest.approx(np.mean(RATIOS), rel=1e-5)
    assert costs["importance_weight_truncated"] == pytest.approx(0.5)
    assert costs["policy_lag"] == pytest.approx(1.5)


def test_the_policy_loss_is_the_clipped_surrogate_of_pi_over_the_stored_mu_with_vtrace_advantages():
    appo = make_appo()
    experience = lagged_experience(appo)
    config = appo.config
    with torch.no_grad():
        values = appo.model.value(experience.inputs)
        next_values = appo.model.value(experience.next_inputs)
        stored = experience.actions["log_prob"]
        target = stored + torch.tensor([RATIOS]).log()
        advantages, _ = vtrace(
            experience.rewards["reward"],
            values,
            next_values,
            experience.terminated,
            experience.truncated,
            stored,
            target,
            config.gamma,
            config.gae_lambda,
        )
    advantages = advantages[0]
    normalised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = torch.tensor(RATIOS)
    clipped = ratio.clamp(1 - config.clip, 1 + config.clip)
    expected = torch.max(-normalised * ratio, -normalised * clipped).mean().item()

    costs = appo.learn(experience)

    assert costs["policy_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    # The ratios 0.5, 2 and 4 are outside 1 +- clip from the first update on.
    assert costs["clip_fraction"] == pytest.approx(0.75)
    assert math.isfinite(costs["value_loss"])


def test_ppo_clips_around_the_policy_learn_starts_from_and_weighs_advantages_by_the_truncated_pi_over_mu():
    ppo = make_ppo()
    experience = lagged_experience(ppo)
    config = ppo.config
    with torch.no_grad():
        advantages, _ = gae(
            experience.rewards["reward"],
            ppo.model.value(experience.inputs),
            ppo.model.value(experience.next_inputs),
            experience.terminated,
            experience.truncated,
            config.gamma,
            config.gae_lambda,
        )
    advantages = advantages[0]
    normalised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    # The first update's ratio is 1 (pi over the policy learn() starts from), so nothing is clipped yet; with mu
    # recomputed at learn time every weight would be 1 and the loss -mean(normalised), which is 0.
    expected = -(normalised * torch.tensor(RATIOS).clamp(max=config.rho_bar)).mean().item()

    costs = ppo.learn(experience)

    assert costs["policy_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert abs(expected) > 0.01
    assert costs["clip_fraction"] == 0.0


def image_experience(ppo: PPO, lags: list[int], stored_values: torch.Tensor | None = None) -> Experience:
    """Six steps of one sequence of 10x10 frames, acted by ``ppo`` itself, each ``lags`` updates before learn();
    the stored values are acting's unless ``stored_values`` replaces them, and left out when that is empty."""
    generator = torch.Generator().manual_seed(1)
    frames = torch.randint(0, 256, (7, 10, 10), dtype=torch.uint8, generator=generator)
    torch.manual_seed(2)
    with torch.no_grad():
        acted, _ = ppo.predict({"obs": frames[:6]}, {})
    actions = {key: value[None] for key, value in acted.items()}
    if stored_values is not None:
        actions.pop("value")
        if stored_values.numel():
            actions["value"] = stored_values[None]
    return Experience(
        inputs={"obs": frames[None, :6]},
        next_inputs={"obs": frames[None, 1:]},
        actions=actions,
        rewards={"reward": torch.tensor([[0.0, 1.0, 0.0, 0.0, 1.0, 0.0]])},
        states={},
        terminated=torch.tensor([[False, False, True, False, False, False]]),
        truncated=torch.zeros(1, 6, dtype=torch.bool),
        policy_version=5 - torch.tensor([lags]),
        version=5,
    )


def image_ppo() -> PPO:
    torch.manual_seed(0)
    space = gym.spaces.Box(0, 255, (10, 10), np.uint8)
    return PPO(PPOActorCritic(space, gym.spaces.Discrete(3), hidden=()), PPOConfig(**ONE_STEP))


def learn_counting_rows(ppo: PPO, experience: Experience) -> tuple[dict[str, float], list[int]]:
    """learn()'s costs and the rows of each pass through the CNN and both heads."""
    rows = []
    policy_and_value = ppo.model.policy_and_value

    def counted(inputs):
        rows.append(len(inputs["obs"]))
        return policy_and_value(inputs)

    ppo.model.policy_and_value = counted  # type: ignore[method-assign]
    torch.manual_seed(3)
    return ppo.learn(experience), rows


NO_LAG = [0] * 6
RECOMPUTED = torch.empty(0)


def test_ppo_over_images_acts_with_the_values_and_learns_from_them_where_its_weights_played():
    ppo = image_ppo()
    experience = image_experience(ppo, NO_LAG)
    with torch.no_grad():
        assert torch.allclose(experience.actions["value"][0], ppo.model.value(experience.inputs)[0], atol=1e-6)

    costs, rows = learn_counting_rows(ppo, experience)
    recomputed, rows_recomputing = learn_counting_rows(image_ppo(), image_experience(image_ppo(), NO_LAG, RECOMPUTED))

    # One pass per minibatch (one here), and none over the batch first: the costs are those of recomputed values.
    assert (rows, rows_recomputing) == ([6], [6, 6])
    assert costs == pytest.approx(recomputed, rel=1e-4, abs=1e-6)


def test_ppo_passes_the_steps_older_weights_played_through_the_model_whatever_acting_stored():
    lags = [1, 1, 0, 0, 0, 0]
    with torch.no_grad():
        values = image_ppo().model.value({"obs": image_experience(image_ppo(), lags).inputs["obs"][0]})
    wrong = torch.cat([torch.full((2,), 100.0), values[2:]])

    costs, rows = learn_counting_rows(image_ppo(), image_experience(image_ppo(), lags, wrong))
    recomputed, _ = learn_counting_rows(image_ppo(), image_experience(image_ppo(), lags, RECOMPUTED))

    assert rows == [2, 6]
    assert costs == pytest.approx(recomputed, rel=1e-4, abs=1e-6)
    assert costs["value_loss"] < 100


def test_an_mlp_actor_critic_leaves_the_value_out_of_acting():
    assert set(cartpole_model().action_specs()) == {"action", "log_prob"}


def test_the_truncation_thresholds_must_be_positive():
    with pytest.raises(ConfigError, match="APPOConfig.rho_bar must be > 0"):
        APPOConfig(rho_bar=0.0)
    with pytest.raises(ConfigError, match="APPOConfig.c_bar must be > 0"):
        APPOConfig(c_bar=0.0)


def test_appo_learns_beside_acting_in_a_process_of_its_own():
    assert APPO.may_learn_in_own_process and APPO.learn_ahead >= 2
