"""SAC as ``flare2 train --algo sac`` runs it: its config and its record (the Algorithm: ``flare2.zoo.sac``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from flare2.errors import ConfigError
from flare2.zoo.record import BOX, VECTOR_BOX, AlgorithmRecord, ReplaySettings


@dataclass(frozen=True)
class SACConfig:
    """Stable-Baselines3's SAC defaults, automatic entropy tuning included."""

    lr: float = 3e-4
    """Adam learning rate of the actor, the two critics and the entropy coefficient."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak factor: each gradient step moves the target critics this fraction towards the online ones."""
    minibatch_size: int = 256
    """Transitions per gradient step (a learn() call holds N of them: N / minibatch_size steps)."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of the actor and of each critic (ReLU)."""
    initial_alpha: float = 1.0
    """Entropy coefficient alpha before any tuning."""
    target_entropy: float | None = None
    """Entropy that the tuning of alpha aims the policy at (None: minus the number of action dimensions)."""
    fixed_alpha: float | None = None
    """Keep alpha at this value, with no tuning (None: tune it from initial_alpha)."""
    random_steps: int = 0
    """Predicted actions drawn uniformly from the action box before the actor takes over."""
    max_grad_norm: float | None = None
    """Gradients are clipped to this global norm (None: no clipping)."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"SACConfig needs lr > 0, got lr={self.lr}")
        if not 0 <= self.gamma <= 1 or not 0 < self.tau <= 1:
            raise ConfigError(
                f"SACConfig needs 0 <= gamma <= 1 and 0 < tau <= 1, got gamma={self.gamma}, tau={self.tau}"
            )
        if self.minibatch_size < 1 or self.random_steps < 0:
            raise ConfigError(
                f"SACConfig needs minibatch_size >= 1 and random_steps >= 0, got {self.minibatch_size}, "
                f"{self.random_steps}"
            )
        if not self.hidden or any(size < 1 for size in self.hidden):
            raise ConfigError(f"SACConfig needs at least one hidden layer, every size >= 1, got hidden={self.hidden}")
        if not self.initial_alpha > 0 or (self.fixed_alpha is not None and not self.fixed_alpha > 0):
            raise ConfigError(
                f"SACConfig needs initial_alpha > 0 and fixed_alpha > 0 or None, got initial_alpha="
                f"{self.initial_alpha}, fixed_alpha={self.fixed_alpha}"
            )
        if self.target_entropy is not None and not math.isfinite(self.target_entropy):
            raise ConfigError(f"SACConfig needs a finite target_entropy or None, got {self.target_entropy}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError(f"SACConfig needs max_grad_norm > 0 or None, got {self.max_grad_norm}")


RECORD = AlgorithmRecord(
    name="sac",
    config_class=SACConfig,
    settings_class=ReplaySettings,
    build="flare2.zoo.sac:build",
    observations=(BOX,),
    actions=(VECTOR_BOX,),
    # One agent process of 8 envs and one replay buffer (as TD3's), whose learn() takes both cores while the agent
    # waits for its reply: on 2 cores Pendulum's preset reached -200 (seed 0) in 195 s against 287 s with 8 one-env
    # processes and one torch thread (218 s with 2 threads and 8 processes), in 22.4k against 24.0k env steps. A
    # gradient step of 256-256 networks over 256 transitions takes 6.3 ms on 2 threads against 9.2 ms on one.
    run={"num_agents": 1, "envs_per_agent": 8, "torch_threads": 2, "max_steps": 50_000},
    # SB3's train_freq 1, gradient_steps 1, batch_size 256: every step of the agent sends 256 sampled transitions per
    # env, so each env step makes one gradient step of 256 (minibatch_size). SB3's buffer and learning_starts.
    agent={"buffer": 1_000_000, "warmup": 100, "sample_interval": 1, "batch_size": 256},
    derived={"random_steps": "warmup"},
    # From rl-baselines3-zoo, hyperparams/sac.yml, over SB3's defaults above: Pendulum-v1 is n_timesteps 20000 and
    # learning_rate 1e-3; HalfCheetah (v3 there, v5 the Gymnasium id now) is learning_starts 10000, n_timesteps 1e6.
    presets={
        "Pendulum-v1": {"algorithm": {"lr": 1e-3}, "run": {"max_steps": 20_000}},
        "HalfCheetah-v5": {"agent": {"warmup": 10_000}, "run": {"max_steps": 1_000_000}},
    },
    search_space={
        "lr": ("log", (1e-4, 3e-3)),
        "gamma": ("choice", (0.95, 0.98, 0.99, 0.995)),
        "tau": ("log", (1e-3, 5e-2)),
        "initial_alpha": ("log", (0.01, 1.0)),
        "batch_size": ("choice", (64, 128, 256)),
    },
)
