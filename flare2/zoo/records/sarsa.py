"""SARSA as ``flare2 train --algo sarsa`` runs it: its config and its record (the Algorithm: ``flare2.zoo.sarsa``)."""

from __future__ import annotations

from dataclasses import dataclass

from flare2.errors import ConfigError
from flare2.zoo.record import BOX, DISCRETE, AlgorithmRecord, QSettings


@dataclass(frozen=True)
class SARSAConfig:
    lr: float | None = None
    """Step size. A Q-table (one-hot observations, no hidden layers) moves each visited entry by lr times its TD
    error (None: 0.1); any other Q-model learns with Adam at this learning rate (None: 1e-3, as a table's 0.1 would
    make Adam's steps a hundred times too large)."""
    gamma: float = 0.99
    """Discount factor."""
    epsilon: float = 0.1
    """Probability of a random action; SARSA learns the value of this epsilon-greedy policy."""
    max_grad_norm: float | None = None
    """Gradients are clipped to this global norm (None: not clipped)."""

    def __post_init__(self) -> None:
        if (self.lr is not None and self.lr <= 0) or not 0 <= self.gamma <= 1 or not 0 <= self.epsilon <= 1:
            raise ConfigError(f"SARSAConfig needs lr > 0, gamma and epsilon in [0, 1], got {self}")


RECORD = AlgorithmRecord(
    name="sarsa",
    config_class=SARSAConfig,
    settings_class=QSettings,
    build="flare2.zoo.sarsa:build",
    observations=(BOX, DISCRETE),
    actions=(DISCRETE,),
    run={"num_agents": 8, "envs_per_agent": 1, "max_steps": 60_000, "learner": "inline"},
    agent={"sample_interval": 8},
    # The example's settings, measured in the README's results.
    presets={"CliffWalking-v1": {"algorithm": {"gamma": 1.0}, "run": {"max_episode_steps": 200, "eval_every": 2}}},
    search_space={
        "lr": ("log", (1e-2, 0.5)),
        "gamma": ("choice", (0.9, 0.95, 0.99, 1.0)),
        "epsilon": ("float", (0.01, 0.3)),
    },
)
