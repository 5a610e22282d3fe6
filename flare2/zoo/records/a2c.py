"""A2C as ``flare2 train --algo a2c`` runs it: its config and its record (the Algorithm: ``flare2.zoo.a2c``)."""

from __future__ import annotations

from dataclasses import dataclass

from flare2.errors import ConfigError
from flare2.zoo.record import (
    BOX,
    DICT,
    DISCRETE,
    VECTOR_BOX,
    ActorCriticSettings,
    AlgorithmRecord,
)


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


RECORD = AlgorithmRecord(
    name="a2c",
    config_class=A2CConfig,
    settings_class=ActorCriticSettings,
    build="flare2.zoo.a2c:build",
    observations=(BOX, DISCRETE, DICT),
    actions=(DISCRETE, VECTOR_BOX),
    run={"max_steps": 500_000, "learner": "inline"},
    # The example's settings, measured in the README's results. Each learn() is a batch of 40 steps that the agent
    # waits for: in one process (--serial) CartPole reached 475 in 18.8 s median against 20.5 s with the agent in a
    # process of its own (3 seeds, 2 cores each; docs/results.md).
    presets={"CartPole-v1": {"run": {"serial": True}}},
    family_presets={
        # rl-baselines3-zoo's hyperparams/a2c.yml (atari): 16 envs, SB3's 5 steps each, entropy 0.01, value 0.25,
        # RMSprop with eps 1e-5 (flare2's A2C always uses it), rewards clipped, 4 stacked frames, the Nature CNN
        # with linear heads.
        "Atari": {
            "algorithm": {"entropy_coef": 0.01, "value_coef": 0.25},
            "agent": {"sample_interval": 5, "frames": 4, "hidden": ()},
            "run": {"envs_per_agent": 16, "clip_rewards": 1.0, "max_steps": 10_000_000},
        },
    },
    search_space={
        "lr": ("log", (1e-4, 3e-3)),
        "gamma": ("choice", (0.95, 0.98, 0.99, 0.995)),
        "entropy_coef": ("log", (1e-8, 1e-2)),
        "value_coef": ("float", (0.25, 1.0)),
        "sample_interval": ("choice", (5, 8, 16, 32)),
    },
)
