"""Recurrent PPO: PPO with a GRU actor-critic, learning on whole sequences with states reset at episode ends.

Each learn() call receives B sequences of T steps (one per agent, from the
online helper) that may run across episode ends, with the GRU state the agent
had before each step. The advantages are computed once per call, under the
policy as it is then; every epoch then re-unrolls each minibatch of whole
sequences from its stored state at t = 0 (``flare2.zoo.recurrent``'s unroll,
which restarts from zeros after every episode end, as the agent did) and
backpropagates through the T steps. A truncated step, and the last step of a
sequence, bootstrap from the value of ``next_inputs`` seen from the state
after that step.
"""

from __future__ import annotations

import gymnasium as gym
import torch

from flare2.core.algorithm import Experience, Tensors
from flare2.core.data_parallel import minibatch_share
from flare2.errors import ConfigError
from flare2.zoo.ppo import CLIPPED_COSTS, ClippedObjective, CostSums, clipped_loss, importance_weights
from flare2.zoo.record import RecurrentSettings
from flare2.zoo.records.recurrent_ppo import RecurrentPPOConfig
from flare2.zoo.recurrent import GRUActorCritic
from flare2.zoo.returns import gae


class RecurrentPPO(ClippedObjective):
    model: GRUActorCritic

    def __init__(self, model: GRUActorCritic, config: RecurrentPPOConfig = RecurrentPPOConfig()) -> None:
        if not isinstance(model, GRUActorCritic):
            raise ConfigError(f"RecurrentPPO needs a GRUActorCritic model, got {type(model).__name__}")
        super().__init__(model, config)
        self.config = config

    @classmethod
    def for_env(
        cls,
        env: gym.Env,
        config: RecurrentPPOConfig = RecurrentPPOConfig(),
        *,
        hidden_size: int = 64,
        encoder: str = "auto",
    ) -> RecurrentPPO:
        """Recurrent PPO with the zoo's GRU actor-critic for ``env`` (a CNN under the GRUs for images)."""
        model = GRUActorCritic(env.observation_space, env.action_space, hidden_size=hidden_size, encoder=encoder)
        return cls(model, config)

    def predict(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        logits, _, next_hidden = self.model.step(inputs["obs"], states["hidden"])
        action = self.model.sample(logits)
        log_prob, _ = self.model.log_prob_and_entropy(logits, action)
        return {"action": action, "log_prob": log_prob}, {"hidden": next_hidden}

    def predict_greedy(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        logits, _, next_hidden = self.model.step(inputs["obs"], states["hidden"])
        action = self.model.best_action(logits)
        log_prob, _ = self.model.log_prob_and_entropy(logits, action)
        return {"action": action, "log_prob": log_prob}, {"hidden": next_hidden}

    def learn(self, experience: Experience) -> dict[str, float]:
        config, model = self.config, self.model
        obs, next_obs = experience.inputs["obs"], experience.next_inputs["obs"]
        ends = experience.episode_ends
        first_hidden = experience.states["hidden"][:, 0]
        actions, old_log_prob = experience.actions["action"], experience.actions["log_prob"]
        model.update_normalizer(obs, 2)
        with torch.no_grad():
            logits, values, hidden_after = model.sequence(obs, first_hidden, ends)
            proximal_log_prob, _ = model.log_prob_and_entropy(logits, actions)
            weights, off_policy = importance_weights(experience, proximal_log_prob, old_log_prob, config.rho_bar)
            advantages, targets = gae(
                experience.rewards["reward"],
                values,
                model.next_values(next_obs, hidden_after),
                experience.terminated,
                experience.truncated,
                config.gamma,
                config.gae_lambda,
            )
        self.count_steps(advantages.numel(), config)

        costs = CostSums(CLIPPED_COSTS)
        for _ in range(config.epochs):
            for index in torch.randperm(obs.shape[0], device=obs.device).split(
                minibatch_share(config.minibatch_sequences)
            ):
                logits, new_values, _ = model.sequence(obs[index], first_hidden[index], ends[index])
                log_prob, entropy = model.log_prob_and_entropy(logits, actions[index])
                self.optimize_on_device(
                    clipped_loss(
                        config,
                        costs,
                        log_prob,
                        proximal_log_prob[index],
                        advantages[index],
                        entropy,
                        new_values,
                        targets[index],
                        weights[index],
                    )
                )
        return {**costs.means(), **off_policy}


def build(env: gym.Env, config: RecurrentPPOConfig, settings: RecurrentSettings) -> RecurrentPPO:
    """Recurrent PPO for ``env`` as ``flare2 train --algo recurrent-ppo`` builds it."""
    return RecurrentPPO.for_env(env, config, hidden_size=settings.memory_size, encoder=settings.encoder)
