"""Short-term memory: the unroll restarts states at episode ends; the GRU model, RecurrentPPO, the no-velocity env."""

from __future__ import annotations

import math
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from doubles import received

from flare2.core.algorithm import Experience
from flare2.errors import ConfigError
from flare2.zoo.envs import CARTPOLE_NO_VELOCITY, CARTPOLE_NO_VELOCITY_ENTRY
from flare2.zoo.recurrent import GRUActorCritic, unroll, unroll_segments
from flare2.zoo.recurrent_ppo import RecurrentPPO, RecurrentPPOConfig

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)
B, T, F, H = 3, 8, 4, 5


@pytest.fixture
def cell():
    torch.manual_seed(0)
    gru = torch.nn.GRUCell(F, H)

    def step(x, h):
        next_h = gru(x, h)
        return next_h * 2, next_h  # features differ from the state, to tell them apart

    return step


def flags(marks, batch=B, steps=T):
    """[batch, steps] bool flags, True at the (row, t) pairs in ``marks``."""
    result = torch.zeros(batch, steps, dtype=torch.bool)
    for row, t in marks:
        result[row, t] = True
    return result


@pytest.mark.parametrize("end_kind", ["terminated", "truncated"])
def test_after_an_episode_end_the_unroll_gives_what_a_fresh_sequence_from_zeros_gives(cell, end_kind):
    # Either kind of end restarts the state: the unroll takes terminated | truncated (Experience.episode_ends).
    x, h0 = torch.randn(B, T, F), torch.randn(B, H)
    terminated = flags([(1, 2)]) if end_kind == "terminated" else flags([])
    truncated = flags([(1, 2)]) if end_kind == "truncated" else flags([])
    features, after = unroll(cell, x, h0, terminated | truncated)
    fresh_features, fresh_after = unroll(cell, x[1:2, 3:], torch.zeros(1, H), flags([], 1, T - 3))
    torch.testing.assert_close(features[1, 3:], fresh_features[0])
    torch.testing.assert_close(after[1, 3:], fresh_after[0])
    # Before the end, and in rows without one, nothing restarts.
    unbroken, _ = unroll(cell, x, h0, flags([]))
    torch.testing.assert_close(features[1, :3], unbroken[1, :3])
    torch.testing.assert_close(features[[0, 2]], unbroken[[0, 2]])
    assert not torch.allclose(features[1, 3:], unbroken[1, 3:])


def test_without_episode_ends_the_state_after_each_step_feeds_the_next_step(cell):
    x, h0 = torch.randn(B, T, F), torch.randn(B, H)
    features, after = unroll(cell, x, h0, flags([]))
    assert features.shape == (B, T, H) and after.shape == (B, T, H)
    h = h0
    for t in range(T):
        feature, h = cell(x[:, t], h)
        torch.testing.assert_close(features[:, t], feature)
        torch.testing.assert_close(after[:, t], h)


def test_the_state_after_an_ending_step_is_the_one_before_the_reset(cell):
    # It is what the value of next_inputs must see when bootstrapping at a truncation.
    x, h0 = torch.randn(B, T, F), torch.randn(B, H)
    _, after = unroll(cell, x, h0, flags([(0, 4)]))
    unbroken, unbroken_after = unroll(cell, x, h0, flags([]))
    torch.testing.assert_close(after[0, 4], unbroken_after[0, 4])
    assert after[0, 4].abs().sum() > 0


def test_the_unroll_resets_named_states_to_a_given_initial_state():
    def step(x, state):
        total = state["total"] + x
        return total, {"total": total}

    x = torch.ones(1, 4, 1)
    features, after = unroll(
        step, x, {"total": torch.zeros(1, 1)}, flags([(0, 1)], 1, 4), initial_state={"total": torch.full((1, 1), 10.0)}
    )
    assert features[0, :, 0].tolist() == [1.0, 2.0, 11.0, 12.0]
    assert after["total"][0, :, 0].tolist() == [1.0, 2.0, 11.0, 12.0]


def test_unroll_segments_matches_the_step_by_step_unroll_for_the_gru_model():
    torch.manual_seed(1)
    model = GRUActorCritic(OBS_SPACE, ACTION_SPACE, hidden_size=H)
    x, h0 = model.encode(torch.randn(B, T, 2), 2), torch.randn(B, 2 * H)
    ends = flags([(0, 2), (1, 2), (2, 5), (0, 7)])
    by_step = unroll(model.cell, x, h0, ends)
    by_stretch = unroll_segments(model.stretch, x, h0, ends)
    torch.testing.assert_close(by_step[0], by_stretch[0])
    torch.testing.assert_close(by_step[1], by_stretch[1])


def test_the_gru_model_declares_its_memory_and_one_step_returns_a_next_state_of_that_shape():
    model = GRUActorCritic(OBS_SPACE, ACTION_SPACE, hidden_size=H)
    ((name, spec),) = model.state_specs().items()
    assert name == "hidden" and spec.shape == (2 * H,) and spec.dtype == "float32"
    assert set(model.action_specs()) == {"action", "log_prob"}
    logits, value, next_hidden = model.step(torch.randn(4, 2), torch.zeros(4, 2 * H))
    assert logits.shape == (4, 2) and value.shape == (4,) and next_hidden.shape == (4, 2 * H)


def test_the_gru_model_refuses_continuous_actions():
    with pytest.raises(ConfigError, match="Discrete"):
        GRUActorCritic(OBS_SPACE, gym.spaces.Box(-1.0, 1.0, (1,), np.float32))


def make_algorithm(**config) -> RecurrentPPO:
    torch.manual_seed(0)
    return RecurrentPPO(
        GRUActorCritic(OBS_SPACE, ACTION_SPACE, hidden_size=H),
        RecurrentPPOConfig(epochs=2, minibatch_sequences=2, **config),
    )


@pytest.mark.parametrize("greedy", [False, True])
def test_predict_returns_actions_and_a_next_hidden_of_the_spec_shape(greedy):
    algorithm = make_algorithm()
    predict = algorithm.predict_greedy if greedy else algorithm.predict
    with torch.no_grad():
        actions, states = predict({"obs": torch.randn(4, 2)}, {"hidden": torch.zeros(4, 2 * H)})
    assert actions["action"].shape == (4,) and actions["action"].dtype == torch.int64
    assert actions["log_prob"].shape == (4,) and bool((actions["log_prob"] <= 0).all())
    assert set(states) == {"hidden"} and states["hidden"].shape == (4, 2 * H)


def test_predict_greedy_takes_the_most_likely_action():
    algorithm = make_algorithm()
    obs, hidden = torch.randn(16, 2), torch.randn(16, 2 * H)
    with torch.no_grad():
        logits, _, _ = algorithm.model.step(obs, hidden)
        actions, _ = algorithm.predict_greedy({"obs": obs}, {"hidden": hidden})
    assert torch.equal(actions["action"], logits.argmax(-1))


def hand_made_experience(algorithm: RecurrentPPO, batch: int = 4, steps: int = 6) -> Experience:
    torch.manual_seed(2)
    obs = torch.randn(batch, steps + 1, 2)
    terminated, truncated = flags([(0, 2)], batch, steps), flags([(1, 3)], batch, steps)
    with torch.no_grad():
        _, _, hidden_after = algorithm.model.sequence(obs[:, :-1], torch.zeros(batch, 2 * H), terminated | truncated)
    states = torch.cat([torch.zeros(batch, 1, 2 * H), hidden_after[:, :-1]], dim=1)
    states[terminated | truncated] = 0  # wrong on purpose for the step after an end: learn() must not read it
    return Experience(
        inputs={"obs": obs[:, :-1]},
        next_inputs={"obs": obs[:, 1:]},
        actions={"action": torch.randint(0, 2, (batch, steps)), "log_prob": torch.full((batch, steps), -math.log(2))},
        rewards={"reward": torch.ones(batch, steps)},
        states={"hidden": states},
        terminated=terminated,
        truncated=truncated,
    )


def test_learn_on_a_hand_made_experience_returns_finite_costs_and_counts_the_steps():
    algorithm = make_algorithm()
    before = [p.detach().clone() for p in algorithm.model.parameters()]
    experience = hand_made_experience(algorithm)
    costs = algorithm.learn(experience)
    assert set(costs) == {
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_fraction",
        "policy_lag",
        "importance_weight",
        "importance_weight_truncated",
    }
    assert all(math.isfinite(value) for value in costs.values())
    assert algorithm.steps_seen == 24
    assert any(not torch.equal(a, b) for a, b in zip(before, algorithm.model.parameters()))


def test_the_importance_weights_are_taken_against_the_stored_log_probabilities_not_recomputed_ones():
    algorithm = make_algorithm()
    experience = hand_made_experience(algorithm)
    # The behaviour policy gave each action 0.4; the untrained policy gives either action about 0.5, so each
    # weight is about 1.25, where weights recomputed at learn time would all be 1.
    experience.actions["log_prob"] = torch.full_like(experience.actions["log_prob"], math.log(0.4))

    costs = algorithm.learn(experience)

    assert costs["importance_weight"] == pytest.approx(1.25, rel=0.01)
    assert costs["importance_weight_truncated"] > 0.9


def test_the_checkpoint_keeps_the_counters_and_the_input_statistics():
    algorithm = make_algorithm()
    algorithm.learn(hand_made_experience(algorithm))
    restored = make_algorithm()
    restored.load_state_dict(algorithm.state_dict())
    assert restored.steps_seen == 24
    torch.testing.assert_close(restored.model.obs_norm.mean, algorithm.model.obs_norm.mean)


@pytest.mark.parametrize("bad", [{"lr": 0.0}, {"gamma": 1.5}, {"minibatch_sequences": 0}, {"anneal_steps": 0}])
def test_a_bad_config_raises_config_error(bad):
    with pytest.raises(ConfigError):
        RecurrentPPOConfig(**bad)


def test_the_no_velocity_cartpole_shows_position_and_angle_only():
    env = gym.make(CARTPOLE_NO_VELOCITY_ENTRY)
    full = gym.make("CartPole-v1")
    assert env.observation_space.shape == (2,) and env.spec.max_episode_steps == 500
    obs, _ = env.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    np.testing.assert_array_equal(obs, full_obs[[0, 2]])
    for action in [0, 1, 1, 0, 1]:
        obs, reward, terminated, truncated, _ = env.step(action)
        full_obs, full_reward, *_ = full.step(action)
        assert obs.shape == (2,) and obs in env.observation_space
        np.testing.assert_array_equal(obs, full_obs[[0, 2]])
        assert reward == full_reward


def test_the_no_velocity_id_is_registered_once_imported():
    assert gym.make(CARTPOLE_NO_VELOCITY).observation_space.shape == (2,)


def test_the_env_module_does_not_import_torch():
    # Agent processes import it (through gymnasium's "module:id" form) and must stay small.
    check = "import sys, flare2.zoo.envs; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", check], timeout=60).returncode == 0


def test_sequences_replayed_from_a_buffer_unroll_to_the_states_the_agent_carried_while_acting():
    # A recurrent learner from replay starts each sampled sequence from its stored first state and resets at the
    # episode ends inside it; the states after each step must then be those the agent carried into the next one.
    from flare2.core.replay import ExpReplayHelper
    from flare2.core.specs import CTSpecs

    torch.manual_seed(0)
    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    model = GRUActorCritic(space, gym.spaces.Discrete(2), hidden_size=4, head=())
    specs = CTSpecs(
        inputs=model.input_specs(),
        actions=model.action_specs(),
        states=model.state_specs(),
        rewards=model.reward_specs(),
    )

    class Port:
        def learn(self, payload):
            raise AssertionError("no learn request expected: the sample interval is never reached")

    replay = ExpReplayHelper(capacity=200, warmup=10, sample_interval=10**9, batch_size=8, sequence_length=6, seed=0)
    replay.attach("RL", specs, Port(), num_envs=2)
    rng = np.random.default_rng(0)
    hidden = np.zeros((2, 8), np.float32)
    with torch.no_grad():
        for t in range(60):
            obs = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
            _, _, next_hidden = model.step(torch.from_numpy(obs), torch.from_numpy(hidden))
            ended = np.array([t % 7 == 6, t % 11 == 10])
            replay.store(
                {
                    "inputs": {"obs": obs},
                    "next_inputs": {"obs": obs},
                    "actions": {"action": np.zeros(2, np.int64), "log_prob": np.zeros(2, np.float32)},
                    "rewards": {"reward": np.zeros(2, np.float32)},
                    "states": {"hidden": hidden},
                    "terminated": ended & (np.arange(2) == 0),
                    "truncated": ended & (np.arange(2) == 1),
                    "policy_version": np.zeros(2, np.int64),
                }
            )
            hidden = np.where(ended[:, None], 0.0, next_hidden.numpy()).astype(np.float32)

        sample = received(specs, replay.sample(32))
        ends = torch.from_numpy(sample["terminated"] | sample["truncated"])
        assert ends[:, :-1].any(), "the samples should cross episode ends"
        stored = torch.from_numpy(sample["states"]["hidden"])
        _, _, after = model.sequence(torch.from_numpy(sample["inputs"]["obs"]), stored[:, 0], ends)
    # The state after step t is the stored state of step t + 1, except after an episode end (then the agent reset).
    carried = torch.where(ends[:, :-1, None], torch.zeros_like(after[:, :-1]), after[:, :-1])
    torch.testing.assert_close(carried, stored[:, 1:], atol=1e-5, rtol=1e-5)
