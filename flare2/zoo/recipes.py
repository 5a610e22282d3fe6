"""What ``flare2 train`` runs: for each zoo algorithm, its settings, which spaces it takes, how it is built for an
env, how its agents send experience, and the presets it starts from. Imports no torch (the manager reads it).

A preset is plain data, the same form ``flare2 train`` writes as ``train.json`` in the run's log dir (so a run's
file is a preset that repeats it)::

    {"algo": "ppo", "env": "CartPole-v1",
     "algorithm": {"lr": 0.001},                      # fields of the algorithm's config (PPOConfig...)
     "agent": {"sample_interval": 32},                 # fields of its agent settings (ActorCriticSettings...)
     "run": {"num_agents": 1, "envs_per_agent": 8}}    # run options by their field names, as --help lists them
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from flare2.errors import ConfigError
from flare2.zoo.configs import A2CConfig, DQNConfig, PPOConfig, RecurrentPPOConfig, SARSAConfig, TD3Config
from flare2.zoo.envs import CARTPOLE_NO_VELOCITY


@dataclass(frozen=True)
class OnlineSettings:
    """The agent side of an on-policy algorithm: the online helper."""

    sample_interval: int = 5
    """Env steps per env in each learn request."""
    complete_episodes: bool = False
    """Send whole episodes (sample_interval steps per env of them together) instead of fragments."""


@dataclass(frozen=True)
class ActorCriticSettings(OnlineSettings):
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the actor-critic MLP."""
    frames: int = 1
    """Observations the MLP sees at once, the current one last (a frame-stack view)."""


@dataclass(frozen=True)
class RecurrentSettings(OnlineSettings):
    memory_size: int = 64
    """Size of the GRU state."""


@dataclass(frozen=True)
class QSettings(OnlineSettings):
    hidden: tuple[int, ...] = ()
    """Hidden layer sizes of the Q-network (none: linear in the one-hot state or the observation)."""


@dataclass(frozen=True)
class ReplaySettings:
    """The agent side of an off-policy algorithm: a replay buffer in each agent process."""

    buffer: int = 100_000
    """Replay capacity over all agents (each keeps its share)."""
    warmup: int = 1_000
    """Steps stored over all agents before learning starts."""
    sample_interval: int = 2
    """Env steps per agent between learn requests."""
    batch_size: int = 64
    """Sampled sequences per learn request."""
    n_step: int = 1
    """Steps of the return each target is made of."""


@dataclass(frozen=True)
class DQNSettings(ReplaySettings):
    hidden: tuple[int, ...] = (128, 128)
    """Hidden layer sizes of the Q-network."""


def _box(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box)


def _vector_action(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Discrete) or (_box(space) and len(space.shape) == 1)


def _mlp_observation(space: gym.Space) -> bool:
    if isinstance(space, gym.spaces.Dict):
        return set(space.spaces) == {"obs", "action_mask"} and _mlp_observation(space["obs"])
    return _box(space) or isinstance(space, gym.spaces.Discrete)


def _flat_observation(space: gym.Space) -> bool:
    return _box(space) or isinstance(space, gym.spaces.Discrete)


@dataclass(frozen=True)
class Recipe:
    """One zoo algorithm as ``flare2 train`` runs it."""

    config_class: type
    settings_class: type
    takes: str
    """The spaces it takes, in words, for the message when an env's do not fit."""
    fits: Callable[[gym.Space, gym.Space], bool]
    run: dict[str, Any] = field(default_factory=dict)
    """Run options it starts from when no preset gives them (field names of ``add_run_options``)."""
    agent: dict[str, Any] = field(default_factory=dict)
    """Its agent settings' starting point."""
    derived: dict[str, str] = field(default_factory=dict)
    """Config fields whose default is another option's value (``{"anneal_steps": "max_steps"}``)."""


RECIPES: dict[str, Recipe] = {
    "a2c": Recipe(
        A2CConfig, ActorCriticSettings, "Box, Discrete or {obs, action_mask} observations and Discrete or 1-d Box actions",
        lambda obs, act: _mlp_observation(obs) and _vector_action(act),
        run={"num_agents": 1, "envs_per_agent": 8, "max_steps": 500_000, "learner": "inline"},
    ),
    "ppo": Recipe(
        PPOConfig, ActorCriticSettings, "Box, Discrete or {obs, action_mask} observations and Discrete or 1-d Box actions",
        lambda obs, act: _mlp_observation(obs) and _vector_action(act),
        run={"num_agents": 1, "envs_per_agent": 8, "max_steps": 100_000, "learn_max_wait_ms": 200.0},
        agent={"sample_interval": 32}, derived={"anneal_steps": "max_steps"},
    ),
    "recurrent-ppo": Recipe(
        RecurrentPPOConfig, RecurrentSettings, "Box or Discrete observations and Discrete actions",
        lambda obs, act: _flat_observation(obs) and isinstance(act, gym.spaces.Discrete),
        run={"num_agents": 8, "envs_per_agent": 1, "max_steps": 150_000, "learn_max_wait_ms": 200.0},
        agent={"sample_interval": 32}, derived={"anneal_steps": "max_steps"},
    ),
    "dqn": Recipe(
        DQNConfig, DQNSettings, "Box or Discrete observations and Discrete actions",
        lambda obs, act: _flat_observation(obs) and isinstance(act, gym.spaces.Discrete),
        run={"num_agents": 8, "envs_per_agent": 1, "max_steps": 100_000},
        agent={"n_step": 3}, derived={"anneal_steps": "max_steps"},
    ),
    "sarsa": Recipe(
        SARSAConfig, QSettings, "Box or Discrete observations and Discrete actions",
        lambda obs, act: _flat_observation(obs) and isinstance(act, gym.spaces.Discrete),
        run={"num_agents": 8, "envs_per_agent": 1, "max_steps": 60_000, "learner": "inline"},
        agent={"sample_interval": 8},
    ),
    "td3": Recipe(
        TD3Config, ReplaySettings, "Box observations and 1-d Box actions",
        lambda obs, act: _box(obs) and _box(act) and len(act.shape) == 1,
        run={"num_agents": 8, "envs_per_agent": 1, "max_steps": 50_000},
        agent={"buffer": 200_000, "warmup": 2_000, "sample_interval": 1, "batch_size": 256},
        derived={"random_steps": "warmup"},
    ),
}
"""The algorithms of ``flare2 train --algo``."""


_ZOO_PPO_STEP = {"lr": 3e-4, "anneal_steps": None, "minibatch_size": 64}
"""Stable-Baselines3's PPO defaults, which rl-baselines3-zoo keeps for Acrobot and MountainCar."""

PRESETS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    # The examples' settings, measured in the README's results (rl-baselines3-zoo's where it has them).
    ("ppo", "CartPole-v1"): {},
    ("a2c", "CartPole-v1"): {},
    ("dqn", "CartPole-v1"): {"run": {"eval_every": 1}},
    ("td3", "Pendulum-v1"): {"algorithm": {"hidden": (64, 64)}},
    ("sarsa", "CliffWalking-v1"): {"algorithm": {"gamma": 1.0}, "run": {"max_episode_steps": 200, "eval_every": 2}},
    ("recurrent-ppo", CARTPOLE_NO_VELOCITY): {},
    # rl-baselines3-zoo's PPO settings for these two (VecNormalize as --normalize-observations, and for MountainCar a
    # fixed reward scale in place of its running one). Its learning rate and minibatch (3e-4 constant, 64) matter:
    # with the package's (1e-3 annealed, 256) greedy returns ended 5 to 13 short of its figures.
    ("ppo", "Acrobot-v1"): {"algorithm": {**_ZOO_PPO_STEP, "gamma": 0.99, "gae_lambda": 0.94, "epochs": 4},
                            "agent": {"sample_interval": 256},
                            "run": {"envs_per_agent": 16, "normalize_observations": True, "max_steps": 1_000_000}},
    ("ppo", "MountainCar-v0"): {"algorithm": {**_ZOO_PPO_STEP, "gamma": 0.99, "gae_lambda": 0.98, "epochs": 4},
                                "agent": {"sample_interval": 16},
                                "run": {"envs_per_agent": 16, "normalize_observations": True, "scale_rewards": 0.1,
                                        "max_steps": 1_000_000}},
    # rl-baselines3-zoo's DQN settings for Acrobot (its exploration, network, learning rate and buffer; a gradient step
    # of 128 transitions per env step, as its gradient_steps=-1), with flare2's soft target updates and 3-step returns.
    ("dqn", "Acrobot-v1"): {"algorithm": {"lr": 6.3e-4, "epsilon_end": 0.1, "exploration_steps": 12_000,
                                          "minibatch_size": 128},
                            "agent": {"hidden": (256, 256), "buffer": 50_000, "sample_interval": 1, "batch_size": 128},
                            "run": {"max_steps": 100_000}},
}
"""Known-good settings per (algorithm, env id), over the algorithm's own starting point."""

PRESET_GROUPS = ("algorithm", "agent", "run")


def registered_id(env_id: str) -> str:
    """The id without a ``module:`` prefix (Gymnasium imports the module, which registers it)."""
    return env_id.rsplit(":", 1)[-1]


def check_env_id(env_id: str) -> None:
    """A ConfigError naming an env id Gymnasium does not know, with the registered ids closest to it."""
    if ":" in env_id:
        return  # gymnasium.make imports the module first: the agent's own message names what is wrong
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "gymnasium.pprint_registry() lists the ids"
        raise ConfigError(f"--env {env_id!r} is no registered Gymnasium environment: {hint}")


def check_spaces(algo: str, env_id: str, observation_space: gym.Space, action_space: gym.Space) -> None:
    """A ConfigError naming the spaces of an env that ``algo`` does not take, and the algorithms that do."""
    if RECIPES[algo].fits(observation_space, action_space):
        return
    fitting = [name for name, recipe in RECIPES.items() if recipe.fits(observation_space, action_space)]
    fix = (f"try --algo {' or '.join(fitting)}" if fitting
           else "no zoo algorithm takes them: write your own Model and Algorithm (README: your own Model)")
    raise ConfigError(
        f"--algo {algo} takes {RECIPES[algo].takes}, but {env_id} has observation space {observation_space} and "
        f"action space {action_space}: {fix}"
    )


def preset(algo: str, env_id: str) -> dict[str, dict[str, Any]]:
    """The starting point of ``algo`` on ``env_id``: the algorithm's own, then the env's preset when there is one."""
    recipe = RECIPES[algo]
    chosen = PRESETS.get((algo, registered_id(env_id)), {})
    return {
        "algorithm": dict(chosen.get("algorithm", {})),
        "agent": {**recipe.agent, **chosen.get("agent", {})},
        "run": {**recipe.run, **chosen.get("run", {})},
    }


def check_preset(data: Any, source: str, known: Mapping[str, set[str]]) -> dict[str, dict[str, Any]]:
    """A preset read from ``source``, every key checked against the options that exist (``known`` per group)."""
    if not isinstance(data, dict) or not set(data) <= {"algo", "env", *PRESET_GROUPS}:
        raise ConfigError(f"preset {source} must be a JSON object of algo, env, {', '.join(PRESET_GROUPS)}")
    for group in PRESET_GROUPS:
        values = data.get(group, {})
        if not isinstance(values, dict):
            raise ConfigError(f"preset {source}: {group} must be a map of option names to values")
        unknown = sorted(set(values) - known[group])
        if unknown:
            raise ConfigError(
                f"preset {source}: {group} must be a map of option names, and {unknown} is not one of "
                f"{sorted(known[group])}"
            )
    return data


def settings_fields(settings_class: type) -> set[str]:
    return {f.name for f in dataclasses.fields(settings_class)}


def build(algo: str, env_id: str, env_kwargs: dict[str, Any], config: Any, settings: Any) -> Any:
    """The Algorithm of ``algo`` for ``env_id``, built in the compute process (torch is imported here)."""
    from flare2.core.envs import make_gym_env

    env = make_gym_env(env_id, env_kwargs)
    if algo == "a2c":
        from flare2.zoo.a2c import A2C
        from flare2.zoo.models import MLPActorCritic

        return A2C(MLPActorCritic(env.observation_space, env.action_space, hidden=settings.hidden,
                                  frames=settings.frames), config)
    if algo == "ppo":
        from flare2.zoo.ppo import PPO

        return PPO.for_env(env, config, frames=settings.frames, hidden=settings.hidden)
    if algo == "recurrent-ppo":
        from flare2.zoo.recurrent_ppo import RecurrentPPO

        return RecurrentPPO.for_env(env, config, hidden_size=settings.memory_size)
    if algo == "dqn":
        from flare2.zoo.dqn import DQN

        return DQN.for_env(env, config, settings.hidden)
    if algo == "sarsa":
        from flare2.zoo.sarsa import SARSA

        return SARSA.for_env(env, config, settings.hidden)
    from flare2.zoo.td3 import TD3

    return TD3.for_env(env, config)


def agent_kwargs(algo: str, env_id: str, env_kwargs: dict[str, Any], settings: Any, num_agents: int,
                 transforms: list[Any]) -> dict[str, Any]:
    """The stock GymAgent's keyword arguments for ``algo``: the online helper, or a replay buffer per agent."""
    kwargs: dict[str, Any] = {"env_id": env_id, "env_kwargs": env_kwargs, "ct": "RL", "transforms": transforms}
    if isinstance(settings, ReplaySettings):
        agents = max(num_agents, 1)
        kwargs["replay"] = {
            "capacity": max(settings.buffer // agents, settings.batch_size),
            "warmup": max(settings.warmup // agents, settings.n_step),
            "sample_interval": settings.sample_interval, "batch_size": settings.batch_size,
            "sequence_length": settings.n_step,
        }
    else:
        kwargs.update(sample_interval=settings.sample_interval, complete_episodes=settings.complete_episodes)
    return kwargs
