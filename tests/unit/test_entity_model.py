"""The entity actor-critic on ragged batches: attention within one observation, actions routed to entities, joint
log-probabilities, and observations with no entity of a type."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from flare2.core.ragged_tensor import RaggedTensor
from flare2.errors import ConfigError
from flare2.wire.ragged import Ragged
from flare2.zoo.entity import EntityActorCritic, entity_model
from flare2.zoo.minefield import MaskedMinefield, Minefield


def model() -> EntityActorCritic:
    torch.manual_seed(0)
    env = Minefield()
    return EntityActorCritic(
        env.observation_space,
        env.action_space,
        actors={"move": "robot"},
        selects={"fire": "mine"},
        width=16,
        heads=2,
        layers=2,
    )


def batch(robots: list[int], mines: list[int], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)

    def entities(counts: list[int]) -> RaggedTensor:
        return RaggedTensor.from_ragged(Ragged.from_items([rng.random((n, 2)) for n in counts], (2,), "float32"))

    return {
        "robot": entities(robots),
        "mine": entities(mines),
        "cannon": torch.from_numpy(rng.random((len(robots), 1)).astype(np.float32)),
    }


def test_an_observation_attends_only_to_its_own_entities():
    net = model().eval()
    inputs = batch([1, 2, 3], [2, 0, 4])
    other = batch([1, 2, 3], [2, 0, 4])
    # Observation 1 changes completely (other entities, other count); 0 and 2 keep theirs.
    other["robot"] = RaggedTensor(
        torch.cat([inputs["robot"].values[:1], torch.rand(3, 2), inputs["robot"].values[3:]]), torch.tensor([1, 3, 3])
    )
    other["mine"] = RaggedTensor(
        torch.cat([inputs["mine"].values[:2], torch.rand(5, 2), inputs["mine"].values[2:]]), torch.tensor([2, 5, 4])
    )
    other["cannon"] = inputs["cannon"]
    with torch.no_grad():
        before, after = net.policy(inputs), net.policy(other)
        values_before, values_after = net.value(inputs), net.value(other)
    moves_before, moves_after = before.actor_logits["move"], after.actor_logits["move"]
    assert torch.allclose(moves_before.values[:1], moves_after.values[:1], atol=1e-6)
    assert torch.allclose(moves_before.values[3:], moves_after.values[4:], atol=1e-6)
    fire_before, fire_after = before.select_scores["fire"], after.select_scores["fire"]
    assert torch.allclose(fire_before.values[:2], fire_after.values[:2], atol=1e-6)
    assert torch.allclose(fire_before.values[2:], fire_after.values[7:], atol=1e-6)
    assert torch.allclose(values_before[[0, 2]], values_after[[0, 2]], atol=1e-6)
    assert not torch.allclose(values_before[1], values_after[1])


def test_sampled_actions_give_each_robot_a_move_and_fire_only_at_a_mine_present():
    net = model().eval()
    for seed in range(20):
        rng = np.random.default_rng(seed)
        robots, mines = rng.integers(1, 4, 16).tolist(), rng.integers(0, 6, 16).tolist()
        with torch.no_grad():
            policy = net.policy(batch(robots, mines, seed))
            actions = net.sample(policy)
        assert actions["move"].lengths.tolist() == robots
        assert ((actions["move"].values >= 0) & (actions["move"].values < 5)).all()
        fire = actions["fire"].tolist()
        assert all(fire[row] < mines[row] for row in range(16) if mines[row])


def test_the_joint_log_probability_sums_its_parts_and_a_missing_choice_counts_nothing():
    net = model().eval()
    inputs = batch([2, 1], [3, 0])
    with torch.no_grad():
        policy = net.policy(inputs)
        actions = net.sample(policy)
        log_prob, entropy = net.log_prob_and_entropy(policy, actions)
    move_logits = torch.log_softmax(policy.actor_logits["move"].values, -1)
    moves = actions["move"].values
    per_robot = move_logits[torch.arange(3), moves]
    fire_scores = torch.log_softmax(policy.select_scores["fire"].values, -1)  # the three mines of observation 0
    expected = torch.stack([per_robot[:2].sum() + fire_scores[actions["fire"][0]], per_robot[2]])
    assert torch.allclose(log_prob, expected, atol=1e-5)
    move_entropy = -(move_logits.exp() * move_logits).sum(-1)
    fire_entropy = -(fire_scores.exp() * fire_scores).sum()
    assert torch.allclose(entropy, torch.stack([move_entropy[:2].sum() + fire_entropy, move_entropy[2]]), atol=1e-5)


def test_values_follow_the_leading_dims_of_a_learn_batch():
    net = model()
    flat = batch([1, 2, 3, 1, 2, 1], [0, 1, 2, 5, 0, 1])
    sequences = {
        "robot": RaggedTensor(flat["robot"].values, flat["robot"].lengths.reshape(2, 3)),
        "mine": RaggedTensor(flat["mine"].values, flat["mine"].lengths.reshape(2, 3)),
        "cannon": flat["cannon"].reshape(2, 3, 1),
    }
    with torch.no_grad():
        assert torch.allclose(net.value(sequences), net.value(flat).reshape(2, 3), atol=1e-6)


def test_actions_on_the_wrong_kind_of_space_are_refused_naming_the_action():
    env = Minefield()
    with pytest.raises(ConfigError, match=r"actor action 'fire' must be Sequence\(Discrete\(n\)\)"):
        EntityActorCritic(env.observation_space, env.action_space, actors={"fire": "mine"}, selects={"move": "robot"})
    with pytest.raises(ConfigError, match="needs at least one entity type"):
        EntityActorCritic(
            gym.spaces.Dict({"cannon": env.observation_space["cannon"]}), env.action_space, actors={}, selects={}
        )


def test_a_select_only_model_over_observations_with_nothing_to_select_gives_zero_tensors_per_row():
    torch.manual_seed(0)
    env = Minefield()
    net = EntityActorCritic(
        env.observation_space,
        gym.spaces.Dict({"fire": env.action_space["fire"]}),
        actors={},
        selects={"fire": "mine"},
        width=16,
        heads=2,
        layers=1,
    ).eval()
    inputs = batch([1, 2], [0, 0])
    with torch.no_grad():
        policy = net.policy(inputs)
        log_prob, entropy = net.log_prob_and_entropy(policy, net.sample(policy))
    assert torch.equal(log_prob, torch.zeros(2)) and torch.equal(entropy, torch.zeros(2))


def test_a_move_its_robots_mask_forbids_is_never_sampled_nor_counted_in_the_log_probabilities():
    env = MaskedMinefield()
    net = entity_model(env, width=16, layers=1)
    assert net.masks == {"move": "move_mask"} and "move_mask" not in net.entity_types
    robots = [3, 1, 2, 3]
    inputs = batch(robots, [1, 2, 0, 3])
    rng = np.random.default_rng(1)
    # A random mask per robot, each with one legal move at least.
    masks = rng.random((sum(robots), 5)) < 0.3
    masks[np.arange(len(masks)), rng.integers(0, 5, len(masks))] = True
    inputs["move_mask"] = RaggedTensor(torch.from_numpy(masks), torch.tensor(robots))
    with torch.no_grad():
        policy = net.policy(inputs)
        for _ in range(200):
            moves = net.sample(policy)["move"].values.numpy()
            assert masks[np.arange(len(masks)), moves].all(), "a masked move was sampled"
        best = net.best_action(policy)["move"].values.numpy()
        assert masks[np.arange(len(masks)), best].all()
        # The probabilities of each robot's legal moves add up to 1.
        probabilities = torch.softmax(policy.actor_logits["move"].values, -1).numpy()
        np.testing.assert_allclose((probabilities * masks).sum(-1), 1.0, rtol=1e-5)
        _, entropy = net.log_prob_and_entropy(policy, net.sample(policy))
    # The joint entropy: each robot's over its legal moves, and the cannon's over the mines there.
    most = [
        np.log(masks[start : start + n].sum(-1)).sum() + np.log(max(mines, 1))
        for start, n, mines in zip(np.cumsum([0, *robots[:-1]]), robots, [1, 2, 0, 3])
    ]
    assert (entropy.numpy() <= np.array(most) + 1e-4).all()


def test_a_mask_of_the_wrong_shape_is_named():
    class Wrong(MaskedMinefield):
        def __init__(self):
            super().__init__()
            parts = dict(self.observation_space.spaces)
            parts["move_mask"] = gym.spaces.Sequence(gym.spaces.MultiBinary(4))
            self.observation_space = gym.spaces.Dict(parts)

    with pytest.raises(ConfigError, match="'move_mask' masks the 5 choices.*MultiBinary\\(5\\)"):
        entity_model(Wrong())


def test_an_entity_env_names_what_each_action_acts_on_or_is_told_how():
    env = Minefield()
    env.metadata = {"render_modes": []}
    with pytest.raises(ConfigError, match="metadata\\['entity_actions'\\]"):
        entity_model(env)
