"""The agent of examples/cartpole_multi_ct.py: it asks two CTs at every step. Imports no torch."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from flare2 import Agent, AgentHelper, ConfigError, CTSpecs, OnlineHelper
from flare2.core.env_making import make_gym_env


class PolicyAndAuxAgent(Agent):
    """Plays with CT ``policy`` and asks CT ``aux`` how likely the episode is to end at the next step.

    Each CT has its own helper, so each gets its own learn requests (and its
    own batching in its own CDP). One env per process: an ``Agent`` with
    ``run_episode``, the simplest kind to write.
    """

    def __init__(self, env_id: str = "CartPole-v1", sample_interval: int = 5) -> None:
        self.env_id = env_id
        self.sample_interval = sample_interval
        self._episodes = 0

    def make_env(self):
        return make_gym_env(self.env_id)

    def helpers(self) -> dict[str, AgentHelper]:
        return {
            "policy": OnlineHelper(sample_interval=self.sample_interval),
            "aux": OnlineHelper(sample_interval=self.sample_interval),
        }

    def check_specs(self, specs: Mapping[str, CTSpecs]) -> None:
        for ct in ("policy", "aux"):
            if "obs" not in specs[ct].inputs:
                raise ConfigError(f"CT {ct!r} must take the observation as input 'obs'")

    def run_episode(self) -> None:
        obs_dtype = self.specs("policy").inputs["obs"].dtype
        seed = self.seed if self._episodes == 0 else None
        self._episodes += 1
        obs, _ = self.env.reset(seed=seed)
        obs = np.asarray(obs, dtype=obs_dtype)
        while True:
            actions, _ = self.predict("policy", {"obs": obs})
            predicted, _ = self.predict("aux", {"obs": obs})
            next_obs, reward, terminated, truncated, _ = self.env.step(actions["action"])
            next_obs = np.asarray(next_obs, dtype=obs_dtype)
            step = {
                "inputs": {"obs": obs},
                "next_inputs": {"obs": next_obs},
                "rewards": {"reward": np.float32(reward)},
                "terminated": terminated,
                "truncated": truncated,
            }
            self.store("policy", actions=actions, **step)
            self.store("aux", actions=predicted, **step)
            if terminated or truncated:
                return
            obs = next_obs
