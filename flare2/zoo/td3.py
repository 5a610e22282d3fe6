"""TD3: a deterministic actor and two Q critics for Box actions (Fujimoto et al., 2018).

Experiences come from the agents' replay buffers (``ExpReplayHelper``), as in
DQN: each learn() call gets N sampled transitions ``[N, 1, ...]`` and takes one
gradient step per ``minibatch_size`` of them. Every step updates both critics
towards one target, ``r + gamma * (1 - terminated) * min(Q1', Q2')(s', a')``,
where ``a'`` is the target actor's action plus clipped Gaussian noise (target
policy smoothing). Every ``policy_delay`` steps the actor climbs Q1 and the
target networks follow the online ones by Polyak averaging. A terminated step
has no bootstrap; a time-limit truncation (Pendulum ends every episode so)
bootstraps from the final observation.

The actor and the critics have their own Adam optimizers, each stepped
through ``Algorithm.optimize(loss, optimizer)``; they, the target networks and
the checkpoint are ``TwinCriticAlgorithm``'s, which SAC shares. Noise scales
are fractions of the half width of the action box, so the same config fits any
bounds.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import gymnasium as gym
import torch
from torch.nn import functional as F

from flare2.core.algorithm import Algorithm, Experience, Tensors, adam, polyak_update
from flare2.core.data_parallel import minibatch_share
from flare2.zoo.models import BoxActorCritic
from flare2.zoo.record import ReplaySettings
from flare2.zoo.records.td3 import TD3Config


class ActorCritic(BoxActorCritic):
    """A tanh actor scaled to the Box action bounds and two Q critics over (``obs``, action)."""

    def __init__(
        self, observation_space: gym.Space, action_space: gym.Space, hidden: tuple[int, ...] = (256, 256)
    ) -> None:
        super().__init__(observation_space, action_space, hidden=hidden, outputs_per_action=1, algorithm="TD3")

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action, inside the bounds."""
        return self.to_box(torch.tanh(self.actor(self.features(obs))))


class TwinCriticAlgorithm(Algorithm):
    """What TD3 and SAC share: an actor and two critics (a ``BoxActorCritic``) with a frozen copy as the target
    networks, an Adam optimizer for the actor and one for the critics, and a count of gradient steps, all of them
    in the checkpoint. ``transitions`` reads the sampled transitions of a learn() call."""

    model: BoxActorCritic

    def __init__(
        self, model: BoxActorCritic, *, actor_lr: float, critic_lr: float, max_grad_norm: float | None
    ) -> None:
        super().__init__(model, max_grad_norm=max_grad_norm)
        self.target = copy.deepcopy(model).requires_grad_(False)
        self.actor_optimizer = adam(model.actor.parameters(), actor_lr)
        self.critic_optimizer = adam(model.critic_parameters(), critic_lr)
        self.gradient_steps = 0

    @contextlib.contextmanager
    def critics_as_constants(self) -> Iterator[None]:
        """The critics' weights as constants of the losses built inside: the actor's loss passes its gradient
        through the critics to the action, and the backward pass then skips the gradients of the critics' own
        weights, which the actor's step would throw away: 11.4 ms against 12.1 ms a SAC gradient step of 256-256
        networks over 256 transitions, on one core."""
        parameters = self.model.critic_parameters()
        learning = [parameter.requires_grad for parameter in parameters]
        for parameter in parameters:
            parameter.requires_grad_(False)
        try:
            yield
        finally:
            # As they were: a weight its user froze stays frozen.
            for parameter, was_learning in zip(parameters, learning):
                parameter.requires_grad_(was_learning)

    @staticmethod
    def transitions(
        experience: Experience,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``obs, actions, rewards, next_obs, terminated`` of the ``[N, 1, ...]`` transitions, each as ``[N, ...]``."""
        return (
            experience.inputs["obs"].flatten(0, 1),
            experience.actions["action"].flatten(0, 1),
            experience.rewards["reward"].flatten(0, 1),
            experience.next_inputs["obs"].flatten(0, 1),
            experience.terminated.flatten(0, 1),
        )

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "target": self.target.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "gradient_steps": self.gradient_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.target.load_state_dict(state["target"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.gradient_steps = int(state["gradient_steps"])


class TD3(TwinCriticAlgorithm):
    model: ActorCritic

    def __init__(self, model: ActorCritic, config: TD3Config = TD3Config()) -> None:
        super().__init__(
            model, actor_lr=config.actor_lr, critic_lr=config.critic_lr, max_grad_norm=config.max_grad_norm
        )
        self.config = config
        self.predicted = 0

    @classmethod
    def for_env(cls, env: gym.Env, config: TD3Config = TD3Config()) -> TD3:
        return cls(ActorCritic(env.observation_space, env.action_space, config.hidden), config)

    def _clip(self, action: torch.Tensor) -> torch.Tensor:
        model = self.model
        return action.clamp(model.action_bias - model.action_scale, model.action_bias + model.action_scale)

    def predict(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        model, config = self.model, self.config
        action = model(inputs["obs"])
        action = self._clip(action + config.exploration_noise * model.action_scale * torch.randn_like(action))
        # The first random_steps rows (counted over all agents) explore uniformly inside the box.
        action = model.uniform_first_rows(action, self.predicted, config.random_steps)
        self.predicted += action.shape[0]
        return {"action": action}, {}

    def predict_greedy(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        return {"action": self.model(inputs["obs"])}, {}

    def critic_target(self, rewards: torch.Tensor, next_obs: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
        """``r + gamma * min(Q1', Q2')(s', smoothed a')``, without the bootstrap term after a terminated step."""
        config, target = self.config, self.target
        with torch.no_grad():
            next_action = target(next_obs)
            limit = config.noise_clip * target.action_scale
            noise = (config.policy_noise * target.action_scale * torch.randn_like(next_action)).clamp(-limit, limit)
            next_q = torch.minimum(*target.q_values(next_obs, self._clip(next_action + noise)))
            return rewards + config.gamma * (~terminated).float() * next_q

    def learn(self, experience: Experience) -> dict[str, float]:
        config, model = self.config, self.model
        obs, actions, rewards, next_obs, terminated = self.transitions(experience)
        critic_losses, actor_losses, q_means = [], [], []
        for index in torch.randperm(obs.shape[0], device=obs.device).split(minibatch_share(config.minibatch_size)):
            target = self.critic_target(rewards[index], next_obs[index], terminated[index])
            q1, q2 = model.q_values(obs[index], actions[index])
            critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
            self.optimize(critic_loss, self.critic_optimizer)
            critic_losses.append(critic_loss.item())
            q_means.append(q1.mean().item())
            self.gradient_steps += 1
            if self.gradient_steps % config.policy_delay == 0:
                with self.critics_as_constants():
                    actor_loss = -model.first_q_value(obs[index], model(obs[index])).mean()
                self.optimize(actor_loss, self.actor_optimizer)
                actor_losses.append(actor_loss.item())
                polyak_update(self.target, model, config.tau)
        costs = {"critic_loss": sum(critic_losses) / len(critic_losses), "q_mean": sum(q_means) / len(q_means)}
        if actor_losses:
            costs["actor_loss"] = sum(actor_losses) / len(actor_losses)
        return costs

    def state_dict(self) -> dict:
        return {**super().state_dict(), "predicted": self.predicted}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.predicted = int(state["predicted"])


def build(env: gym.Env, config: TD3Config, settings: ReplaySettings) -> TD3:
    """TD3 for ``env`` as ``flare2 train --algo td3`` builds it (its network sizes are the config's)."""
    return TD3.for_env(env, config)
