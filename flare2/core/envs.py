"""The stock Gymnasium agent: any env id with Box or Discrete spaces, one CT named by ``ct``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.agent import Agent, AgentHelper
from flare2.core.helpers import ExpReplayHelper, OnlineHelper
from flare2.core.specs import CTSpecs
from flare2.errors import ConfigError


def make_gym_env(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> gym.Env:
    """``gymnasium.make`` with an error that names the id and the fix."""
    try:
        return gym.make(env_id, **dict(env_kwargs or {}))
    except gym.error.Error as exc:
        raise ConfigError(
            f"cannot make Gymnasium environment {env_id!r} ({exc}): check the id "
            "(gymnasium.pprint_registry() lists them) or install the package that registers it"
        ) from None


class GymAgent(Agent):
    """Plays a Gymnasium env with one CT: input ``obs``, action ``action``, reward ``reward``.

    Experiences go to the CT every ``sample_interval`` steps (``OnlineHelper``),
    or, with ``replay`` (the keyword arguments of ``ExpReplayHelper``), into a
    replay buffer in this process that sends sampled transitions.

    Box actions are clipped to the space bounds before they reach the env; the
    stored action is the one the CT returned.
    """

    def __init__(
        self,
        env_id: str = "CartPole-v1",
        *,
        env_kwargs: dict[str, Any] | None = None,
        ct: str = "RL",
        sample_interval: int = 5,
        replay: dict[str, Any] | None = None,
    ) -> None:
        self.env_id = env_id
        self.env_kwargs = env_kwargs or {}
        self.ct = ct
        self.sample_interval = sample_interval
        self.replay = replay
        self._episodes = 0

    def make_env(self) -> gym.Env:
        return make_gym_env(self.env_id, self.env_kwargs)

    def helpers(self) -> dict[str, AgentHelper]:
        if self.replay is not None:
            try:
                return {self.ct: ExpReplayHelper(**self.replay)}
            except TypeError as exc:
                raise ConfigError(f"GymAgent replay options {self.replay} do not fit ExpReplayHelper: {exc}") from None
        return {self.ct: OnlineHelper(sample_interval=self.sample_interval)}

    def check_specs(self, specs: Mapping[str, CTSpecs]) -> None:
        ct_specs = specs[self.ct]
        if set(ct_specs.inputs) != {"obs"} or "action" not in ct_specs.actions or set(ct_specs.rewards) != {"reward"}:
            raise ConfigError(
                f"GymAgent sends input 'obs' and reward 'reward' and reads action 'action' (other action outputs are "
                f"stored with it), but CT {self.ct!r} "
                f"declares inputs {sorted(ct_specs.inputs)}, actions {sorted(ct_specs.actions)}, rewards "
                f"{sorted(ct_specs.rewards)}: use a model with those spec names or write your own Agent"
            )
        obs_spec = ct_specs.inputs["obs"]
        obs_shape = self.env.observation_space.shape
        if tuple(obs_shape or ()) != obs_spec.shape:
            raise ConfigError(
                f"env {self.env_id!r} gives observations of shape {obs_shape}, CT {self.ct!r} expects {obs_spec.shape}"
            )

    def _env_action(self, action: np.ndarray) -> Any:
        space = self.env.action_space
        if isinstance(space, gym.spaces.Box):
            return np.clip(action, space.low, space.high)
        return action

    def run_episode(self) -> None:
        specs = self.specs(self.ct)
        obs_dtype = specs.inputs["obs"].dtype
        # Seed only the first reset: later resets continue the env's own RNG stream.
        seed = self.seed if self._episodes == 0 else None
        self._episodes += 1
        obs, _ = self.env.reset(seed=seed)
        obs = np.asarray(obs, dtype=obs_dtype)
        states = self.initial_states(self.ct)
        while True:
            actions, next_states = self.predict(self.ct, {"obs": obs}, states)
            next_obs, reward, terminated, truncated, _ = self.env.step(self._env_action(actions["action"]))
            next_obs = np.asarray(next_obs, dtype=obs_dtype)
            self.store(
                self.ct,
                inputs={"obs": obs},
                actions=actions,
                rewards={"reward": np.float32(reward)},
                next_inputs={"obs": next_obs},
                terminated=terminated,
                truncated=truncated,
                states=states,
            )
            if terminated or truncated:
                return
            obs, states = next_obs, next_states
