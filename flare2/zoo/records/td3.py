"""TD3 as ``flare2 train --algo td3`` runs it: its config and its record (the Algorithm: ``flare2.zoo.td3``)."""

from __future__ import annotations

from dataclasses import dataclass

from flare2.errors import ConfigError
from flare2.zoo.record import BOX, VECTOR_BOX, AlgorithmRecord, ReplaySettings


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
            raise ConfigError(
                f"TD3Config needs 0 <= gamma <= 1 and 0 < tau <= 1, got gamma={self.gamma}, tau={self.tau}"
            )
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


RECORD = AlgorithmRecord(
    name="td3",
    config_class=TD3Config,
    settings_class=ReplaySettings,
    build="flare2.zoo.td3:build",
    observations=(BOX,),
    actions=(VECTOR_BOX,),
    # One agent process of 8 envs and one replay buffer (as DQN's): on 2 cores, Pendulum's preset reached -200 in
    # 0.75 of the wall time of 8 one-env processes (median of 3 seeds: 47.5 s against 62.9 s), in the same env steps.
    run={"num_agents": 1, "envs_per_agent": 8, "max_steps": 50_000},
    agent={"buffer": 200_000, "warmup": 2_000, "sample_interval": 1, "batch_size": 256},
    derived={"random_steps": "warmup"},
    # The example's settings, measured in the README's results.
    presets={"Pendulum-v1": {"algorithm": {"hidden": (64, 64)}}},
    search_space={
        "actor_lr": ("log", (1e-4, 3e-3)),
        "critic_lr": ("log", (1e-4, 3e-3)),
        "gamma": ("choice", (0.95, 0.98, 0.99, 0.995)),
        "tau": ("log", (1e-3, 5e-2)),
        "exploration_noise": ("float", (0.05, 0.3)),
        "batch_size": ("choice", (64, 128, 256)),
    },
)
