"""Env engines: what steps the envs of an agent process. Imports no torch: agent processes import this module.

An engine steps a group of envs in lockstep: ``reset(seeds)`` starts them all,
``step(actions)`` steps them all and restarts those whose episode ended, and
gives back an ``EnvsStep``. GymAgent asks one engine per request it sends
(two with double buffering). The engines, by ``--env-engine``:

- ``python``: K Gymnasium envs, each made with ``make_gym_env`` and stepped
  one after another in this process. It plays every env flare2 can carry.
- ``gymnasium``: the same K envs inside Gymnasium's ``SyncVectorEnv``: the
  seam through which any Gymnasium ``VectorEnv`` plays (a ``GymAgent``
  subclass may return its own from ``make_vector_envs``); it needs
  ``autoreset_mode`` ``SAME_STEP`` (Gymnasium 1.1 and later).
- ``ale``: ALE's own C++ vector env (``ale_py.vector_env.AtariVectorEnv``),
  which steps Atari games on native threads with the published
  preprocessing done inside: no-op starts, 4 frames a step max-pooled, 84x84
  grayscale, FIRE at the start of a game, raw rewards (the presets clip
  them for learning). A lost life ends the episode for learning while the
  game goes on (``LEARNING_EPISODE_ENDS``), as with the Python preprocessing;
  one difference: ALE presses FIRE only at the start of a game, not after a
  lost life (the policy learns to).
- ``auto``: ``ale`` for an Atari game with the preprocessing where ale-py has
  its vector env, else ``python``.

Frames are not stacked by the engine: the presets stack them as a view of
the last 4 observations (``--frames 4``), which sends each new frame once.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.env_making import (
    ENV_EXTRAS,
    FRAME_SKIP,
    LEARNING_EPISODE_ENDS,
    NOOP_MAX,
    SCREEN_SIZE,
    is_atari,
    make_gym_env,
    registered_id,
)
from flare2.errors import ConfigError

ENGINES = ("auto", "python", "gymnasium", "ale")
"""The values of ``--env-engine`` (the module docstring says what each steps)."""
DEFAULT_ENGINE = "auto"
"""The engine of ``flare2 train`` and of a GymAgent that names none (docs/benchmarks.md has the figures behind it)."""

_C_INT_SEEDS = 2**31 - 1
_ALE_MAX_FRAMES = 108_000
"""Frames a game of ALE's ``v5`` ids may last before it is truncated (30 minutes of play), for both paths."""


@dataclass
class EnvsStep:
    """One step of a group of envs, one row per env.

    ``observations`` are what each env acts on next: for an env whose episode
    ended, the first observation of its next one; ``final`` holds, by env
    index, the last observation of each episode that ended (the one its
    stored step must keep). ``lost_lives`` marks envs whose episode ended for
    learning only (a lost life): they play on, so they are in neither
    ``final`` nor ``terminated``. ``infos`` holds the asked-for ``info``
    entries by name, each a list of one value (or None) per env.
    """

    observations: Sequence[Any] | np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    lost_lives: np.ndarray
    final: dict[int, Any]
    infos: dict[str, list[Any]] = field(default_factory=dict)


class PythonEnvs:
    """The ``python`` engine: Gymnasium envs stepped one after another in this process."""

    def __init__(self, envs: Sequence[Any]) -> None:
        self.envs = list(envs)
        self.count = len(self.envs)

    def reset(self, seeds: Sequence[int]) -> list[Any]:
        return [env.reset(seed=seed)[0] for env, seed in zip(self.envs, seeds)]

    def step(self, actions: Sequence[Any] | np.ndarray, info_keys: Sequence[str] = ()) -> EnvsStep:
        count = self.count
        observations: list[Any] = [None] * count
        rewards = np.empty(count, np.float64)
        terminated, truncated, lost_lives = np.empty(count, bool), np.empty(count, bool), np.zeros(count, bool)
        infos: dict[str, list[Any]] = {key: [None] * count for key in info_keys}
        final: dict[int, Any] = {}
        for index, env in enumerate(self.envs):
            observation, rewards[index], terminated[index], truncated[index], info = env.step(actions[index])
            for key in info_keys:
                infos[key][index] = info.get(key)
            if terminated[index] or truncated[index]:
                final[index] = observation
                observation = env.reset()[0]
            elif info.get(LEARNING_EPISODE_ENDS):
                lost_lives[index] = True
            observations[index] = observation
        return EnvsStep(observations, rewards, terminated, truncated, lost_lives, final, infos)


class VectorEnvs:
    """Any Gymnasium ``VectorEnv`` that resets an env within the step its episode ends (``SAME_STEP``), as an engine.

    It may mark lost lives in ``info[LEARNING_EPISODE_ENDS]`` (a bool per env), as ``AleGames`` does.
    """

    def __init__(self, vector_env: Any, owner: str) -> None:
        """``owner`` names whose vector env it is in the error for one that resets on the next step."""
        mode = getattr(vector_env, "metadata", {}).get("autoreset_mode")
        if str(getattr(mode, "value", mode)) != "SameStep":
            raise ConfigError(
                f"{owner} VectorEnv resets envs with autoreset mode {mode}, and flare2 keeps the last "
                "observation of each episode from the step that ends it: make it with "
                "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP (Gymnasium 1.1 or later)"
            )
        self.vector_env = vector_env
        self.count = int(vector_env.num_envs)

    def reset(self, seeds: Sequence[int]) -> Sequence[Any] | np.ndarray:
        return _per_env(self.vector_env.reset(seed=list(seeds))[0], self.count)

    def step(self, actions: Sequence[Any] | np.ndarray, info_keys: Sequence[str] = ()) -> EnvsStep:
        observations, rewards, terminated, truncated, info = self.vector_env.step(np.asarray(actions))
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        ended = np.flatnonzero(terminated | truncated)
        final: dict[int, Any] = {}
        if ended.size:
            final_obs = info["final_obs"]
            final = {int(index): final_obs[index] for index in ended}
        lost = info.get(LEARNING_EPISODE_ENDS)
        lost_lives = np.zeros(self.count, bool) if lost is None else np.asarray(lost, bool) & ~(terminated | truncated)
        infos = {key: _per_env_info(info, key, self.count) for key in info_keys}
        return EnvsStep(
            _per_env(observations, self.count),
            np.asarray(rewards, np.float64),
            terminated,
            truncated,
            lost_lives,
            final,
            infos,
        )


def _per_env(observations: Any, count: int) -> Sequence[Any] | np.ndarray:
    """A vector env's batch of observations as rows: a Dict space's batch (a dict of arrays) as one dict per env."""
    if isinstance(observations, dict):
        return [{key: value[index] for key, value in observations.items()} for index in range(count)]
    return observations


def _per_env_info(info: Mapping[str, Any], key: str, count: int) -> list[Any]:
    """One value (or None) per env of a vector env's ``info`` entry (Gymnasium marks where it is set in ``_key``)."""
    if key not in info:
        return [None] * count
    values, present = info[key], info.get("_" + key, np.ones(count, bool))
    return [values[index] if present[index] else None for index in range(count)]


class AleGames(gym.vector.VectorWrapper):
    """ALE's ``AtariVectorEnv`` as flare2 plays Atari (the module docstring): one 84x84 frame per observation, raw
    rewards, ``terminated`` only at the end of a game, and each lost life in ``info[LEARNING_EPISODE_ENDS]``.

    ALE is asked to report lost lives as terminations (``life_loss_info``) while the game goes on; an env whose game
    ended was reset within the step, so its ``lives`` are those of the new game. A termination with fewer lives
    than the step before is therefore a lost life, and any other termination the end of a game (games without
    lives always report 0).
    """

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        frame = gym.spaces.Box(0, 255, (SCREEN_SIZE, SCREEN_SIZE), np.uint8)
        self.single_observation_space = frame
        self.observation_space = gym.vector.utils.batch_space(frame, env.num_envs)
        self._lives = np.zeros(env.num_envs, np.int64)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        # ALE's vector env takes one seed per env as an array (where VectorEnv's signature says one int), each a C int.
        seeds = None if seed is None else np.asarray(seed, np.int64) % _C_INT_SEEDS
        observations, info = self.env.reset(seed=seeds, options=options)  # type: ignore[arg-type]
        self._lives = np.asarray(info["lives"], np.int64).copy()
        return observations[:, 0], info

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        observations, rewards, terminated, truncated, info = self.env.step(actions)
        lives = np.asarray(info["lives"], np.int64)
        lost_life = terminated & (lives < self._lives)
        self._lives = lives.copy()
        info = dict(info)
        info[LEARNING_EPISODE_ENDS] = lost_life
        if "final_obs" in info:
            info["final_obs"] = info["final_obs"][:, 0]
        return observations[:, 0], rewards, terminated & ~lost_life, truncated, info


def ale_vector_env(env_id: str, count: int, env_kwargs: Mapping[str, Any], threads: int) -> AleGames:
    """The ``ale`` engine's vector env of ``count`` games of ``env_id`` (a ConfigError for an id it cannot play)."""
    from ale_py.vector_env import AtariVectorEnv

    unknown = sorted(set(env_kwargs) - {"max_episode_steps"})
    if unknown:
        raise ConfigError(
            f"--env-engine ale plays {env_id!r} with the published settings and takes no env kwargs {unknown}: "
            "use --env-engine python for those"
        )
    spec = gym.registry[registered_id(env_id)]
    game = spec.kwargs.get("game") if isinstance(spec.kwargs, dict) else None
    if not isinstance(game, str):
        raise ConfigError(f"--env-engine ale cannot tell the game of {env_id!r}: use --env-engine python")
    # The Python path's time limit counts ALE's own frames too (it wraps the game beneath the preprocessing).
    max_frames = int(env_kwargs.get("max_episode_steps") or _ALE_MAX_FRAMES)
    return AleGames(
        AtariVectorEnv(
            game,
            count,
            num_threads=threads,
            max_num_frames_per_episode=max_frames,
            repeat_action_probability=0.0,
            autoreset_mode="SameStep",
            img_height=SCREEN_SIZE,
            img_width=SCREEN_SIZE,
            grayscale=True,
            stack_num=1,
            frameskip=FRAME_SKIP,
            maxpool=True,
            noop_max=NOOP_MAX,
            episodic_life=False,
            life_loss_info=True,
            reward_clipping=False,
            use_fire_reset=True,
        )
    )


def gymnasium_vector_env(make_env: Callable[[], gym.Env], count: int) -> Any:
    """The ``gymnasium`` engine's vector env: ``count`` envs of ``make_env`` in a ``SyncVectorEnv``."""
    try:
        mode = gym.vector.AutoresetMode.SAME_STEP
    except AttributeError:
        raise ConfigError(
            "--env-engine gymnasium needs Gymnasium 1.1 or later (same-step autoreset): pip install -U gymnasium"
        ) from None
    return gym.vector.SyncVectorEnv([make_env] * count, autoreset_mode=mode)


def engine_threads(agent_processes: int) -> int:
    """Native threads for each of ``agent_processes`` engines: the cores this process may use, shared out (each agent
    process also runs Python of its own, and one engine thread per core is the most that pays)."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, agent_processes))


def resolve_engine(engine: str, env_id: str, preprocessing: bool) -> str:
    """The engine ``engine`` names for ``env_id``: ``auto`` resolved; a ConfigError for one that cannot play it."""
    if engine not in ENGINES:
        raise ConfigError(f"--env-engine {engine!r}: choose one of {', '.join(ENGINES)}")
    atari = preprocessing and is_atari(env_id)
    if engine == "auto":
        return "ale" if atari and _has_ale_vector_env() else "python"
    if engine == "ale" and not _has_ale_vector_env():
        _, extra = ENV_EXTRAS["ALE"]
        raise ConfigError(
            f'--env-engine ale needs ale-py 0.10 or later, which has a vector env: pip install -U "flare2[{extra}]"'
        )
    if engine == "ale" and not atari:
        raise ConfigError(
            f"--env-engine ale plays ale-py's Atari games with their preprocessing, and {env_id!r} is "
            f"{'played raw (--no-env-preprocessing)' if is_atari(env_id) else 'no Atari game'}: "
            "use --env-engine python (or auto)"
        )
    return engine


def _has_ale_vector_env() -> bool:
    return importlib.util.find_spec("ale_py") is not None and importlib.util.find_spec("ale_py.vector_env") is not None


def make_engine_env(
    engine: str, env_id: str, env_kwargs: Mapping[str, Any], count: int, *, preprocessing: bool, threads: int = 1
) -> Any:
    """The vector env of a resolved engine other than ``python``, for ``count`` envs."""
    if engine == "ale":
        return ale_vector_env(env_id, count, env_kwargs, threads)
    return gymnasium_vector_env(lambda: make_gym_env(env_id, env_kwargs, preprocessing=preprocessing), count)
