"""APPO: PPO's clipped objective on experience played by older weights, with V-trace in place of GAE.

The agents never wait for ``learn()`` (``learn_ahead`` 2), so each learn() batch was played by weights one or more
updates old (``Experience.policy_lag``). APPO corrects for it as IMPALA does: the ratio of the clipped objective is
``π_θ/μ`` with ``μ`` the behaviour policy's log-probability stored at acting time (the action output ``log_prob``,
never recomputed), and the advantages and value targets are V-trace's (``flare2.zoo.returns.vtrace``), whose
importance weights ``π/μ`` are those of the weights learn() starts from, truncated at ``rho_bar`` and ``c_bar``.
Everything else is PPO's: the model, the epochs of minibatches, the advantages standardised per minibatch.

Besides PPO's costs, learn() reports how far off-policy its batch was: ``policy_lag`` (the mean lag of the steps),
``importance_weight`` (the mean ``π/μ``) and ``importance_weight_truncated`` (the fraction above ``rho_bar``).
"""

from __future__ import annotations

import gymnasium as gym
import torch

from flare2.core.algorithm import Experience
from flare2.zoo.ppo import PPO, PPOActorCritic, importance_weights
from flare2.zoo.record import ActorCriticSettings
from flare2.zoo.records.appo import APPOConfig
from flare2.zoo.returns import vtrace


class APPO(PPO):
    config: APPOConfig

    # An agent sends its next learn request while the one before is learned and may have a third on its way before
    # it waits: it plays on through one slow learn() (an update of many epochs, or a learner busy with other agents'
    # batches), and the lag stays at one or two updates, which the truncated weights correct without cutting most
    # of them. More would buy little (an agent must wait anyway where learn() is slower than acting) and the CDP
    # holds at most 4 requests per agent.
    learn_ahead = 2

    def __init__(self, model: PPOActorCritic, config: APPOConfig = APPOConfig()) -> None:
        super().__init__(model, config)

    def learn(self, experience: Experience) -> dict[str, float]:
        config, model = self.config, self.model
        shape = experience.terminated.shape
        with torch.no_grad():
            batch = self.learning_batch(experience)
            inputs, actions, behaviour_log_prob = batch.inputs, batch.actions, batch.behaviour_log_prob
            target_log_prob, values = batch.current_log_prob, batch.values
            advantages, targets = vtrace(
                experience.rewards["reward"],
                values,
                experience.next_values(model.value, values),
                experience.terminated,
                experience.truncated,
                behaviour_log_prob.reshape(shape),
                target_log_prob.reshape(shape),
                config.gamma,
                config.gae_lambda,
                config.rho_bar,
                config.c_bar,
            )
            _, off_policy = importance_weights(experience, target_log_prob, behaviour_log_prob, config.rho_bar)
        self.count_steps(advantages.numel(), config)
        return {**self.clipped_epochs(inputs, actions, behaviour_log_prob, advantages, targets), **off_policy}


def build(env: gym.Env, config: APPOConfig, settings: ActorCriticSettings) -> APPO:
    """APPO for ``env`` as ``flare2 train --algo appo`` builds it."""
    return APPO(PPOActorCritic(env.observation_space, env.action_space, **settings.model_kwargs(env)), config)
