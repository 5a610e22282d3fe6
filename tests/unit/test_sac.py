"""SAC: squashed actions inside the box, their log-probabilities, the soft critic target, the entropy tuning and the
checkpoint."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from flare2.commands.train import resolve
from flare2.core.algorithm import Experience
from flare2.errors import ConfigError
from flare2.zoo.sac import SAC, SACConfig, squashed_log_prob

OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
ACTIONS = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
LOW, HIGH = torch.tensor(ACTIONS.low), torch.tensor(ACTIONS.high)


class Env:
    """Just the spaces ``for_env`` reads."""

    observation_space = OBS
    action_space = ACTIONS


def sac(**config) -> SAC:
    torch.manual_seed(0)
    return SAC.for_env(Env(), SACConfig(**{"hidden": (16, 16), "minibatch_size": 8, **config}))


def experience(count: int = 32, *, terminated: bool = False, truncated: bool = False) -> Experience:
    generator = torch.Generator().manual_seed(1)
    return Experience(
        inputs={"obs": torch.randn(count, 1, 3, generator=generator)},
        next_inputs={"obs": torch.randn(count, 1, 3, generator=generator)},
        actions={"action": LOW + (HIGH - LOW) * torch.rand(count, 1, 2, generator=generator)},
        rewards={"reward": -torch.rand(count, 1, generator=generator)},
        states={},
        terminated=torch.full((count, 1), terminated),
        truncated=torch.full((count, 1), truncated),
    )


def in_box(action: torch.Tensor) -> bool:
    return bool(((action >= LOW) & (action <= HIGH)).all())


def steer(algorithm: SAC, mean: float, log_std: float) -> None:
    """Make the actor give the same Gaussian for every observation."""
    last = algorithm.model.actor[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([mean, mean, log_std, log_std]))


def test_predicted_actions_have_the_spec_shape_and_dtype_and_stay_inside_the_box_even_from_a_wide_gaussian():
    algorithm = sac()
    steer(algorithm, mean=0.0, log_std=2.0)
    spec = algorithm.model.action_specs()["action"]
    with torch.inference_mode():
        actions, states = algorithm.predict({"obs": 8 * torch.randn(256, 3)}, {})
    action = actions["action"]
    assert states == {} and spec.shape == (2,) and spec.dtype == "float32"
    assert action.shape == (256, 2) and action.dtype == torch.float32
    assert in_box(action)
    # A wide Gaussian squashed by the tanh piles up near both bounds of each dimension.
    assert (action[:, 0] < -1.9).any() and (action[:, 0] > 1.9).any() and (action[:, 1] > 0.95).any()


def test_the_first_random_steps_rows_are_uniform_over_the_box_and_the_actor_takes_over_after():
    algorithm = sac(random_steps=100)
    steer(algorithm, mean=3.0, log_std=-20.0)  # the actor plays tanh(3), near the upper bounds, every time
    obs = torch.zeros(60, 3)
    with torch.inference_mode():
        first = algorithm.predict({"obs": obs}, {})[0]["action"]
        second = algorithm.predict({"obs": obs}, {})[0]["action"]
    actor = algorithm.model.to_box(torch.full((2,), math.tanh(3.0)))
    assert in_box(first) and in_box(second) and first.std(0).min() > 0.2
    assert torch.allclose(second[40:], actor.expand(20, 2)) and not torch.isclose(second[:40], actor).all(-1).any()
    assert algorithm.predicted == 120


def test_the_greedy_action_is_the_squashed_mean_and_has_no_noise():
    algorithm = sac()
    obs = torch.randn(16, 3)
    with torch.inference_mode():
        once, states = algorithm.predict_greedy({"obs": obs}, {})
        twice, _ = algorithm.predict_greedy({"obs": obs}, {})
        sampled, _ = algorithm.predict({"obs": obs}, {})
        mean, _ = algorithm.model.gaussian(obs)
    assert states == {} and torch.equal(once["action"], twice["action"]) and in_box(once["action"])
    assert torch.allclose(once["action"], algorithm.model.to_box(torch.tanh(mean)))
    assert not torch.allclose(once["action"], sampled["action"])


def test_the_log_probability_is_the_density_of_the_squashed_gaussian_by_finite_differences_of_its_cdf():
    # For y = tanh(u), u ~ N(mean, std): P(Y <= y) = Phi((atanh(y) - mean) / std); its slope is the density.
    mean, log_std = torch.tensor([0.3], dtype=torch.float64), torch.tensor([-0.4], dtype=torch.float64)
    normal = torch.distributions.Normal(mean, log_std.exp())
    step = 1e-6
    for y in (-0.99, -0.5, 0.0, 0.4, 0.95):
        cdf = [normal.cdf(torch.atanh(torch.tensor([y + d], dtype=torch.float64))) for d in (-step, step)]
        density = float((cdf[1] - cdf[0]) / (2 * step))
        log_prob = squashed_log_prob(torch.atanh(torch.tensor([y], dtype=torch.float64)), mean, log_std)
        assert float(log_prob.exp()) == pytest.approx(density, rel=1e-5), y


def test_a_sampled_action_comes_with_the_log_probability_of_its_squashed_draw_summed_over_dimensions():
    algorithm = sac()
    steer(algorithm, mean=0.2, log_std=-0.5)
    obs = torch.randn(64, 3)
    with torch.no_grad():
        action, log_prob = algorithm.model.sample(obs)
        mean, log_std = algorithm.model.gaussian(obs)
    squashed = (action - algorithm.model.action_bias) / algorithm.model.action_scale
    squashed = squashed.double().clamp(-1 + 1e-7, 1 - 1e-7)
    expected = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean.double(), log_std.double().exp()), [torch.distributions.TanhTransform()]
    ).log_prob(squashed)
    assert torch.allclose(log_prob.double(), expected.sum(-1), atol=1e-3)
    # Far out where tanh rounds to 1 in float32, the log-probability stays finite.
    saturated = squashed_log_prob(torch.tensor([30.0]), torch.tensor([30.0]), torch.tensor([0.0]))
    assert torch.isfinite(saturated).all()


def test_the_critic_target_bootstraps_with_the_entropy_term_after_a_truncated_step_and_not_after_a_terminated_one():
    algorithm = sac(gamma=0.9, fixed_alpha=0.5)
    rewards = torch.tensor([-1.0, -2.0])
    next_obs = torch.randn(2, 3)
    terminated = torch.tensor([True, False])  # the second row was truncated by a time limit
    torch.manual_seed(3)
    with torch.no_grad():
        next_action, next_log_prob = algorithm.model.sample(next_obs)
        next_q = torch.minimum(*algorithm.target.q_values(next_obs, next_action))
    torch.manual_seed(3)
    target = algorithm.critic_target(rewards, next_obs, terminated)
    assert target[0] == -1.0
    assert target[1] == pytest.approx(float(-2.0 + 0.9 * (next_q[1] - 0.5 * next_log_prob[1])), abs=1e-6)
    assert abs(float(0.5 * next_log_prob[1])) > 1e-3


def test_learning_from_terminated_steps_differs_from_learning_from_truncated_ones():
    outcomes = []
    for flags in ({"terminated": True}, {"truncated": True}):
        algorithm = sac()
        torch.manual_seed(2)
        algorithm.learn(experience(32, **flags))
        outcomes.append(torch.cat([p.flatten() for p in algorithm.model.q1.parameters()]))
    assert not torch.equal(*outcomes)


def test_learn_returns_finite_costs_and_moves_the_actor_the_critics_alpha_and_the_target_critics_only():
    algorithm = sac()
    before = {name: p.clone() for name, p in algorithm.model.named_parameters()}
    target_before = {name: p.clone() for name, p in algorithm.target.named_parameters()}
    costs = algorithm.learn(experience(32))
    assert set(costs) == {"critic_loss", "actor_loss", "alpha", "entropy", "q_mean"}
    assert all(math.isfinite(value) for value in costs.values())
    assert algorithm.gradient_steps == 4  # 32 transitions, minibatches of 8
    changed = {name.split(".")[0] for name, p in algorithm.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed == {"actor", "q1", "q2"}
    moved = {
        name.split(".")[0] for name, p in algorithm.target.named_parameters() if not torch.equal(p, target_before[name])
    }
    assert moved == {"q1", "q2"}
    # The entropy (about 1.3 nats) is above its target (-2): alpha fell from 1 at each step.
    assert float(algorithm.alpha()) < costs["alpha"] < 1.0


@pytest.mark.parametrize("target_entropy, direction", [(-4.0, -1), (4.0, 1)])
def test_alpha_falls_while_the_entropy_is_above_its_target_and_rises_while_it_is_below(target_entropy, direction):
    # Two action dims in [-1, 1] have at most 2 log 2 = 1.39 nats: -4 is below the policy's entropy, 4 above.
    algorithm = sac(target_entropy=target_entropy, lr=1e-2)
    alphas = [algorithm.learn(experience(32))["alpha"] for _ in range(5)]
    assert all(direction * (later - earlier) > 0 for earlier, later in zip(alphas, alphas[1:])), alphas


def test_the_target_entropy_is_minus_the_action_dimensions_by_default_and_a_fixed_alpha_stays_put():
    assert sac().target_entropy == -2.0
    algorithm = sac(fixed_alpha=0.2)
    costs = [algorithm.learn(experience(32)) for _ in range(2)]
    assert algorithm.alpha_optimizer is None
    assert [cost["alpha"] for cost in costs] == pytest.approx([0.2, 0.2]) and float(algorithm.alpha()) == pytest.approx(
        0.2
    )


def test_a_checkpoint_restores_everything_learning_uses_so_both_copies_learn_alike():
    algorithm = sac()
    algorithm.learn(experience(32))
    restored = sac()
    # A deep copy, as a checkpoint file is: an optimizer loads its moments without copying them.
    restored.load_state_dict(copy.deepcopy(algorithm.state_dict()))
    assert restored.gradient_steps == 4
    for module in ("model", "target", "alpha"):
        for a, b in zip(getattr(algorithm, module).parameters(), getattr(restored, module).parameters()):
            assert torch.equal(a, b), module
    # The next update is the same for both: the optimizers' moments came back too.
    results = []
    for learner in (algorithm, restored):
        torch.manual_seed(5)
        results.append(
            (learner.learn(experience(16)), [p.clone() for p in learner.model.parameters()], learner.alpha())
        )
    assert results[0][0] == results[1][0] and torch.equal(results[0][2], results[1][2])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_the_count_of_uniform_rows_stays_with_the_acting_side_and_out_of_the_checkpoint():
    algorithm = sac(random_steps=10)
    with torch.inference_mode():
        algorithm.predict({"obs": torch.zeros(4, 3)}, {})
    assert "predicted" not in algorithm.state_dict() and SAC.may_learn_in_own_process


@pytest.mark.parametrize(
    "field, value",
    [
        ("lr", 0.0),
        ("gamma", 1.5),
        ("tau", 0.0),
        ("minibatch_size", 0),
        ("random_steps", -1),
        ("hidden", ()),
        ("initial_alpha", 0.0),
        ("fixed_alpha", -0.1),
        ("target_entropy", float("nan")),
        ("max_grad_norm", 0.0),
    ],
)
def test_a_bad_config_value_is_a_config_error_that_names_it(field, value):
    with pytest.raises(ConfigError, match=field):
        SACConfig(**{field: value})


@pytest.mark.parametrize(
    "action_space, says",
    [(gym.spaces.Discrete(3), "Box action"), (gym.spaces.Box(-np.inf, np.inf, (2,)), "bounded 1-d Box")],
)
def test_an_action_space_sac_does_not_take_is_a_config_error(action_space, says):
    class OtherEnv:
        observation_space = OBS

    OtherEnv.action_space = action_space
    with pytest.raises(ConfigError, match=says):
        SAC.for_env(OtherEnv(), SACConfig())


def test_flare2_train_takes_the_rl_zoo_pendulum_preset_and_explores_uniformly_through_the_warmup(tmp_path):
    plan = resolve(["--env", "Pendulum-v1", "--algo", "sac", "--log-dir", str(tmp_path)])
    assert (plan.config.lr, plan.config.random_steps, plan.config.hidden) == (1e-3, 100, (256, 256))
    assert plan.run.max_steps == 20_000
    replay = plan.run.agents.kwargs["replay"]
    # 8 agents, each sending 256 sampled transitions every step: one gradient step of 256 per env step.
    assert (replay["batch_size"], replay["sample_interval"], plan.config.minibatch_size) == (256, 1, 256)
    warm = resolve(["--env", "Pendulum-v1", "--algo", "sac", "--warmup", "800", "--log-dir", str(tmp_path)])
    assert warm.config.random_steps == 800
