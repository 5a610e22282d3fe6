"""Recurrent PPO as ``flare2 train --algo recurrent-ppo`` runs it: its config and its record (the Algorithm:
``flare2.zoo.recurrent_ppo``)."""

from __future__ import annotations

from dataclasses import dataclass

from flare2.errors import ConfigError
from flare2.zoo.envs import CARTPOLE_NO_VELOCITY
from flare2.zoo.record import BOX, DISCRETE, AlgorithmRecord, RecurrentSettings
from flare2.zoo.records.ppo import CLIPPED_OBJECTIVE_SEARCH, ClippedObjectiveConfig


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


RECORD = AlgorithmRecord(
    name="recurrent-ppo",
    config_class=RecurrentPPOConfig,
    settings_class=RecurrentSettings,
    build="flare2.zoo.recurrent_ppo:build",
    observations=(BOX, DISCRETE),
    actions=(DISCRETE,),
    run={"num_agents": 8, "envs_per_agent": 1, "max_steps": 150_000, "learn_max_wait_ms": 200.0},
    agent={"sample_interval": 32},
    derived={"anneal_steps": "max_steps"},
    # The example's settings, measured in the README's results.
    presets={CARTPOLE_NO_VELOCITY: {}},
    search_space={**CLIPPED_OBJECTIVE_SEARCH, "sample_interval": ("choice", (16, 32, 64))},
)
