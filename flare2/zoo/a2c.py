"""A2C: synchronous advantage actor-critic with n-step returns.

Each learn() call receives B sequences of T steps (one per agent, from the
online helper), computes n-step returns that bootstrap from the value of the
observation after the sequence (or after a time-limit truncation, never after
a termination), and takes one gradient step on

    policy loss  + value_coef * value loss  - entropy_coef * entropy.
"""

from __future__ import annotations

import gymnasium as gym
import torch
from torch.nn import functional as F

from flare2.core.algorithm import Algorithm, Experience, Tensors, adam
from flare2.zoo.models import ActorCritic
from flare2.zoo.record import ActorCriticSettings
from flare2.zoo.records.a2c import A2CConfig
from flare2.zoo.returns import n_step_returns


class A2C(Algorithm):
    model: ActorCritic
    may_learn_in_own_process = True

    def __init__(self, model: ActorCritic, config: A2CConfig = A2CConfig()) -> None:
        super().__init__(model, max_grad_norm=config.max_grad_norm)
        self.config = config
        if config.optimizer == "rmsprop":
            self.optimizer = torch.optim.RMSprop(model.parameters(), lr=config.lr, alpha=0.99, eps=1e-5, foreach=True)
        else:
            self.optimizer = adam(model.parameters(), config.lr)

    def predict(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        return {"action": self.model.sample(self.model.policy(inputs))}, {}

    def predict_greedy(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        return {"action": self.model.best_action(self.model.policy(inputs))}, {}

    def learn(self, experience: Experience) -> dict[str, float]:
        config = self.config
        inputs = experience.inputs
        rewards = experience.rewards["reward"]
        policy, values = self.model.policy_and_value(inputs)
        next_values = experience.next_values(self.model.value, values)
        with torch.no_grad():
            returns = n_step_returns(rewards, next_values, experience.terminated, experience.truncated, config.gamma)
        advantages = (returns - values).detach()
        if config.normalize_advantages and advantages.numel() > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        log_prob, entropy = self.model.log_prob_and_entropy(policy, experience.actions["action"])
        policy_loss = -(log_prob * advantages).mean()
        value_loss = F.mse_loss(values, returns)
        entropy_mean = entropy.mean()
        loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy_mean
        grad_norm = self.optimize(loss)
        costs = {
            "loss": loss.item(),
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy_mean.item(),
        }
        return costs if grad_norm is None else {**costs, "grad_norm": grad_norm}


def build(env: gym.Env, config: A2CConfig, settings: ActorCriticSettings) -> A2C:
    """A2C with the zoo's MLP actor-critic for ``env``, as ``flare2 train --algo a2c`` builds it."""
    return A2C(ActorCritic(env.observation_space, env.action_space, **settings.model_kwargs(env)), config)
