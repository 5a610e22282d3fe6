"""TD3: actions inside the box, a deterministic greedy action, learning steps, and no bootstrap after termination."""

from __future__ import annotations

import contextlib
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from flare2.core.algorithm import Experience
from flare2.errors import ConfigError
from flare2.zoo.sac import SAC, SACConfig
from flare2.zoo.td3 import TD3, TD3Config

OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
ACTIONS = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))


class Env:
    """Just the spaces ``for_env`` reads."""

    observation_space = OBS
    action_space = ACTIONS


def td3(**config) -> TD3:
    torch.manual_seed(0)
    return TD3.for_env(Env(), TD3Config(**{"hidden": (16, 16), "minibatch_size": 8, **config}))


def sac() -> SAC:
    torch.manual_seed(0)
    return SAC.for_env(Env(), SACConfig(hidden=(16, 16), minibatch_size=8))


def experience(count: int = 32, *, terminated: bool = False, truncated: bool = False) -> Experience:
    generator = torch.Generator().manual_seed(1)
    return Experience(
        inputs={"obs": torch.randn(count, 1, 3, generator=generator)},
        next_inputs={"obs": torch.randn(count, 1, 3, generator=generator)},
        actions={
            "action": torch.rand(count, 1, 2, generator=generator) * torch.tensor([4.0, 1.0]) - torch.tensor([2.0, 0.0])
        },
        rewards={"reward": -torch.rand(count, 1, generator=generator)},
        states={},
        terminated=torch.full((count, 1), terminated),
        truncated=torch.full((count, 1), truncated),
    )


def in_box(action: torch.Tensor) -> bool:
    return bool(((action >= torch.tensor(ACTIONS.low)) & (action <= torch.tensor(ACTIONS.high))).all())


def test_predicted_actions_have_the_spec_shape_and_dtype_and_stay_inside_the_box_even_with_large_noise():
    algorithm = td3(exploration_noise=5.0)
    spec = algorithm.model.action_specs()["action"]
    with torch.inference_mode():
        actions, states = algorithm.predict({"obs": torch.randn(64, 3)}, {})
    action = actions["action"]
    assert states == {} and spec.shape == (2,) and spec.dtype == "float32"
    assert action.shape == (64, 2) and action.dtype == torch.float32
    assert in_box(action)
    assert (action == torch.tensor(ACTIONS.high)).any()  # the noise was clipped, not squashed


def test_the_first_random_steps_rows_are_uniform_over_the_box_and_the_actor_takes_over_after():
    algorithm = td3(random_steps=100, exploration_noise=0.0)
    obs = torch.zeros(60, 3)
    with torch.inference_mode():
        first = algorithm.predict({"obs": obs}, {})[0]["action"]
        second = algorithm.predict({"obs": obs}, {})[0]["action"]
        greedy = algorithm.predict_greedy({"obs": obs[:1]}, {})[0]["action"]
    assert in_box(first) and in_box(second) and first.std(0).min() > 0.1
    assert (second[40:] == greedy).all() and not (second[:40] == greedy).all(-1).any()


def test_the_greedy_action_is_deterministic_and_has_no_noise():
    algorithm = td3(exploration_noise=1.0)
    obs = torch.randn(16, 3)
    with torch.inference_mode():
        once, states = algorithm.predict_greedy({"obs": obs}, {})
        twice, _ = algorithm.predict_greedy({"obs": obs}, {})
        noisy, _ = algorithm.predict({"obs": obs}, {})
    assert states == {} and torch.equal(once["action"], twice["action"]) and in_box(once["action"])
    assert not torch.equal(once["action"], noisy["action"])


def test_learn_returns_finite_costs_and_moves_the_critics_the_actor_and_the_targets():
    algorithm = td3()
    before = {name: p.clone() for name, p in algorithm.model.named_parameters()}
    target_before = [p.clone() for p in algorithm.target.parameters()]
    costs = algorithm.learn(experience(32))
    assert set(costs) == {"critic_loss", "q_mean", "actor_loss"} and all(math.isfinite(v) for v in costs.values())
    assert algorithm.gradient_steps == 4  # 32 transitions, minibatches of 8
    changed = {name.split(".")[0] for name, p in algorithm.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed == {"actor", "q1", "q2"}
    assert not all(torch.equal(a, b) for a, b in zip(target_before, algorithm.target.parameters()))


def test_a_terminated_step_has_no_bootstrap_term_and_a_truncated_one_keeps_it():
    algorithm = td3(gamma=0.9, policy_noise=0.0)
    batch = experience(8)
    rewards, next_obs = batch.rewards["reward"][:, 0], batch.next_inputs["obs"][:, 0]
    with torch.no_grad():
        next_q = torch.minimum(*algorithm.target.q_values(next_obs, algorithm.target(next_obs)))
    terminated = algorithm.critic_target(rewards, next_obs, torch.ones(8, dtype=torch.bool))
    truncated = algorithm.critic_target(rewards, next_obs, torch.zeros(8, dtype=torch.bool))
    assert torch.equal(terminated, rewards)
    assert torch.allclose(truncated, rewards + 0.9 * next_q) and next_q.abs().min() > 0


def test_learning_from_terminated_steps_differs_from_learning_from_truncated_ones():
    outcomes = []
    for flags in ({"terminated": True}, {"truncated": True}):
        algorithm = td3()
        torch.manual_seed(2)
        algorithm.learn(experience(32, **flags))
        outcomes.append(torch.cat([p.flatten() for p in algorithm.model.q1.parameters()]))
    assert not torch.equal(*outcomes)


def test_a_checkpoint_restores_the_networks_the_targets_the_optimizers_and_the_counters():
    algorithm = td3()
    algorithm.learn(experience(32))
    with torch.inference_mode():
        algorithm.predict({"obs": torch.randn(5, 3)}, {})
    restored = td3()
    restored.load_state_dict(algorithm.state_dict())
    assert (restored.predicted, restored.gradient_steps) == (5, 4)
    for a, b in zip(
        [*algorithm.model.parameters(), *algorithm.target.parameters()],
        [*restored.model.parameters(), *restored.target.parameters()],
    ):
        assert torch.equal(a, b)
    assert (
        restored.critic_optimizer.state_dict()["state"][0]["step"]
        == algorithm.critic_optimizer.state_dict()["state"][0]["step"]
    )
    assert (
        restored.actor_optimizer.state_dict()["state"].keys() == algorithm.actor_optimizer.state_dict()["state"].keys()
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("actor_lr", 0.0),
        ("gamma", 1.5),
        ("tau", 0.0),
        ("minibatch_size", 0),
        ("policy_delay", 0),
        ("random_steps", -1),
        ("hidden", ()),
        ("exploration_noise", -0.1),
        ("max_grad_norm", 0.0),
    ],
)
def test_a_bad_config_value_is_a_config_error_that_names_it(field, value):
    with pytest.raises(ConfigError, match=field):
        TD3Config(**{field: value})


def test_a_discrete_action_space_is_a_config_error():
    class DiscreteEnv:
        observation_space = OBS
        action_space = gym.spaces.Discrete(3)

    with pytest.raises(ConfigError, match="Box action"):
        TD3.for_env(DiscreteEnv(), TD3Config())


def critic_weight_gradients_during_learn(algorithm: TD3 | SAC) -> int:
    """How many gradients of the critics' weights the backward passes of one learn() call took."""
    taken = []
    handles = [p.register_hook(lambda grad: taken.append(1)) for p in algorithm.model.critic_parameters()]
    torch.manual_seed(3)
    algorithm.learn(experience(count=16))
    for handle in handles:
        handle.remove()
    return len(taken)


@pytest.mark.parametrize("make", [lambda: td3(policy_delay=1), sac])
def test_the_actor_step_takes_no_gradient_of_the_critics_weights_and_learns_what_it_learned_with_them(make):
    # The actor's loss reaches the actor through the critics; their own weight gradients would be thrown away.
    frozen, reference = make(), make()
    reference.critics_as_constants = contextlib.nullcontext
    taken, taken_before = critic_weight_gradients_during_learn(frozen), critic_weight_gradients_during_learn(reference)
    parameters = len(frozen.model.critic_parameters())
    assert taken == 2 * parameters < taken_before  # 2 gradient steps, each the critics' own step alone
    assert all(p.requires_grad for p in frozen.model.critic_parameters())
    for name, value in frozen.model.state_dict().items():
        assert torch.equal(value, reference.model.state_dict()[name]), name
