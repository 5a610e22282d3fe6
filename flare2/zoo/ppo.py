"""PPO: clipped surrogate objective, GAE, several epochs of minibatches in one learn() call.

Each learn() call receives B sequences of T steps (one per agent, from the
online helper). The model gives ``policy(inputs)``, ``value(inputs)``, both at
once (``policy_and_value``: one pass of a shared encoder), ``sample``/``best_action`` of a policy, and
``log_prob_and_entropy``: the zoo's actor-critic (MLPs or a CNN, with action
masks) or ``EntityActorCritic`` (per-entity and select-entity actions over
ragged entities).

The steps of a batch may have been played by weights older than those learn() starts from (a learner beside the
acting, ``Experience.policy_lag``). PPO keeps apart the two jobs its "old policy" has, as Hilton, Cobbe and
Schulman's decoupled objective does ("Batch size-invariance for policy optimization", NeurIPS 2022): the clipping
keeps each update near the *proximal* policy, the one learn() starts from, and the off-policy correction weighs
each step's advantage by π_prox/μ, truncated at ``rho_bar``, with μ the behaviour policy's log-probability of the
action, computed at prediction time and carried with the action (action ``log_prob``), never recomputed. Without
lag π_prox is μ, every weight is 1 and this is PPO as published. learn() reports how far off-policy its batch was
(``policy_lag``, ``importance_weight``, ``importance_weight_truncated``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium as gym
import torch
from torch.nn import functional as F

from flare2.core.algorithm import Algorithm, Experience, Tensors, adam
from flare2.core.data_parallel import minibatch_share
from flare2.core.model import Model
from flare2.core.ragged_tensor import flat_rows, take_rows
from flare2.core.spaces import holds_entities
from flare2.core.specs import Spec
from flare2.zoo.entity import EntityActorCritic, entity_model
from flare2.zoo.models import ActorCritic
from flare2.zoo.record import ActorCriticSettings
from flare2.zoo.records.ppo import ClippedObjectiveConfig, PPOConfig
from flare2.zoo.returns import gae

CLIPPED_COSTS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
"""The costs ``clipped_loss`` adds up, in the order of its ``CostSums`` row."""


class CostSums:
    """The sum of each cost term over the minibatches of one learn(), kept on the model's device and read back once
    at its end: reading a loss per minibatch (``.item()``) makes the host wait for the GPU at every step, so the
    next minibatch's kernels cannot be queued while this one's run."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._sums: torch.Tensor | None = None
        self._count = 0

    def add(self, *terms: torch.Tensor) -> None:
        """One minibatch's terms, in the order of ``names``."""
        row = torch.stack([term.detach().float() for term in terms])
        self._sums = row if self._sums is None else self._sums + row
        self._count += 1

    def means(self) -> dict[str, float]:
        """The mean of each term over the minibatches added (one read from the device)."""
        if self._sums is None:
            return {name: float("nan") for name in self.names}
        return dict(zip(self.names, (self._sums / self._count).tolist()))


def clipped_loss(
    config: ClippedObjectiveConfig,
    costs: CostSums,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """PPO's loss on one minibatch (clipped surrogate, value and entropy terms); adds its terms to ``costs``
    (``CLIPPED_COSTS``).

    ``weights`` (one per step, >= 0) scale each step's standardised advantage: the truncated importance weights of
    steps that another policy played (``PPO.learn``)."""
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    if advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    if weights is not None:
        advantages = advantages * weights
    policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - config.clip, 1 + config.clip)).mean()
    value_loss = F.mse_loss(values, targets)
    entropy_mean = entropy.mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1).abs() > config.clip).float().mean()
        costs.add(policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction)
    return policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy_mean


def _named(action: torch.Tensor | dict) -> dict:
    """A model acts with one tensor (the action ``action``) or with a dict of named actions (an entity model's)."""
    return action if isinstance(action, dict) else {"action": action}


def _unnamed(actions: dict) -> Any:
    """The action as the model takes it back: the one tensor, or the dict of named actions (``_named`` undone)."""
    return actions["action"] if actions.keys() == {"action"} else actions


def importance_weights(
    experience: Experience, target_log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor, rho_bar: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Each step's importance weight π/μ truncated at ``rho_bar``, and how far off-policy the batch was: its mean
    ``policy_lag`` (in updates), mean ``importance_weight`` and the fraction ``importance_weight_truncated``."""
    ratios = (target_log_prob - behaviour_log_prob).exp()
    report = {
        "policy_lag": experience.policy_lag.double().mean().item(),
        "importance_weight": ratios.mean().item(),
        "importance_weight_truncated": (ratios > rho_bar).float().mean().item(),
    }
    return ratios.clamp(max=rho_bar), report


class LearningBatch(NamedTuple):
    """A learn() batch as PPO and APPO start from it (``PPO.learning_batch``)."""

    inputs: Tensors
    """Flat rows, one per step."""
    actions: Tensors
    """The named actions, flat rows, without acting's ``log_prob`` and ``value``."""
    behaviour_log_prob: torch.Tensor
    """Each step's log-probability under the weights that played it, as acting gave it."""
    current_log_prob: torch.Tensor
    """Each step's log-probability under the weights learn() starts from."""
    values: torch.Tensor
    """``[B, T]``: each step's value under those weights."""


class PPOActorCritic(ActorCritic):
    """The actor-critic with the acting policy's log-probability as a second action output and, where one CNN serves
    both heads (images), each observation's value as a third: learn() then takes both from acting for every step its
    weights played, as SB3's rollout buffer does, instead of passing the whole batch through the CNN once more. Vector
    observations have a value MLP of their own, whose pass at every prediction would cost more than one over the
    batch, so they leave it out."""

    def action_specs(self) -> dict[str, Spec]:
        specs = {**super().action_specs(), "log_prob": Spec((), "float32")}
        return {**specs, "value": Spec((), "float32")} if self.observation.images else specs


class ClippedObjective(Algorithm):
    """What PPO and recurrent PPO share beyond the loss: Adam, and the learning rate annealed over the env steps
    learned from, a count the checkpoint keeps so that a resumed run goes on down the same schedule."""

    may_learn_in_own_process = True

    def __init__(self, model: Model, config: ClippedObjectiveConfig) -> None:
        super().__init__(model, max_grad_norm=config.max_grad_norm)
        self.optimizer = adam(model.parameters(), config.lr, eps=1e-5)
        self.steps_seen = 0

    def count_steps(self, samples: int, config: ClippedObjectiveConfig) -> None:
        """Count ``samples`` more env steps learned from, and set the learning rate for them."""
        self.steps_seen += samples
        self.anneal_lr(config.lr, self.steps_seen, config.anneal_steps)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "steps_seen": self.steps_seen}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.steps_seen = int(state.get("steps_seen", 0))


class PPO(ClippedObjective):
    model: PPOActorCritic
    """The zoo's actor-critic; or the entity one, which answers the same calls with per-entity policies."""

    def __init__(self, model: PPOActorCritic | EntityActorCritic, config: PPOConfig = PPOConfig()) -> None:
        super().__init__(model, config)
        self.config = config
        self.values_when_acting = "value" in model.action_specs()
        """Whether predict() gives each observation's value beside the action (``PPOActorCritic``)."""

    @classmethod
    def for_env(
        cls,
        env: gym.Env,
        config: PPOConfig = PPOConfig(),
        *,
        frames: int = 1,
        hidden: tuple[int, ...] = (64, 64),
        encoder: str = "auto",
        activation: str = "tanh",
        critic_space: gym.Space | None = None,
    ) -> PPO:
        """PPO with the zoo's actor-critic for ``env`` (MLPs, or a CNN for images; over its last ``frames``
        observations; a centralised critic over ``critic_space``)."""
        model = PPOActorCritic(
            env.observation_space,
            env.action_space,
            frames=frames,
            hidden=hidden,
            encoder=encoder,
            activation=activation,
            critic_space=critic_space,
        )
        return cls(model, config)

    def predict(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        return self._act(inputs, self.model.sample), {}

    def predict_greedy(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        return self._act(inputs, self.model.best_action), {}

    def _act(self, inputs: Tensors, choose: Callable[[torch.Tensor], Any]) -> Tensors:
        """The action ``choose`` takes from the policy, its log-probability and, where the model gives it, the value."""
        if self.values_when_acting:
            policy, value = self.model.policy_and_value(inputs)
            outputs = {"value": value}
        else:
            policy, outputs = self.model.policy(inputs), {}
        action = choose(policy)
        log_prob, _ = self.model.log_prob_and_entropy(policy, action)
        return {**_named(action), "log_prob": log_prob, **outputs}

    def learn(self, experience: Experience) -> dict[str, float]:
        config, model = self.config, self.model
        with torch.no_grad():
            batch = self.learning_batch(experience)
            inputs, actions, behaviour_log_prob = batch.inputs, batch.actions, batch.behaviour_log_prob
            proximal_log_prob, values = batch.current_log_prob, batch.values
            advantages, targets = gae(
                experience.rewards["reward"],
                values,
                experience.next_values(model.value, values),
                experience.terminated,
                experience.truncated,
                config.gamma,
                config.gae_lambda,
            )
            weights, off_policy = importance_weights(experience, proximal_log_prob, behaviour_log_prob, config.rho_bar)
        self.count_steps(advantages.numel(), config)
        costs = self.clipped_epochs(inputs, actions, proximal_log_prob, advantages, targets, weights)
        return {**costs, **off_policy}

    def learning_batch(self, experience: Experience) -> LearningBatch:
        """``experience`` as flat rows, with what acting gave apart, and each step's log-probability and value under
        the weights learn() starts from. Where acting gave values, the steps these weights played keep acting's own
        and only the others pass through the model; otherwise every step does, in one pass. Call it under no_grad."""
        # Every step is one sample: ragged inputs and actions (entities) are flattened and drawn from alike.
        inputs, actions = flat_rows(experience.inputs), flat_rows(experience.actions)
        behaviour_log_prob, acting_values = actions.pop("log_prob"), actions.pop("value", None)
        shape = experience.terminated.shape
        if acting_values is None:
            log_prob, values = self._log_prob_and_value(inputs, actions)
        else:
            log_prob, values = behaviour_log_prob.clone(), acting_values.clone()
            lagging = experience.policy_lag.flatten().nonzero().squeeze(-1)
            if lagging.numel():
                log_prob[lagging], values[lagging] = self._log_prob_and_value(
                    take_rows(inputs, lagging), take_rows(actions, lagging)
                )
        return LearningBatch(inputs, actions, behaviour_log_prob, log_prob, values.reshape(shape))

    def _log_prob_and_value(self, inputs: Tensors, actions: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
        policy, values = self.model.policy_and_value(inputs)
        log_prob, _ = self.model.log_prob_and_entropy(policy, _unnamed(actions))
        return log_prob, values

    def clipped_epochs(
        self,
        inputs: Tensors,
        actions: Tensors,
        old_log_prob: torch.Tensor,
        advantages: torch.Tensor,
        targets: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """``epochs`` passes of minibatches of the clipped objective over every step; returns the mean costs.

        ``inputs``, ``actions`` (without ``log_prob``), ``old_log_prob`` and ``weights`` are flat rows
        (``flat_rows``), one per step of the ``[B, T]`` ``advantages`` and value ``targets``; the ratio is taken
        against ``old_log_prob`` and ``weights`` scale the advantages (see ``clipped_loss``).
        """
        config, model = self.config, self.model
        samples = advantages.numel()
        flat_advantages, flat_targets = advantages.reshape(samples), targets.reshape(samples)
        costs = CostSums(CLIPPED_COSTS)
        for _ in range(config.epochs):
            for index in torch.randperm(samples, device=advantages.device).split(
                minibatch_share(config.minibatch_size)
            ):
                policy, values = model.policy_and_value(take_rows(inputs, index))
                log_prob, entropy = model.log_prob_and_entropy(policy, _unnamed(take_rows(actions, index)))
                self.optimize_on_device(
                    clipped_loss(
                        config,
                        costs,
                        log_prob,
                        old_log_prob[index],
                        flat_advantages[index],
                        entropy,
                        values,
                        flat_targets[index],
                        None if weights is None else weights[index],
                    )
                )
        return costs.means()


def build(env: gym.Env, config: PPOConfig, settings: ActorCriticSettings) -> PPO:
    """PPO for ``env`` as ``flare2 train --algo ppo`` builds it: over entities, the entity actor-critic
    (``flare2.zoo.entity``); otherwise the zoo's actor-critic."""
    if holds_entities(env.observation_space):
        return PPO(entity_model(env), config)
    return PPO.for_env(env, config, **settings.model_kwargs(env))
