"""DQN: a Q-network, a slowly averaged target network, epsilon-greedy acting, optional double-Q targets.

Experiences come from the agents' replay buffers (``ExpReplayHelper``): each
learn() call gets N sampled sequences of T steps and takes one gradient step
per ``minibatch_size`` of them. The first step of each sequence is learned,
with the T-step return as its target (T = 1: the usual one-step target); the
return stops at an episode end. A terminated step has no bootstrap; a
time-limit truncation bootstraps from the final observation. Longer returns
carry the reward back faster but, off-policy, are biased towards the acting
policy's values.

Where the observations hold legal-move masks (``action_mask``, a turn-based
game's), the Q-network masks the illegal moves (``QNetwork``): they are never
the greedy move nor a target's maximum, and exploring draws among the legal ones.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import torch
from torch.nn import functional as F

from flare2.core.algorithm import Algorithm, Experience, Tensors, adam, polyak_update
from flare2.core.data_parallel import minibatch_share
from flare2.zoo.models import QNetwork, masked_logits, sample_categorical
from flare2.zoo.record import DQNSettings
from flare2.zoo.records.dqn import DQNConfig
from flare2.zoo.returns import n_step_returns


@dataclass(frozen=True)
class FirstStepReturns:
    """The n-step return of each sampled sequence's first step: ``rewards + discount * V(bootstrap_inputs)``."""

    rewards: torch.Tensor
    """``[B]``: the discounted rewards up to the sequence's first episode end (or its last step)."""
    discount: torch.Tensor
    """``[B]``: gamma to the power of those steps, 0 where the episode terminated (nothing to bootstrap from)."""
    bootstrap_inputs: Tensors
    """``[B, ...]`` each: the inputs after that step, which the target network values."""


class DQN(Algorithm):
    model: QNetwork

    def __init__(self, model: QNetwork, config: DQNConfig = DQNConfig()) -> None:
        super().__init__(model, max_grad_norm=config.max_grad_norm)
        self.config = config
        self.target = copy.deepcopy(model).requires_grad_(False)
        self.optimizer = adam(model.parameters(), config.lr)
        self.predicted = 0
        self.gradient_steps = 0

    @classmethod
    def for_env(
        cls,
        env: gym.Env,
        config: DQNConfig = DQNConfig(),
        hidden: tuple[int, ...] = (128, 128),
        *,
        frames: int = 1,
        encoder: str = "auto",
    ) -> DQN:
        """DQN with the zoo's Q-network for ``env`` (an MLP, or a CNN for images; over its last ``frames``
        observations)."""
        model = QNetwork(env.observation_space, env.action_space, hidden=hidden, frames=frames, encoder=encoder)
        return cls(model, config)

    @property
    def epsilon(self) -> float:
        config = self.config
        fraction = min(1.0, self.predicted / config.exploration_steps)
        return config.epsilon_start + fraction * (config.epsilon_end - config.epsilon_start)

    def predict(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        q = self.model(inputs)
        greedy = q.argmax(-1)
        explore = torch.rand(greedy.shape, device=q.device) < self.epsilon
        self.predicted += greedy.shape[0]
        mask = inputs.get("action_mask")
        if mask is None:
            uniform = torch.randint_like(greedy, q.shape[-1])
        else:  # among the legal actions
            uniform = sample_categorical(masked_logits(torch.zeros_like(q), mask))
        return {"action": torch.where(explore, uniform, greedy)}, {}

    def predict_greedy(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        return {"action": self.model(inputs).argmax(-1)}, {}

    def learn(self, experience: Experience) -> dict[str, float]:
        config = self.config
        # The first step of each sampled sequence is learned; the steps after it (up to an episode end)
        # make its n-step return. Sequences of one step give the usual one-step target.
        inputs = {name: experience.inputs[name][:, 0] for name in self.model.input_names}
        actions = experience.actions["action"][:, 0]
        returns = self.first_step_returns(experience)
        self.anneal_lr(config.lr, self.predicted, config.anneal_steps)
        losses = []
        for index in torch.randperm(len(actions), device=actions.device).split(minibatch_share(config.minibatch_size)):
            q = self.model(_rows(inputs, index)).gather(-1, actions[index].unsqueeze(-1)).squeeze(-1)
            loss = F.smooth_l1_loss(q, self.targets(returns, index))
            self.optimize(loss)
            losses.append(loss.item())
            self.gradient_steps += 1
            if self.gradient_steps % config.target_update_every == 0:
                self._refresh_target()
        return {"td_loss": sum(losses) / len(losses), "epsilon": self.epsilon}

    @torch.no_grad()
    def first_step_returns(self, experience: Experience) -> FirstStepReturns:
        """The n-step return of each sequence's first step, less the value it bootstraps from, which the networks
        give at each gradient step (``targets``).

        A first step's return bootstraps from one observation only, the one after the sequence's first episode end
        (or after its last step), so only that one is valued: a third of the forward passes for 3-step returns.
        Returns are linear in the rewards and in the next values, so the part of the rewards and the discount of
        that value are each a return of their own, taken once for the whole learn() call."""
        rewards, terminated, truncated = experience.rewards["reward"], experience.terminated, experience.truncated
        ends = terminated | truncated
        ends[:, -1] = True
        rows = torch.arange(len(ends), device=ends.device)
        bootstrap = ends.int().argmax(-1)  # the first end of each sequence
        bootstrapped = torch.zeros_like(rewards)
        bootstrapped[rows, bootstrap] = 1.0
        gamma = self.config.gamma
        return FirstStepReturns(
            rewards=n_step_returns(rewards, torch.zeros_like(rewards), terminated, truncated, gamma)[:, 0],
            discount=n_step_returns(torch.zeros_like(rewards), bootstrapped, terminated, truncated, gamma)[:, 0],
            bootstrap_inputs={name: experience.next_inputs[name][rows, bootstrap] for name in self.model.input_names},
        )

    @torch.no_grad()
    def targets(self, returns: FirstStepReturns, index: torch.Tensor) -> torch.Tensor:
        """The n-step targets of the first steps of the sequences at ``index``, valued by the current networks."""
        next_inputs = _rows(returns.bootstrap_inputs, index)
        next_q = self.target(next_inputs)
        if self.config.double_q:
            next_value = next_q.gather(-1, self.model(next_inputs).argmax(-1, keepdim=True)).squeeze(-1)
        else:
            next_value = next_q.max(-1).values
        return returns.rewards[index] + returns.discount[index] * next_value

    def _refresh_target(self) -> None:
        polyak_update(self.target, self.model, self.config.target_tau)

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "target": self.target.state_dict(),
            "predicted": self.predicted,
            "gradient_steps": self.gradient_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.target.load_state_dict(state["target"])
        self.predicted, self.gradient_steps = int(state["predicted"]), int(state["gradient_steps"])


def _rows(inputs: Tensors, index: torch.Tensor) -> Tensors:
    return {name: value[index] for name, value in inputs.items()}


def build(env: gym.Env, config: DQNConfig, settings: DQNSettings) -> DQN:
    """DQN for ``env`` as ``flare2 train --algo dqn`` builds it."""
    return DQN.for_env(env, config, settings.hidden, frames=settings.frames, encoder=settings.encoder)
