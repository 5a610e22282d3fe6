"""SAC: a squashed-Gaussian actor, two Q critics and a tuned entropy coefficient (Haarnoja et al., 2018).

"Soft Actor-Critic Algorithms and Applications" (arXiv:1812.05905), as in
Stable-Baselines3. Experiences come from the agents' replay buffers
(``ExpReplayHelper``), as for TD3: each learn() call gets N sampled
transitions ``[N, 1, ...]`` and takes one gradient step per
``minibatch_size`` of them (the target networks, the optimizers of the actor
and of the critics and the checkpoint are ``TwinCriticAlgorithm``'s, shared
with TD3). Each step, in the paper's order:

1. both critics towards ``r + gamma * (1 - terminated) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s'))``,
   ``a'`` drawn from the current actor and ``Q'`` the target critics. A terminated step has no bootstrap term; a
   time-limit truncation (Pendulum ends every episode so) bootstraps from the final observation;
2. the actor down ``alpha * log pi(a|s) - min(Q1, Q2)(s, a)``, ``a`` drawn with the reparameterisation trick;
3. ``log alpha`` down ``-log alpha * (log pi(a|s) + target_entropy)``: alpha grows while the policy's entropy is
   below the target and shrinks while it is above (not with ``fixed_alpha``);
4. the target critics follow the online ones by Polyak averaging.

An action is ``tanh(u)``, ``u`` Gaussian, scaled to the box. Its
log-probability is that of ``tanh(u)`` in ``[-1, 1]`` per dimension (as
SB3's): the default target entropy, minus the number of action dimensions,
means the same whatever the bounds. The actor, the critics and ``log alpha``
have their own Adam optimizers, each stepped through
``Algorithm.optimize(loss, optimizer)``.
"""

from __future__ import annotations

import math

import gymnasium as gym
import torch
from torch import nn
from torch.nn import functional as F

from flare2.core.algorithm import Experience, Tensors, adam, polyak_update
from flare2.core.data_parallel import minibatch_share
from flare2.zoo.models import BoxActorCritic
from flare2.zoo.record import ReplaySettings
from flare2.zoo.records.sac import SACConfig
from flare2.zoo.td3 import TwinCriticAlgorithm

# The bounds of the actor's log standard deviation, as in the paper's code and SB3: wide enough for any policy,
# narrow enough that exp() neither vanishes nor overflows.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def squashed_log_prob(pre_tanh: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """``log pi(tanh(u))`` for ``u = pre_tanh`` drawn from ``N(mean, exp(log_std))``, summed over the last dimension.

    The Gaussian's log-density minus ``log(1 - tanh(u)^2)``, the change of variables of the tanh, written as
    ``2 * (log 2 - u - softplus(-2u))``: the same value, finite where tanh rounds to 1.
    """
    gaussian = -0.5 * ((pre_tanh - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    log_det = 2 * (math.log(2) - pre_tanh - F.softplus(-2 * pre_tanh))
    return (gaussian - log_det).sum(-1)


class SquashedGaussianActorCritic(BoxActorCritic):
    """An actor giving the mean and log standard deviation of a Gaussian per action dimension, whose draws a tanh
    squashes into the box, and two Q critics over (``obs``, action)."""

    def __init__(
        self, observation_space: gym.Space, action_space: gym.Space, hidden: tuple[int, ...] = (256, 256)
    ) -> None:
        super().__init__(observation_space, action_space, hidden=hidden, outputs_per_action=2, algorithm="SAC")

    def gaussian(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and the (clamped) log standard deviation of the Gaussian before the tanh."""
        mean, log_std = self.actor(self.features(obs)).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The greedy action: the squashed mean, inside the bounds."""
        return self.to_box(torch.tanh(self.gaussian(obs)[0]))

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """An action drawn from the policy, inside the bounds, and its log-probability (``squashed_log_prob``);
        reparameterised, so gradients flow through both to the actor."""
        mean, log_std = self.gaussian(obs)
        pre_tanh = mean + log_std.exp() * torch.randn_like(mean)
        return self.to_box(torch.tanh(pre_tanh)), squashed_log_prob(pre_tanh, mean, log_std)


class EntropyCoefficient(nn.Module):
    """``log alpha`` as a parameter: learned in log space, so alpha stays positive."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha)))

    def forward(self) -> torch.Tensor:
        """alpha, without gradient: the weight of the entropy in the critic and actor losses."""
        return self.log_alpha.detach().exp()


class SAC(TwinCriticAlgorithm):
    model: SquashedGaussianActorCritic

    # predict() and learn() share the networks only: the count of predicted rows is predict's alone (see
    # state_dict), so learn() may run in a learner process.
    may_learn_in_own_process = True

    def __init__(self, model: SquashedGaussianActorCritic, config: SACConfig = SACConfig()) -> None:
        # Of the target networks, only the critics are used (the current actor draws a') and follow the online ones.
        super().__init__(model, actor_lr=config.lr, critic_lr=config.lr, max_grad_norm=config.max_grad_norm)
        self.config = config
        if config.fixed_alpha is None:
            self.alpha = EntropyCoefficient(config.initial_alpha)
            self.alpha_optimizer: torch.optim.Optimizer | None = adam(self.alpha.parameters(), config.lr)
        else:
            self.alpha, self.alpha_optimizer = EntropyCoefficient(config.fixed_alpha), None
        action_dims = len(model.action_scale)
        self.target_entropy = -float(action_dims) if config.target_entropy is None else config.target_entropy
        self.predicted = 0

    @classmethod
    def for_env(cls, env: gym.Env, config: SACConfig = SACConfig()) -> SAC:
        return cls(SquashedGaussianActorCritic(env.observation_space, env.action_space, config.hidden), config)

    def predict(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        model = self.model
        action, _ = model.sample(inputs["obs"])
        # The first random_steps rows (counted over all agents) explore uniformly inside the box.
        action = model.uniform_first_rows(action, self.predicted, self.config.random_steps)
        self.predicted += action.shape[0]
        return {"action": action}, {}

    def predict_greedy(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        return {"action": self.model(inputs["obs"])}, {}

    def critic_target(self, rewards: torch.Tensor, next_obs: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
        """``r + gamma * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s'))`` with ``a'`` drawn from the current actor,
        without the bootstrap term after a terminated step."""
        with torch.no_grad():
            next_action, next_log_prob = self.model.sample(next_obs)
            next_q = torch.minimum(*self.target.q_values(next_obs, next_action)) - self.alpha() * next_log_prob
            return rewards + self.config.gamma * (~terminated).float() * next_q

    def learn(self, experience: Experience) -> dict[str, float]:
        config, model = self.config, self.model
        obs, actions, rewards, next_obs, terminated = self.transitions(experience)
        costs: dict[str, list[torch.Tensor]] = {
            name: [] for name in ("critic_loss", "actor_loss", "alpha", "entropy", "q_mean")
        }
        for index in torch.randperm(obs.shape[0], device=obs.device).split(minibatch_share(config.minibatch_size)):
            alpha = self.alpha()
            target = self.critic_target(rewards[index], next_obs[index], terminated[index])
            q1, q2 = model.q_values(obs[index], actions[index])
            critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
            self.optimize(critic_loss, self.critic_optimizer)
            action, log_prob = model.sample(obs[index])
            with self.critics_as_constants():
                actor_loss = (alpha * log_prob - torch.minimum(*model.q_values(obs[index], action))).mean()
            self.optimize(actor_loss, self.actor_optimizer)
            if self.alpha_optimizer is not None:
                alpha_loss = -(self.alpha.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
                self.optimize(alpha_loss, self.alpha_optimizer)
            polyak_update(self.target.q1, model.q1, config.tau)
            polyak_update(self.target.q2, model.q2, config.tau)
            self.gradient_steps += 1
            for name, value in zip(costs, (critic_loss, actor_loss, alpha, -log_prob.mean(), q1.mean())):
                costs[name].append(value.detach())
        # One transfer from the device for all of them.
        means = torch.stack([torch.stack(values).mean() for values in costs.values()]).tolist()
        return dict(zip(costs, means))

    def state_dict(self) -> dict:
        # Not the count of predicted rows: with a learner process, the checkpoint comes from an algorithm that never
        # predicts. A resumed run's agents start with empty buffers, and explore uniformly again while they fill.
        state = {**super().state_dict(), "alpha": self.alpha.state_dict()}
        if self.alpha_optimizer is not None:
            state["alpha_optimizer"] = self.alpha_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.alpha.load_state_dict(state["alpha"])
        if self.alpha_optimizer is not None and "alpha_optimizer" in state:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])


def build(env: gym.Env, config: SACConfig, settings: ReplaySettings) -> SAC:
    """SAC for ``env`` as ``flare2 train --algo sac`` builds it (its network sizes are the config's)."""
    return SAC.for_env(env, config)
