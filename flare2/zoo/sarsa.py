"""SARSA: on-policy TD control with a Q-network and epsilon-greedy acting.

Each learn() call gets B sequences of T consecutive steps from the online
helper. The target of a step bootstraps from the action the agent actually
took next, which is the next step of the same sequence:

    target_t = r_t + gamma * Q(s_{t+1}, a_{t+1})

A terminated step has no bootstrap. Where the next action is not in the
sequence (its last step, or a time-limit truncation), the target uses the
value of the next observation expected under the epsilon-greedy policy
(Expected SARSA), which is what SARSA's target is on average.

With a linear QNetwork over a one-hot observation (``hidden=()``) this is
tabular SARSA: each step moves its own entry by ``lr`` times its TD error, as
in Sutton and Barto. With hidden layers, Adam minimises the mean squared TD
error. (Adam on a table was tried: its bounded steps left the value of a
rarely taken action far from due, on CliffWalking the step into the cliff at
-50 where about -125 was due, and the greedy policy drifted to the cliff's
edge.)
"""

from __future__ import annotations

import gymnasium as gym
import torch

from flare2.core.algorithm import Algorithm, Experience, Tensors
from flare2.errors import ConfigError
from flare2.zoo.models import QNetwork
from flare2.zoo.record import QSettings
from flare2.zoo.records.sarsa import SARSAConfig

TABLE_LR = 0.1
"""A Q-table's step size where the config names none (the CliffWalking example's, measured in the results)."""
NETWORK_LR = 1e-3
"""Adam's learning rate for any other Q-model where the config names none: Adam's own default."""


class SARSA(Algorithm):
    model: QNetwork
    may_learn_in_own_process = True

    def __init__(self, model: QNetwork, config: SARSAConfig = SARSAConfig()) -> None:
        if "action_mask" in model.input_specs():
            raise ConfigError(
                "SARSA's epsilon-greedy policy and expected values take every action, and this model's inputs hold an "
                "action_mask: learn an env with legal-move masks with DQN"
            )
        super().__init__(model, max_grad_norm=config.max_grad_norm)
        self.config = config
        # A Q-model of the user's own is learned as a network, whatever its layers.
        self.tabular = getattr(model, "is_table", False)
        if self.tabular:
            self.optimizer = torch.optim.SGD(model.parameters(), lr=config.lr or TABLE_LR)
        else:
            self.optimizer = torch.optim.Adam(model.parameters(), lr=config.lr or NETWORK_LR)

    @classmethod
    def for_env(cls, env: gym.Env, config: SARSAConfig = SARSAConfig(), hidden: tuple[int, ...] = ()) -> SARSA:
        return cls(QNetwork(env.observation_space, env.action_space, hidden=hidden), config)

    def predict(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        q = self.model(inputs)
        greedy = q.argmax(-1)
        explore = torch.rand(greedy.shape, device=q.device) < self.config.epsilon
        return {"action": torch.where(explore, torch.randint_like(greedy, q.shape[-1]), greedy)}, {}

    def predict_greedy(self, inputs: Tensors, states: Tensors) -> tuple[Tensors, Tensors]:
        return {"action": self.model(inputs).argmax(-1)}, {}

    def expected_value(self, q: torch.Tensor) -> torch.Tensor:
        """The value of Q-values ``[..., A]`` under the epsilon-greedy policy."""
        epsilon = self.config.epsilon
        return (1 - epsilon) * q.max(-1).values + epsilon * q.mean(-1)

    def targets(self, experience: Experience) -> torch.Tensor:
        """SARSA targets ``[B, T]`` (see the module docstring)."""
        actions = experience.actions["action"]
        with torch.no_grad():
            next_q = self.model(experience.next_inputs)
            next_value = self.expected_value(next_q)
            # Within a sequence and an episode, the next step holds the action taken from next_obs.
            taken = next_q[:, :-1].gather(-1, actions[:, 1:].unsqueeze(-1)).squeeze(-1)
            continues = ~experience.episode_ends[:, :-1]
            next_value[:, :-1] = torch.where(continues, taken, next_value[:, :-1])
            alive = (~experience.terminated).float()
            return experience.rewards["reward"] + self.config.gamma * alive * next_value

    def learn(self, experience: Experience) -> dict[str, float]:
        target = self.targets(experience)
        q = self.model(experience.inputs).gather(-1, experience.actions["action"].unsqueeze(-1)).squeeze(-1)
        squared_errors = (q - target).pow(2)
        # Summed, a gradient step of lr moves each sampled entry of a table by lr times its own TD error.
        self.optimize(squared_errors.sum() / 2 if self.tabular else squared_errors.mean())
        return {"td_loss": squared_errors.mean().item(), "q_mean": q.mean().item()}


def build(env: gym.Env, config: SARSAConfig, settings: QSettings) -> SARSA:
    """SARSA for ``env`` as ``flare2 train --algo sarsa`` builds it."""
    return SARSA.for_env(env, config, settings.hidden)
