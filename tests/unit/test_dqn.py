"""DQN: epsilon and learning-rate schedules, Polyak target updates, and no bootstrap after a termination."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from flare2.core.algorithm import Experience
from flare2.errors import ConfigError
from flare2.zoo.dqn import DQN, DQNConfig
from flare2.zoo.models import QNetwork


class Env:
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)


def dqn(**config) -> DQN:
    torch.manual_seed(0)
    return DQN.for_env(Env(), DQNConfig(**{"minibatch_size": 4, **config}), hidden=(8,))


def transitions(count: int, *, obs, next_obs, action: int, reward: float, terminated: bool) -> Experience:
    return Experience(
        inputs={"obs": torch.tensor([[obs]] * count, dtype=torch.float32)},
        next_inputs={"obs": torch.tensor([[next_obs]] * count, dtype=torch.float32)},
        actions={"action": torch.full((count, 1), action)},
        rewards={"reward": torch.full((count, 1), reward)},
        states={},
        terminated=torch.full((count, 1), terminated),
        truncated=torch.zeros(count, 1, dtype=torch.bool),
    )


def three_sequences(obs, next_obs, *, terminated, truncated) -> Experience:
    """Three sequences of three steps with rewards 1, 2, 4; ``terminated`` and ``truncated`` give, per row, the
    step that ends it that way (None: none)."""

    def ends(steps) -> torch.Tensor:
        flags = torch.zeros(3, 3, dtype=torch.bool)
        for row, step in enumerate(steps):
            if step is not None:
                flags[row, step] = True
        return flags

    return Experience(
        inputs={"obs": obs},
        next_inputs={"obs": next_obs},
        actions={"action": torch.zeros(3, 3, dtype=torch.int64)},
        rewards={"reward": torch.tensor([[1.0, 2.0, 4.0]] * 3)},
        states={},
        terminated=ends(terminated),
        truncated=ends(truncated),
    )


def q_value(algorithm: DQN, obs, action: int) -> float:
    return algorithm.model({"obs": torch.tensor([obs], dtype=torch.float32)})[0, action].item()


def test_epsilon_falls_linearly_over_the_exploration_steps_and_greedy_prediction_does_not_count():
    algorithm = dqn(epsilon_start=1.0, epsilon_end=0.2, exploration_steps=100)
    algorithm.predict({"obs": torch.zeros(50, 2)}, {})
    assert algorithm.epsilon == pytest.approx(0.6)
    algorithm.predict_greedy({"obs": torch.zeros(50, 2)}, {})
    assert algorithm.epsilon == pytest.approx(0.6)
    algorithm.predict({"obs": torch.zeros(80, 2)}, {})
    assert algorithm.epsilon == pytest.approx(0.2)


def test_greedy_prediction_is_the_arg_max_q_value():
    algorithm = dqn()
    obs = torch.randn(16, 2)
    actions, _ = algorithm.predict_greedy({"obs": obs}, {})
    torch.testing.assert_close(actions["action"], algorithm.model({"obs": obs}).argmax(-1))


def test_the_target_network_moves_a_tau_fraction_towards_the_q_network_at_each_refresh():
    algorithm = dqn(target_tau=0.25)
    before = [p.detach().clone() for p in algorithm.target.parameters()]
    algorithm.learn(transitions(4, obs=[0.1, 0.2], next_obs=[0.3, 0.4], action=1, reward=1.0, terminated=False))
    for target, old, online in zip(algorithm.target.parameters(), before, algorithm.model.parameters()):
        torch.testing.assert_close(target, old + 0.25 * (online - old))


def test_a_terminated_transition_learns_its_reward_and_nothing_from_the_next_observation():
    algorithm = dqn(lr=1e-2, gamma=0.9)
    # The next observation's value is made large first; a termination must ignore it.
    for _ in range(300):
        algorithm.learn(transitions(4, obs=[0.9, 0.9], next_obs=[0.9, 0.9], action=0, reward=5.0, terminated=True))
        algorithm.learn(transitions(4, obs=[0.9, 0.9], next_obs=[0.9, 0.9], action=1, reward=5.0, terminated=True))
        algorithm.learn(transitions(4, obs=[-0.5, 0.5], next_obs=[0.9, 0.9], action=0, reward=1.0, terminated=True))
    assert q_value(algorithm, [-0.5, 0.5], 0) == pytest.approx(1.0, abs=0.1)
    assert q_value(algorithm, [0.9, 0.9], 0) == pytest.approx(5.0, abs=0.2)


def test_the_learning_rate_falls_linearly_to_zero_over_the_anneal_steps():
    algorithm = dqn(lr=1e-3, anneal_steps=100)
    step = transitions(4, obs=[0.0, 0.0], next_obs=[0.0, 0.0], action=0, reward=0.0, terminated=False)
    algorithm.predict({"obs": torch.zeros(25, 2)}, {})
    algorithm.learn(step)
    assert algorithm.optimizer.param_groups[0]["lr"] == pytest.approx(7.5e-4)
    algorithm.predict({"obs": torch.zeros(100, 2)}, {})
    algorithm.learn(step)
    assert algorithm.optimizer.param_groups[0]["lr"] == 0.0


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError, match="target_tau"):
        DQNConfig(target_tau=0.0)
    with pytest.raises(ConfigError, match="epsilon_end"):
        DQNConfig(epsilon_start=0.1, epsilon_end=0.5)


def test_sequences_give_n_step_targets_that_stop_at_an_episode_end():
    algorithm = dqn(gamma=0.5, double_q=False)
    obs = torch.tensor([[[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]]] * 3)
    next_obs = torch.tensor([[[0.2, 0.2], [0.3, 0.3], [0.4, 0.4]]] * 3)
    # Row 0 runs on; row 1 terminates after its second step; row 2 is truncated there.
    experience = three_sequences(obs, next_obs, terminated=(None, 1, None), truncated=(None, None, 1))
    value = algorithm.target({"obs": next_obs[0]}).max(-1).values.tolist()  # the value after each step of a row
    targets = algorithm.targets(algorithm.first_step_returns(experience), torch.arange(3))
    expected = torch.tensor(
        [
            1.0 + 0.5 * 2.0 + 0.25 * 4.0 + 0.125 * value[2],
            1.0 + 0.5 * 2.0,
            1.0 + 0.5 * 2.0 + 0.25 * value[1],
        ]
    )
    torch.testing.assert_close(targets, expected)


def test_double_q_sequences_value_only_the_observation_each_first_step_bootstraps_from():
    algorithm = dqn(gamma=0.5)
    next_obs = torch.tensor([[[0.2, -0.3], [0.6, 0.1], [-0.4, 0.9]]] * 3)
    # Row 0 runs on; row 1 is truncated after its first step; row 2 terminates there.
    experience = three_sequences(torch.zeros(3, 3, 2), next_obs, terminated=(None, None, 0), truncated=(None, 0, None))
    chosen = algorithm.model({"obs": next_obs[0]}).argmax(-1, keepdim=True)
    value = algorithm.target({"obs": next_obs[0]}).gather(-1, chosen).squeeze(-1).tolist()
    expected = torch.tensor([1.0 + 0.5 * 2.0 + 0.25 * 4.0 + 0.125 * value[2], 1.0 + 0.5 * value[0], 1.0])
    torch.testing.assert_close(algorithm.targets(algorithm.first_step_returns(experience), torch.arange(3)), expected)


def test_one_step_sequences_give_the_double_q_target():
    algorithm = dqn(gamma=0.9)
    experience = transitions(2, obs=[0.1, 0.2], next_obs=[0.5, -0.5], action=1, reward=1.0, terminated=False)
    next_obs = torch.tensor([[0.5, -0.5]])
    chosen = algorithm.model({"obs": next_obs}).argmax(-1)
    expected = 1.0 + 0.9 * algorithm.target({"obs": next_obs})[0, chosen].item()
    torch.testing.assert_close(
        algorithm.targets(algorithm.first_step_returns(experience), torch.arange(2)), torch.full((2,), expected)
    )


def test_a_hidden_layer_size_below_one_is_refused_with_a_message_naming_the_option():
    with pytest.raises(ConfigError, match=r"layer sizes must be >= 1, got \[4, 0, 2\].*--hidden"):
        QNetwork(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), hidden=(0,))


class Board:
    """Observations with legal-move masks over 4 actions, as a turn-based game gives them."""

    observation_space = gym.spaces.Dict(
        {"observation": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "action_mask": gym.spaces.MultiBinary(4)}
    )
    action_space = gym.spaces.Discrete(4)


def test_a_masked_move_is_never_chosen_exploring_or_greedy_nor_the_maximum_a_target_takes():
    torch.manual_seed(0)
    algorithm = DQN.for_env(Board(), DQNConfig(minibatch_size=4, epsilon_start=0.5, epsilon_end=0.5), hidden=(8,))
    assert algorithm.model.input_names == ("observation", "action_mask")
    mask = torch.rand(2000, 4) < 0.5
    mask[torch.arange(2000), torch.randint(0, 4, (2000,))] = True
    inputs = {"observation": torch.randn(2000, 2), "action_mask": mask}
    explored = algorithm.predict(inputs, {})[0]["action"]
    greedy = algorithm.predict_greedy(inputs, {})[0]["action"]
    assert mask[torch.arange(2000), explored].all() and mask[torch.arange(2000), greedy].all()
    # Exploring, every legal move is drawn: half of the rows explore, among their legal moves alike.
    assert (explored != greedy).float().mean() > 0.15
    # The target's maximum is the best legal move's; a position without one ends its game: its discount is 0, and
    # ILLEGAL_LOGIT is finite, so nothing is bootstrapped from it.
    next_mask = torch.tensor([[True, False, False, False], [False, False, False, False]])
    next_inputs = {"observation": torch.randn(2, 2), "action_mask": next_mask}
    q = algorithm.target(next_inputs)
    assert q[0, 1:].max() < -1e3 and q[1].max() < -1e3
    experience = Experience(
        inputs={key: value[:, None] for key, value in next_inputs.items()},
        next_inputs={key: value[:, None] for key, value in next_inputs.items()},
        actions={"action": torch.zeros(2, 1, dtype=torch.int64)},
        rewards={"reward": torch.ones(2, 1)},
        states={},
        terminated=torch.tensor([[False], [True]]),
        truncated=torch.zeros(2, 1, dtype=torch.bool),
    )
    targets = algorithm.targets(algorithm.first_step_returns(experience), torch.arange(2))
    torch.testing.assert_close(targets, torch.tensor([1.0 + 0.99 * q[0, 0].item(), 1.0]))
