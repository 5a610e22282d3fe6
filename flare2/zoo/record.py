"""What ``flare2 train``, ``flare2 tune`` and ``flare2 eval`` know of an algorithm: one :class:`AlgorithmRecord`.

A record is torch-free data: the algorithm's config class, the agent settings it picks from this module, the spaces
it takes, its starting point and presets, its search space, and the import path of the function that builds it. The
manager reads records without loading torch; the compute process imports the build function by its path.

A preset is plain data, the same form ``flare2 train`` writes as ``train.json`` in the run's log dir (so a run's
file is a preset that repeats it)::

    {"algo": "ppo", "env": "CartPole-v1",
     "algorithm": {"lr": 0.001},                      # fields of the algorithm's config (PPOConfig...)
     "agent": {"sample_interval": 32},                 # fields of its agent settings (ActorCriticSettings...)
     "run": {"num_agents": 1, "envs_per_agent": 8}}    # run options by their field names, as --help lists them
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from flare2.core.env_making import env_spaces, is_atari, is_classic_game, is_minatar, registered_id
from flare2.core.spaces import holds_entities
from flare2.errors import ConfigError

# Observation spaces a record may take. DICT is a Dict of observations of the record's other kinds (an image and
# vectors, say), with or without the "action_mask" the stock agent hands to the model.
BOX = "Box"
DISCRETE = "Discrete"
DICT = "Dict of those"
ENTITIES = "Dict of entities (Sequence keys) with a Dict of actions over them"
OBSERVATION_KINDS = (BOX, DISCRETE, DICT, ENTITIES)
# Action spaces a record may take: DISCRETE, or a Box of one dimension.
VECTOR_BOX = "1-d Box"
ACTION_KINDS = (DISCRETE, VECTOR_BOX)

PRESET_FAMILIES: dict[str, Callable[[str], bool]] = {
    "Atari": is_atari,
    "MinAtar": is_minatar,
    "PettingZoo classic": is_classic_game,
}
"""Kinds of env that share one preset (``AlgorithmRecord.family_presets``), by the test of an env id: ``Atari`` is
every game of ale-py (``ALE/Breakout-v5``, ``PongNoFrameskip-v4``...), played with its published preprocessing;
``MinAtar`` every game of MinAtar (``MinAtar/Breakout-v1``...); ``PettingZoo classic`` every classic game of
PettingZoo played in turns (``pettingzoo.classic.tictactoe_v3``...)."""

PRESET_GROUPS = ("algorithm", "agent", "run")
"""The parts of a preset: the config's fields, the agent settings' fields, run options."""

SEARCH_KINDS = ("log", "float", "int", "choice")
"""How ``flare2 tune`` samples a setting: (kind, bounds), ``"log"`` and ``"float"`` a float in ``(low, high)``
(log-uniformly for ``"log"``), ``"int"`` an integer in ``(low, high)``, ``"choice"`` one of the values."""

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class OnlineSettings:
    """The agent side of an on-policy algorithm: the online helper."""

    sample_interval: int = 5
    """Env steps per env in each learn request."""
    complete_episodes: bool = False
    """Send whole episodes (sample_interval steps per env of them together) instead of fragments."""
    double_buffer: bool = False
    """Each agent plays its envs in two halves that alternate: one half steps while the compute process answers
    the other's request (Sample Factory's double buffering)."""

    def helper_kwargs(self, num_agents: int) -> dict[str, Any]:
        """The stock GymAgent's keyword arguments for its helper, and how it plays its envs."""
        return {
            "sample_interval": self.sample_interval,
            "complete_episodes": self.complete_episodes,
            "double_buffer": self.double_buffer,
        }


CRITICS = ("own", "state")
"""What an actor-critic's critic may see (``ActorCriticSettings.critic``)."""


@dataclass(frozen=True)
class ActorCriticSettings(OnlineSettings):
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the actor-critic MLPs (over an image: of its heads, after the CNN)."""
    activation: str = "tanh"
    """The activation of those hidden layers: tanh or relu."""
    frames: int = 1
    """Observations the model sees at once, the current one last (a frame-stack view)."""
    encoder: str = "auto"
    """The CNN of image observations: auto, nature, impala, minatar or flat (flare2.zoo.encoders)."""
    critic: str = "own"
    """What the critic sees: own (the observation, as the policy: IPPO for the agents of a multi-agent env) or state
    (the game's global state, state(), of a multi-agent env that has one: MAPPO's centralised critic)."""

    def __post_init__(self) -> None:
        check_frames(self.frames)
        if self.critic not in CRITICS:
            raise ConfigError(f"--critic must be one of {', '.join(CRITICS)}, got {self.critic!r}")

    def model_kwargs(self, env: Any) -> dict[str, Any]:
        """The zoo actor-critic's keyword arguments these settings give for ``env`` (``flare2.zoo.models.ActorCritic``);
        a ConfigError for a centralised critic over an env without a global state."""
        state_space = getattr(env, "state_space", None) if self.critic == "state" else None
        if self.critic == "state" and state_space is None:
            raise ConfigError(
                "--critic state needs a multi-agent env with a global state (a PettingZoo env's state()): this env "
                "has none; give --critic own"
            )
        return {
            "hidden": self.hidden,
            "activation": self.activation,
            "frames": self.frames,
            "encoder": self.encoder,
            "critic_space": state_space,
        }


@dataclass(frozen=True)
class RecurrentSettings(OnlineSettings):
    memory_size: int = 64
    """Size of the GRU state."""
    encoder: str = "auto"
    """The CNN under the GRUs for image observations: auto, nature, impala, minatar or flat (flare2.zoo.encoders)."""


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

    def helper_kwargs(self, num_agents: int) -> dict[str, Any]:
        """The stock GymAgent's keyword arguments for its helper: each of ``num_agents`` keeps its share."""
        agents = max(num_agents, 1)
        return {
            "replay": {
                "capacity": max(self.buffer // agents, self.batch_size),
                "warmup": max(self.warmup // agents, self.n_step),
                "sample_interval": self.sample_interval,
                "batch_size": self.batch_size,
                "sequence_length": self.n_step,
            }
        }


@dataclass(frozen=True)
class DQNSettings(ReplaySettings):
    hidden: tuple[int, ...] = (128, 128)
    """Hidden layer sizes of the Q-network (over an image: after the CNN)."""
    frames: int = 1
    """Observations the Q-network sees at once, the current one last (a frame-stack view)."""
    encoder: str = "auto"
    """The CNN of image observations: auto, nature, impala, minatar or flat (flare2.zoo.encoders)."""

    def __post_init__(self) -> None:
        check_frames(self.frames)


def check_frames(frames: int) -> None:
    """A frame stack of at least the current observation (``--frames 1``: no stack)."""
    if type(frames) is not int or frames < 1:
        raise ConfigError(f"--frames {frames!r}: a model sees at least the current observation, use --frames 1 or more")


@dataclass(frozen=True, kw_only=True)
class AlgorithmRecord:
    """One algorithm as ``flare2 train --algo NAME`` runs it, ``flare2 tune`` searches it and ``flare2 eval`` plays it.

    Each zoo algorithm has one, in ``flare2/zoo/records/``; an algorithm of your own joins them through
    :func:`flare2.zoo.register` or a ``flare2.algorithms`` entry point (``flare2.zoo.registry`` tells how).
    The settings of a run start from ``agent`` and ``run``, then the preset of its env, then the command line.
    """

    name: str
    """What ``--algo`` calls it."""
    config_class: type
    """The algorithm's config: a frozen dataclass whose fields (each with a docstring) become command-line options."""
    settings_class: type
    """Its agents' settings: OnlineSettings or ReplaySettings, or a subclass with fields of the algorithm's network."""
    build: str
    """``package.module:function`` of ``function(env, config, settings) -> Algorithm``, imported in the compute process
    only (it may import torch; nothing else in the record may)."""
    observations: tuple[str, ...]
    """The observation spaces it takes, of OBSERVATION_KINDS."""
    actions: tuple[str, ...]
    """The action spaces it takes, of ACTION_KINDS."""
    run: Mapping[str, Any] = field(default_factory=dict)
    """Run options it starts from when no preset gives them (field names of ``add_run_options``)."""
    agent: Mapping[str, Any] = field(default_factory=dict)
    """Its agent settings' starting point."""
    derived: Mapping[str, str] = field(default_factory=dict)
    """Config fields whose default is another option's value (``{"anneal_steps": "max_steps"}``)."""
    presets: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Known-good settings per env id (``{"algorithm": ..., "agent": ..., "run": ...}``) over its starting point."""
    family_presets: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Known-good settings per kind of env (a key of ``PRESET_FAMILIES``: ``Atari``), for the ids without a preset
    of their own."""
    search_space: Mapping[str, tuple[str, Any]] = field(default_factory=dict)
    """What ``flare2 tune`` searches: config or agent setting name to ``(kind, bounds)`` of SEARCH_KINDS."""

    def __post_init__(self) -> None:
        where = f"AlgorithmRecord {self.name!r}"
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", self.name):
            raise ConfigError(
                f"AlgorithmRecord.name must be a word such as 'my-ppo' (what --algo takes), got {self.name!r}"
            )
        for kind_name in ("config_class", "settings_class"):
            value = getattr(self, kind_name)
            if not (isinstance(value, type) and dataclasses.is_dataclass(value)):
                raise ConfigError(
                    f"{where}: {kind_name} must be a dataclass (its fields become options), got {value!r}"
                )
        if not issubclass(self.settings_class, (OnlineSettings, ReplaySettings)):
            raise ConfigError(
                f"{where}: settings_class must be OnlineSettings or ReplaySettings (flare2.zoo.record) "
                f"or a subclass of one, got {self.settings_class.__name__}"
            )
        if not isinstance(self.build, str) or not _IMPORT_PATH.match(self.build):
            raise ConfigError(
                f"{where}: build must be the import path 'package.module:function' of the function that "
                f"builds the Algorithm (imported in the compute process only), got {self.build!r}"
            )
        _check_kinds(where, "observations", self.observations, OBSERVATION_KINDS)
        _check_kinds(where, "actions", self.actions, ACTION_KINDS)
        config_fields, settings_fields = field_names(self.config_class), field_names(self.settings_class)
        _check_names(f"{where}: agent", self.agent, settings_fields)
        _check_names(f"{where}: derived", self.derived, config_fields)
        unknown_families = sorted(set(self.family_presets) - set(PRESET_FAMILIES))
        if unknown_families:
            raise ConfigError(
                f"{where}: family_presets names {unknown_families}, which are not among {sorted(PRESET_FAMILIES)}"
            )
        for env_id, preset in {**self.presets, **self.family_presets}.items():
            if not set(preset) <= set(PRESET_GROUPS):
                raise ConfigError(
                    f"{where}: the preset of {env_id} must be a map of {', '.join(PRESET_GROUPS)}, got {sorted(preset)}"
                )
            _check_names(f"{where}: the preset of {env_id}: algorithm", preset.get("algorithm", {}), config_fields)
            _check_names(f"{where}: the preset of {env_id}: agent", preset.get("agent", {}), settings_fields)
        _check_names(f"{where}: search_space", self.search_space, config_fields | settings_fields)
        for name, space in self.search_space.items():
            _check_search(f"{where}: search_space[{name!r}]", space)
            if name in self.derived:
                raise ConfigError(
                    f"{where}: search_space[{name!r}] is derived from {self.derived[name]} and follows "
                    "the run that takes the preset: leave it out of the search space"
                )

    @property
    def takes(self) -> str:
        """The spaces it takes, in words: ``Box or Discrete observations and Discrete actions``."""
        return f"{_either(self.observations)} observations and {_either(self.actions)} actions"

    def fits(self, observation_space: gym.Space, action_space: gym.Space) -> bool:
        """Whether it takes an env with these spaces."""
        if holds_entities(observation_space):
            return ENTITIES in self.observations and isinstance(action_space, gym.spaces.Dict)
        vector_box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
        return self._fits_observation(observation_space) and (
            (DISCRETE in self.actions and isinstance(action_space, gym.spaces.Discrete))
            or (VECTOR_BOX in self.actions and vector_box)
        )

    def _fits_observation(self, space: gym.Space) -> bool:
        if isinstance(space, gym.spaces.Dict):
            parts = [part for key, part in space.spaces.items() if key != "action_mask"]
            return (
                DICT in self.observations
                and bool(parts)
                and all(not isinstance(part, gym.spaces.Dict) and self._fits_observation(part) for part in parts)
            )
        return (BOX in self.observations and isinstance(space, gym.spaces.Box)) or (
            DISCRETE in self.observations and isinstance(space, gym.spaces.Discrete)
        )

    def preset(self, env_id: str) -> dict[str, dict[str, Any]]:
        """Its starting point on ``env_id``: its own, then the env's preset when it has one, else the preset of its
        kind of env (``family_presets``) when it has one."""
        chosen = self.presets.get(registered_id(env_id))
        if chosen is None:
            families = [preset for family, preset in self.family_presets.items() if PRESET_FAMILIES[family](env_id)]
            chosen = families[0] if families else {}
        return {
            "algorithm": dict(chosen.get("algorithm", {})),
            "agent": {**self.agent, **chosen.get("agent", {})},
            "run": {**self.run, **chosen.get("run", {})},
        }

    def builder(
        self,
        env_id: str,
        env_kwargs: dict[str, Any],
        config: Any,
        settings: Any,
        *,
        preprocessing: bool = True,
        agents: tuple[str, ...] = (),
    ) -> Any:
        """A picklable function of no arguments that builds the Algorithm (a CT's ``build``) for the env as the
        agents play it (``preprocessing``, ``agents`` of a multi-agent env, all when empty:
        ``flare2.core.env_making.env_spaces``)."""
        return _Build(self.name, self.build, env_id, env_kwargs, config, settings, preprocessing, tuple(agents))


@dataclass(frozen=True)
class _Build:
    """Builds a record's Algorithm for an env; pickled to the compute process, where the build function is imported,
    and sent as its :meth:`recipe` to learners on other machines."""

    algo: str
    path: str
    env_id: str
    env_kwargs: dict[str, Any]
    config: Any
    settings: Any
    preprocessing: bool
    agents: tuple[str, ...] = ()
    """The agents of a multi-agent env whose spaces it is built for; all of them when empty."""

    def __call__(self) -> Any:

        module_name, _, attr = self.path.partition(":")
        try:
            function: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                function = getattr(function, part)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"cannot import the build function {self.path!r} of the algorithm ({exc}): check the "
                "record's build path and that its package is installed"
            ) from None
        env = env_spaces(self.env_id, self.env_kwargs, preprocessing=self.preprocessing, agents=self.agents or None)
        return function(env, self.config, self.settings)

    def recipe(self) -> dict[str, Any]:
        """This build as plain data (``flare2.zoo.registry.rebuild`` makes it again): the same fields as a
        ``train.json``."""
        return {
            "algo": self.algo,
            "env": self.env_id,
            "env_kwargs": self.env_kwargs,
            "algorithm": dataclasses.asdict(self.config),
            "agent": dataclasses.asdict(self.settings),
            "preprocessing": self.preprocessing,
            "agents": list(self.agents),
        }


def field_names(dataclass_type: type) -> set[str]:
    """The field names of a dataclass: the keys a preset group may use."""
    return {item.name for item in dataclasses.fields(dataclass_type)}


def _either(kinds: tuple[str, ...]) -> str:
    return kinds[0] if len(kinds) == 1 else f"{', '.join(kinds[:-1])} or {kinds[-1]}"


def _check_kinds(where: str, name: str, kinds: Any, known: tuple[str, ...]) -> None:
    if not isinstance(kinds, tuple) or not kinds or not set(kinds) <= set(known):
        raise ConfigError(f"{where}: {name} must be a non-empty tuple of {known}, got {kinds!r}")


def _check_names(where: str, values: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{where} names {unknown}, which are not among the fields {sorted(known)}")


def _check_search(where: str, space: Any) -> None:
    if not (isinstance(space, tuple) and len(space) == 2 and space[0] in SEARCH_KINDS):
        raise ConfigError(f"{where} must be (kind, bounds) with kind one of {SEARCH_KINDS}, got {space!r}")
    kind, bounds = space
    if kind == "choice":
        if not isinstance(bounds, tuple) or not bounds:
            raise ConfigError(f"{where}: a choice needs a non-empty tuple of values, got {bounds!r}")
        return
    if not (
        isinstance(bounds, tuple)
        and len(bounds) == 2
        and all(isinstance(b, (int, float)) for b in bounds)
        and all(math.isfinite(b) for b in bounds)
        and bounds[0] < bounds[1]
    ):
        raise ConfigError(f"{where}: {kind} needs bounds (low, high) with low < high, got {bounds!r}")
    if kind == "log" and bounds[0] <= 0:
        raise ConfigError(f"{where}: log needs bounds above 0, got {bounds!r}")
    if kind == "int" and not all(isinstance(b, int) for b in bounds):
        raise ConfigError(f"{where}: int needs integer bounds, got {bounds!r}")
