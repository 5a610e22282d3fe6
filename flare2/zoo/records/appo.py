"""APPO as ``flare2 train --algo appo`` runs it: its config and its record (the Algorithm: ``flare2.zoo.appo``).

APPO starts from PPO's settings, presets included, so that the two compare like for like on the same env.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flare2.errors import ConfigError
from flare2.zoo.record import ENTITIES, AlgorithmRecord
from flare2.zoo.records.ppo import ENTITY_PRESETS, PPOConfig
from flare2.zoo.records.ppo import RECORD as PPO_RECORD


@dataclass(frozen=True)
class APPOConfig(PPOConfig):
    gae_lambda: float = 0.8
    """λ of V-trace's traces (c_s = λ min(c̄, π/μ)); named as PPO's, whose GAE(λ) value targets V-trace gives when
    every weight is 1."""
    c_bar: float = 1.0
    """c̄: the importance weights of the traces are truncated to at most this (c̄ <= ρ̄ in the paper)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.c_bar > 0:
            raise ConfigError(f"APPOConfig.c_bar must be > 0 (1.0 as in IMPALA), got {self.c_bar}")


_OWN_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # PPO's rollouts of 16 envs x 256 steps, each learned one update behind, took 255k/296k/179k env steps to -100
    # (seeds 0/1/2, 23.9/26.8/19.0 s on 2 cores); rollouts of 64 steps make each update, and so what one update of
    # lag costs, a quarter: 139k/101k/104k/133k/136k (seeds 0-4, 16.6/12.9/13.3/15.3/15.6 s). 32 steps: 207k/77k/112k.
    "Acrobot-v1": {"agent": {"sample_interval": 64}},
    # Breakout on 2 cores, 8 envs: 302/325/263 env steps/s with the learner in a thread against 146/121/155 with a
    # process of its own, whose 2 torch threads fight the compute process's 2 for the cores (predict() then took
    # about 0.65 of the time against 0.22). On a GPU with 16 cores, 128 envs: the same rate either way (2680 and
    # 2684), with 4 GB less memory. Its agents play their 8 envs at once: with PPO's two alternating halves it
    # played 340/302 env steps/s against 363/309 (2 rounds of 12k steps, 1e3deaf), its learner thread busy beside.
    "Atari": {"run": {"learner": "thread"}, "agent": {"double_buffer": False}},
}
"""What APPO changes in PPO's preset of an env or a family of envs."""


def _beside_acting(env_id: str, preset: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """PPO's ``preset`` for ``env_id`` without the schedule it may set (``learner``, ``serial``), with APPO's own
    changes."""
    run = {key: value for key, value in preset.get("run", {}).items() if key not in ("learner", "serial")}
    own = _OWN_PRESETS.get(env_id, {})
    groups = {**preset, "run": run}
    return {group: {**groups.get(group, {}), **own.get(group, {})} for group in {*groups, *own}}


RECORD = AlgorithmRecord(
    name="appo",
    config_class=APPOConfig,
    settings_class=PPO_RECORD.settings_class,
    build="flare2.zoo.appo:build",
    # Not over entities: APPO's learner takes the zoo's actor-critic only.
    observations=tuple(kind for kind in PPO_RECORD.observations if kind != ENTITIES),
    actions=PPO_RECORD.actions,
    run=PPO_RECORD.run,
    agent=PPO_RECORD.agent,
    derived=PPO_RECORD.derived,
    # PPO's own presets, but never their --serial or --learner inline: APPO is for learning beside acting.
    presets={
        env_id: _beside_acting(env_id, preset)
        for env_id, preset in PPO_RECORD.presets.items()
        if env_id not in ENTITY_PRESETS
    },
    family_presets={family: _beside_acting(family, preset) for family, preset in PPO_RECORD.family_presets.items()},
    search_space={**PPO_RECORD.search_space, "rho_bar": ("choice", (1.0, 1.5, 2.0))},
)
