"""The settings of the zoo's algorithms, in a module without torch.

The manager and ``--help`` read them without loading torch; each algorithm's
module imports its config from here. ``flare2.runtime.options.add_config_options``
turns any of them into command-line options, one per field.
"""

from __future__ import annotations

from dataclasses import dataclass

from flare2.errors import ConfigError


@dataclass(frozen=True)
class A2CConfig:
    lr: float = 7e-4
    """Learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Gradients are clipped to this global norm."""
    optimizer: str = "rmsprop"
    """``rmsprop`` (as in the A2C paper, alpha 0.99, eps 1e-5) or ``adam``."""
    normalize_advantages: bool = False
    """Standardise advantages within each batch."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"A2CConfig.lr must be > 0, got {self.lr}")
        if not 0 <= self.gamma <= 1:
            raise ConfigError(f"A2CConfig.gamma must be in [0, 1], got {self.gamma}")
        if self.optimizer not in ("rmsprop", "adam"):
            raise ConfigError(f"A2CConfig.optimizer must be 'rmsprop' or 'adam', got {self.optimizer!r}")


@dataclass(frozen=True)
class ClippedObjectiveConfig:
    """The settings PPO and recurrent PPO share: the clipped objective, GAE and the learning-rate schedule."""

    lr: float = 1e-3
    """Adam learning rate at the start."""
    anneal_steps: int | None = 100_000
    """The learning rate falls linearly to 0 over this many env steps (None: constant)."""
    gamma: float = 0.98
    """Discount factor."""
    gae_lambda: float = 0.8
    """GAE trace decay."""
    clip: float = 0.2
    """Clip range of the probability ratio."""
    epochs: int = 20
    """Passes over each learn() batch."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Gradients are clipped to this global norm."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.lr <= 0 or self.clip <= 0 or self.epochs < 1:
            raise ConfigError(f"{name} needs lr > 0, clip > 0 and epochs >= 1, got {self}")
        if not 0 <= self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ConfigError(f"{name}.gamma and gae_lambda must be in [0, 1], got {self.gamma}, {self.gae_lambda}")
        if self.anneal_steps is not None and self.anneal_steps < 1:
            raise ConfigError(f"{name}.anneal_steps must be >= 1 or None, got {self.anneal_steps}")
        if self.value_coef < 0 or self.entropy_coef < 0 or self.max_grad_norm <= 0:
            raise ConfigError(f"{name} needs value_coef >= 0, entropy_coef >= 0 and max_grad_norm > 0, got {self}")


@dataclass(frozen=True)
class PPOConfig(ClippedObjectiveConfig):
    minibatch_size: int = 256
    """Steps per gradient step (the batch is B*T steps)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.minibatch_size < 1:
            raise ConfigError(f"PPOConfig.minibatch_size must be >= 1, got {self.minibatch_size}")


@dataclass(frozen=True)
class RecurrentPPOConfig(ClippedObjectiveConfig):
    anneal_steps: int | None = 150_000
    """The learning rate falls linearly to 0 over this many env steps (None: constant)."""
    epochs: int = 10
    """Passes over each learn() batch."""
    minibatch_sequences: int = 8
    """Whole sequences per gradient step (a learn() batch holds B of them)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.minibatch_sequences < 1:
            raise ConfigError(f"RecurrentPPOConfig.minibatch_sequences must be >= 1, got {self.minibatch_sequences}")


@dataclass(frozen=True)
class DQNConfig:
    lr: float = 1e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    minibatch_size: int = 64
    """Transitions per gradient step (a learn() call holds N of them: N / minibatch_size steps)."""
    target_update_every: int = 1
    """Gradient steps between refreshes of the target network."""
    target_tau: float = 0.005
    """Fraction of the Q-network blended into the target at each refresh: 1 copies it, below 1 averages (Polyak).
    On CartPole, averaging at every step kept the greedy policy at 500 far longer than a copy every 250 steps."""
    epsilon_start: float = 1.0
    """Probability of a random action at the start."""
    epsilon_end: float = 0.04
    """Probability of a random action once exploration_steps have passed."""
    exploration_steps: int = 8_000
    """Predicted actions over which epsilon falls linearly from start to end."""
    anneal_steps: int | None = None
    """Env steps (predicted actions) over which the learning rate falls linearly to 0; None keeps it constant."""
    double_q: bool = True
    """Pick the next action with the online network, value it with the target network."""
    max_grad_norm: float = 10.0
    """Gradients are clipped to this global norm."""

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.minibatch_size < 1 or self.target_update_every < 1 or self.exploration_steps < 1:
            raise ConfigError(f"DQNConfig needs lr > 0 and minibatch_size, target_update_every, exploration_steps >= 1: {self}")
        if self.anneal_steps is not None and self.anneal_steps < 1:
            raise ConfigError(f"DQNConfig.anneal_steps must be >= 1 or None (a constant learning rate), got {self.anneal_steps}")
        if not 0 < self.target_tau <= 1:
            raise ConfigError(f"DQNConfig needs 0 < target_tau <= 1, got {self.target_tau}")
        if not 0 <= self.epsilon_end <= self.epsilon_start <= 1:
            raise ConfigError(f"DQNConfig needs 0 <= epsilon_end <= epsilon_start <= 1, got {self}")


@dataclass(frozen=True)
class SARSAConfig:
    lr: float = 0.1
    """Step size: a Q-table moves each visited entry by lr times its TD error; with hidden layers, Adam's learning
    rate (they need a much smaller one)."""
    gamma: float = 0.99
    """Discount factor."""
    epsilon: float = 0.1
    """Probability of a random action; SARSA learns the value of this epsilon-greedy policy."""
    max_grad_norm: float | None = None
    """Gradients are clipped to this global norm (None: not clipped)."""

    def __post_init__(self) -> None:
        if self.lr <= 0 or not 0 <= self.gamma <= 1 or not 0 <= self.epsilon <= 1:
            raise ConfigError(f"SARSAConfig needs lr > 0, gamma and epsilon in [0, 1], got {self}")


@dataclass(frozen=True)
class TD3Config:
    actor_lr: float = 1e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the two critics."""
    gamma: float = 0.98
    """Discount factor."""
    tau: float = 0.005
    """Polyak factor: each target update moves the target networks this fraction towards the online ones."""
    minibatch_size: int = 256
    """Transitions per gradient step (a learn() call holds N of them: N / minibatch_size steps)."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of the actor and of each critic (ReLU)."""
    exploration_noise: float = 0.1
    """Standard deviation of the Gaussian noise added to predicted actions, as a fraction of the half action range."""
    policy_noise: float = 0.2
    """Standard deviation of the target policy smoothing noise, as a fraction of the half action range."""
    noise_clip: float = 0.5
    """The smoothing noise is clipped to +-this fraction of the half action range."""
    policy_delay: int = 2
    """Critic steps per actor step and target update."""
    random_steps: int = 0
    """Predicted actions drawn uniformly from the action box before the actor takes over."""
    max_grad_norm: float | None = None
    """Gradients are clipped to this global norm (None: no clipping)."""

    def __post_init__(self) -> None:
        if self.actor_lr <= 0 or self.critic_lr <= 0:
            raise ConfigError(f"TD3Config needs actor_lr > 0 and critic_lr > 0, got {self.actor_lr}, {self.critic_lr}")
        if not 0 <= self.gamma <= 1 or not 0 < self.tau <= 1:
            raise ConfigError(f"TD3Config needs 0 <= gamma <= 1 and 0 < tau <= 1, got gamma={self.gamma}, tau={self.tau}")
        if self.minibatch_size < 1 or self.policy_delay < 1 or self.random_steps < 0:
            raise ConfigError(
                f"TD3Config needs minibatch_size >= 1, policy_delay >= 1 and random_steps >= 0, got "
                f"{self.minibatch_size}, {self.policy_delay}, {self.random_steps}"
            )
        if not self.hidden or any(size < 1 for size in self.hidden):
            raise ConfigError(f"TD3Config needs at least one hidden layer, every size >= 1, got hidden={self.hidden}")
        if self.exploration_noise < 0 or self.policy_noise < 0 or self.noise_clip < 0:
            raise ConfigError(
                f"TD3Config needs exploration_noise, policy_noise and noise_clip >= 0, got {self.exploration_noise}, "
                f"{self.policy_noise}, {self.noise_clip}"
            )
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"TD3Config needs max_grad_norm > 0 or None, got {self.max_grad_norm}")
