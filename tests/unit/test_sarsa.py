"""SARSA: targets from the next action taken, expected values where it is unknown, tabular learning, acting."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from flare2.core.algorithm import Experience
from flare2.errors import ConfigError
from flare2.zoo.models import QNetwork
from flare2.zoo.sarsa import SARSA, SARSAConfig

# A Q-table over 3 states and 2 actions: Q[state, action].
TABLE = torch.tensor([[1.0, 2.0], [3.0, 5.0], [-4.0, 0.0]])
GAMMA = 0.5
EPSILON = 0.2


class Env:
    observation_space = gym.spaces.Discrete(3)
    action_space = gym.spaces.Discrete(2)


def tabular_sarsa(**config) -> SARSA:
    algorithm = SARSA.for_env(Env(), SARSAConfig(**{"gamma": GAMMA, "epsilon": EPSILON, **config}))
    with torch.no_grad():
        algorithm.model.q[-1].weight.copy_(TABLE.T)
    return algorithm


def expected(state: int) -> float:
    q = TABLE[state]
    return (1 - EPSILON) * q.max().item() + EPSILON * q.mean().item()


def one_sequence(obs, next_obs, actions, rewards, terminated, truncated) -> Experience:
    return Experience(
        inputs={"obs": torch.tensor([obs])},
        next_inputs={"obs": torch.tensor([next_obs])},
        actions={"action": torch.tensor([actions])},
        rewards={"reward": torch.tensor([rewards], dtype=torch.float32)},
        states={},
        terminated=torch.tensor([terminated]),
        truncated=torch.tensor([truncated]),
    )


def test_linear_q_network_over_a_one_hot_state_is_a_q_table_and_with_hidden_layers_is_not():
    assert [name for name, _ in SARSA.for_env(Env()).model.named_parameters()] == ["q.0.weight"]
    torch.testing.assert_close(tabular_sarsa().model({"obs": torch.tensor([0, 1, 2])}), TABLE)
    assert SARSA.for_env(Env()).model.is_table and not SARSA.for_env(Env(), hidden=(8,)).model.is_table


def test_targets_use_the_next_action_taken_and_the_expected_value_where_the_sequence_or_episode_stops():
    # Steps: 0 -> 1 (next action 1, same episode); 1 -> 2 terminated; 0 -> 2 truncated
    # (the next step starts a new episode); 2 -> 1, then 1 -> 0 as the sequence's last step.
    experience = one_sequence(
        obs=[0, 1, 0, 2, 1],
        next_obs=[1, 2, 2, 1, 0],
        actions=[0, 1, 1, 0, 1],
        rewards=[1.0, 2.0, 3.0, 4.0, 5.0],
        terminated=[False, True, False, False, False],
        truncated=[False, False, True, False, False],
    )
    targets = tabular_sarsa().targets(experience)
    hand = [
        1.0 + GAMMA * TABLE[1, 1].item(),  # next step took action 1 in state 1
        2.0,  # terminated: no bootstrap
        3.0 + GAMMA * expected(2),  # truncated: the next step belongs to another episode
        4.0 + GAMMA * TABLE[1, 1].item(),
        5.0 + GAMMA * expected(0),  # last step: the next action is not in the sequence
    ]
    torch.testing.assert_close(targets, torch.tensor([hand]))


def test_a_table_moves_each_visited_entry_by_lr_times_its_own_td_error_and_no_other_entry():
    algorithm = tabular_sarsa(lr=0.5)
    # Two sequences: state 2 action 0 terminates with reward 10 (TD error 10 - (-4) = 14); state 0 action 1 terminates
    # with reward 0 (TD error -2). However many samples share the batch, each entry moves by its own error alone.
    experience = Experience(
        inputs={"obs": torch.tensor([[2], [0]])},
        next_inputs={"obs": torch.tensor([[2], [0]])},
        actions={"action": torch.tensor([[0], [1]])},
        rewards={"reward": torch.tensor([[10.0], [0.0]])},
        states={},
        terminated=torch.tensor([[True], [True]]),
        truncated=torch.tensor([[False], [False]]),
    )
    algorithm.learn(experience)
    change = algorithm.model({"obs": torch.tensor([0, 1, 2])}).detach() - TABLE
    torch.testing.assert_close(change, torch.tensor([[0.0, 0.5 * -2.0], [0.0, 0.0], [0.5 * 14.0, 0.0]]))


def test_sarsa_learns_a_two_step_chain_to_its_discounted_values():
    # State 0 --a--> state 1 --a--> terminal with reward 1 (both actions alike): Q(1) = 1, Q(0) = gamma.
    torch.manual_seed(0)
    algorithm = SARSA.for_env(Env(), SARSAConfig(lr=0.05, gamma=0.9, epsilon=0.0))
    for _ in range(600):
        actions = torch.randint(0, 2, (2,)).tolist()
        algorithm.learn(
            one_sequence(
                obs=[0, 1],
                next_obs=[1, 2],
                actions=actions,
                rewards=[0.0, 1.0],
                terminated=[False, True],
                truncated=[False, False],
            )
        )
    q = algorithm.model({"obs": torch.tensor([0, 1])}).detach()
    torch.testing.assert_close(q, torch.tensor([[0.9, 0.9], [1.0, 1.0]]), atol=0.05, rtol=0)


def test_epsilon_zero_acts_greedily_and_epsilon_one_explores_every_action():
    states = torch.tensor([0, 1, 2] * 100)
    greedy, _ = tabular_sarsa(epsilon=0.0).predict({"obs": states}, {})
    torch.testing.assert_close(greedy["action"], TABLE.argmax(-1)[states])
    random, _ = tabular_sarsa(epsilon=1.0).predict({"obs": states}, {})
    assert set(random["action"].tolist()) == {0, 1}
    best, _ = tabular_sarsa(epsilon=1.0).predict_greedy({"obs": states}, {})
    torch.testing.assert_close(best["action"], TABLE.argmax(-1)[states])


def test_bad_configs_and_spaces_name_the_problem():
    with pytest.raises(ConfigError, match="epsilon"):
        SARSAConfig(epsilon=1.5)
    with pytest.raises(ConfigError, match="Discrete action space"):
        QNetwork(gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (1,)))


def test_a_model_with_legal_move_masks_is_refused_and_dqn_named():
    board = gym.spaces.Dict({"observation": gym.spaces.Discrete(4), "action_mask": gym.spaces.MultiBinary(2)})
    with pytest.raises(ConfigError, match="legal-move masks with DQN"):
        SARSA(QNetwork(board, gym.spaces.Discrete(2), hidden=()))


def test_a_q_model_of_the_users_own_learns_as_a_network():
    class OwnQ(QNetwork):
        def __init__(self):
            super().__init__(Env.observation_space, Env.action_space, hidden=())
            del self.is_table

    algorithm = SARSA(OwnQ())
    assert not algorithm.tabular and isinstance(algorithm.optimizer, torch.optim.Adam)


def test_a_step_size_left_unset_is_a_tables_with_sgd_and_adams_own_for_any_other_q_model():
    table = SARSA.for_env(Env(), SARSAConfig())
    network = SARSA.for_env(gym.make("CartPole-v1"), SARSAConfig(), hidden=(16,))
    named = SARSA.for_env(gym.make("CartPole-v1"), SARSAConfig(lr=3e-4))
    assert isinstance(table.optimizer, torch.optim.SGD) and table.optimizer.param_groups[0]["lr"] == 0.1
    assert isinstance(network.optimizer, torch.optim.Adam) and network.optimizer.param_groups[0]["lr"] == 1e-3
    assert named.optimizer.param_groups[0]["lr"] == 3e-4
