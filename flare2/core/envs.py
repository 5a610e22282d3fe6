"""The stock Gymnasium agent: any env id with Box or Discrete spaces, several envs per process, one CT named by ``ct``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.agent import AgentHelper, VectorAgent
from flare2.core.helpers import ExpReplayHelper, OnlineHelper
from flare2.core.specs import CTSpecs, Spec
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


class GymAgent(VectorAgent):
    """Plays ``num_envs`` copies of a Gymnasium env with one CT: input ``obs``, action ``action``, reward ``reward``.

    Each step asks the CT once for the actions of every env (``--envs-per-agent``
    of them), steps them all, resets the ones whose episode ended and stores the
    step of every env. Experiences go to the CT every ``sample_interval`` steps
    (``OnlineHelper``: one learn request ``[num_envs, sample_interval, ...]``),
    or, with ``replay`` (the keyword arguments of ``ExpReplayHelper``), into a
    replay buffer in this process that sends sampled sequences.

    Episode edges (DESIGN §6): ``terminated`` and ``truncated`` are Gymnasium's;
    the stored ``next_inputs`` row of an env whose episode ended is its final
    observation, and the env starts its next episode from the observation
    ``reset()`` gives. Each env is seeded apart (``env_seed``) at its first reset.

    With evaluation episodes (``eval_every``), ``eval_env`` plays one greedy
    episode after every ``eval_every`` training episodes of this process, as one
    more row of the same requests; nothing of it is stored.

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
        obs_shape = self.envs[0].observation_space.shape
        if tuple(obs_shape or ()) != obs_spec.shape:
            raise ConfigError(
                f"env {self.env_id!r} gives observations of shape {obs_shape}, CT {self.ct!r} expects {obs_spec.shape}"
            )

    def run(self) -> None:
        ct, envs, count = self.ct, self.envs, self.num_envs
        specs = self.specs(ct)
        obs_spec, reward_dtype = specs.inputs["obs"], specs.rewards["reward"].dtype
        space = envs[0].action_space
        clip = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        obs = obs_spec.zeros(count)
        for index, env in enumerate(envs):
            obs[index] = env.reset(seed=self.env_seed(index))[0]
        states = self.initial_states(ct, count)
        evaluation = _EvaluationEpisodes(self, obs_spec) if self.eval_env is not None else None
        while True:
            if evaluation is not None and evaluation.playing:
                inputs, row_states, greedy = evaluation.with_row(obs, states)
            else:
                inputs, row_states, greedy = obs, states, None
            actions, next_states = self.predict_rows(ct, {"obs": inputs}, row_states, greedy=greedy)
            env_actions = actions["action"] if clip is None else np.clip(actions["action"], *clip)
            # Fresh arrays every step: the helper keeps what it is given.
            next_obs = np.empty_like(obs)
            rewards = np.empty(count, reward_dtype)
            terminated, truncated = np.empty(count, bool), np.empty(count, bool)
            for index, env in enumerate(envs):
                next_obs[index], rewards[index], terminated[index], truncated[index], _ = env.step(env_actions[index])
            if greedy is not None:
                evaluation.step(env_actions[count], {key: value[count:] for key, value in next_states.items()})
                actions = {key: value[:count] for key, value in actions.items()}
                next_states = {key: value[:count] for key, value in next_states.items()}
            self.store_rows(ct, inputs={"obs": obs}, actions=actions, rewards={"reward": rewards},
                            next_inputs={"obs": next_obs}, terminated=terminated, truncated=truncated, states=states)
            ended = np.flatnonzero(terminated | truncated)
            obs, states = next_obs, next_states
            if ended.size:
                # The stored next_obs keeps the final observations; the next step starts from the reset ones.
                obs = next_obs.copy()
                states = {key: value.copy() for key, value in next_states.items()}
                for index in ended:
                    obs[index] = envs[index].reset()[0]
                    for value in states.values():
                        value[index] = 0
                if evaluation is not None:
                    evaluation.training_episodes_ended(ended.size)


class _EvaluationEpisodes:
    """The schedule and state of ``eval_env``: one greedy episode after every ``eval_every`` training episodes."""

    def __init__(self, agent: GymAgent, obs_spec: Spec) -> None:
        self.agent = agent
        self.env = agent.eval_env
        self.obs = obs_spec.zeros(1)
        self.states = agent.initial_states(agent.ct, 1)
        self.playing = False
        self.started = 0
        self.trained = 0

    def training_episodes_ended(self, count: int) -> None:
        self.trained += count
        if not self.playing and self.trained >= self.agent.eval_every * (self.started + 1):
            seed = self.agent.env_seed(self.agent.num_envs) if self.started == 0 else None
            self.obs[0] = self.env.reset(seed=seed)[0]
            self.states = self.agent.initial_states(self.agent.ct, 1)
            self.playing = True
            self.started += 1

    def with_row(self, obs: np.ndarray, states: dict[str, np.ndarray]) -> tuple[np.ndarray, dict, np.ndarray]:
        """The training rows plus the evaluation row, and the mask that asks greedy actions for it."""
        greedy = np.zeros(len(obs) + 1, bool)
        greedy[-1] = True
        rows = {key: np.concatenate([value, self.states[key]]) for key, value in states.items()}
        return np.concatenate([obs, self.obs]), rows, greedy

    def step(self, action: Any, next_states: dict[str, np.ndarray]) -> None:
        observation, _, terminated, truncated, _ = self.env.step(action)
        self.obs[0] = observation
        self.states = next_states
        if terminated or truncated:
            self.playing = False
