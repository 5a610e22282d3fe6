"""Making envs: Gymnasium ids of packages that register them on import, the published preprocessing of the games that
have one (Atari), and PettingZoo's multi-agent envs by module. Imports no torch: agent processes import this module.

**Env packages.** ale-py registers ``ALE/...`` ids and MinAtar ``MinAtar/...``
ids only once imported: ``make_gym_env`` imports the package of an id's
namespace first, and names the package and flare2's extra to install when it
is missing. Gymnasium's own Box2D and MuJoCo envs are registered always but
need a package to be made: ``missing_extra`` names flare2's extra for those
too, before Gymnasium's import fails. ``module:EnvId`` works as Gymnasium
makes it (the module is imported).

**Atari** (``atari_game``): the preprocessing of SB3's ``AtariWrapper`` and
CleanRL's ``ppo_atari`` (Mnih et al., Nature 2015; Machado et al., JAIR 2018):

- up to 30 no-op actions at the start of a game,
- each action repeated for 4 frames, the observation the pixel-wise max of the
  last two (sprites flicker),
- FIRE (then action 2) at the start of a game and after a lost life, in games
  that have FIRE (Breakout waits for it),
- 84x84 grayscale frames, ``uint8``,
- ALE's own frame skip and sticky actions off, as in the ``NoFrameskip-v4``
  games the published tables were made on (``env_kwargs`` may set them again).

A lost life ends the episode *for learning* (``LEARNING_EPISODE_ENDS`` in the
step's ``info``: learning sees a termination there, as with SB3's
``EpisodicLifeEnv``) while the game goes on, so every return flare2 reports
(the progress line, progress.csv, ``flare2 eval``) is the score of a whole
game, as in the published tables. The presets clip rewards for learning
(``--clip-rewards 1``), which leaves the reported scores raw, and stack frames
as the model's view of the last 4 observations (``--frames 4``).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from flare2.errors import ConfigError

LEARNING_EPISODE_ENDS = "learning_episode_ends"
"""An ``info`` key an env sets (to True) on a step after which learning should see the episode end, as a termination,
though the env plays on without a reset: a lost life of an Atari game. The stock agent then starts the episode's
trajectory views afresh; the returns it reports run to the env's own end."""

ENV_PACKAGES: dict[str, tuple[str, str | None]] = {
    "ALE": ("ale_py", None),
    "MinAtar": ("minatar.gym", "register_envs"),
    "flare2": ("flare2.zoo.envs", None),
}
"""Namespaces of env ids whose package registers them: (module to import, the function of it to call after, if
importing it is not enough)."""

ENV_EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "ALE": (("ale_py",), "atari"),
    "MinAtar": (("minatar",), "minatar"),
    "gymnasium.envs.box2d": (("Box2D",), "box2d"),
    "gymnasium.envs.mujoco": (("mujoco", "imageio", "packaging"), "mujoco"),
}
"""What the envs of a namespace (``ALE``) or of a Gymnasium entry-point package need: (the modules they import,
flare2's extra that installs them). The Atari preprocessing also needs OpenCV (``atari_game`` says so)."""

NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN_SIZE = 84
_ATARI_BASE_KWARGS = {"frameskip": 1, "repeat_action_probability": 0.0}
"""ALE's settings under the preprocessing, which skips frames itself (v5 games default to 4 and 0.25)."""


def registered_id(env_id: str) -> str:
    """The id without a ``module:`` prefix (Gymnasium imports the module, which registers it)."""
    return env_id.rsplit(":", 1)[-1]


def namespace(env_id: str) -> str | None:
    """The namespace of an id (``ALE`` of ``ALE/Breakout-v5``), None for an id without one."""
    name = registered_id(env_id)
    return name.split("/", 1)[0] if "/" in name else None


def register_env_package(env_id: str) -> None:
    """Import the package that registers ``env_id``: the one of its namespace (a ConfigError naming the package and
    the extra to install when it is missing), or, for an id without a known namespace that is not registered yet,
    each known package that is installed (ale-py also registers ``BreakoutNoFrameskip-v4`` and the like)."""
    if registered_id(env_id) in gym.registry or ":" in env_id:
        return
    space = namespace(env_id)
    if space not in ENV_PACKAGES:
        for known in ENV_PACKAGES:
            try:
                _register(known)
            except ImportError:
                continue
        return
    _refuse_missing_extra(env_id)
    _register(space)


def check_env_id(env_id: str) -> None:
    """A ConfigError naming an env id Gymnasium does not know, with the registered ids closest to it."""
    if ":" in env_id or is_pettingzoo_env(env_id):
        return  # the module is imported first: making the env names what is wrong
    register_env_package(env_id)
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else "gymnasium.pprint_registry() lists the ids"
        raise ConfigError(f"--env {env_id!r} is no registered Gymnasium environment: {hint}")


def _register(space: str) -> None:
    """Register the ids of namespace ``space`` (an ImportError when its package is missing)."""
    module_name, function = ENV_PACKAGES[space]
    module = importlib.import_module(module_name)
    if function is not None and not any(key.startswith(space + "/") for key in gym.registry):
        getattr(module, function)()


def missing_extra(env_id: str) -> str | None:
    """flare2's extra that installs a module ``env_id`` needs and this Python lacks; None when none is known missing."""
    space = namespace(env_id)
    if space not in ENV_EXTRAS:
        spec = gym.registry.get(registered_id(env_id))
        entry_point = spec.entry_point if spec is not None else None
        space = next(
            (family for family in ENV_EXTRAS if isinstance(entry_point, str) and entry_point.startswith(family + ".")),
            None,
        )
        if space is None:
            return None
    modules, extra = ENV_EXTRAS[space]
    return extra if any(importlib.util.find_spec(module) is None for module in modules) else None


def _refuse_missing_extra(env_id: str) -> None:
    """A ConfigError naming the modules and flare2's extra when ``env_id`` needs an extra this Python lacks."""
    extra = missing_extra(env_id)
    if extra is not None:
        needs = next(modules for modules, of in ENV_EXTRAS.values() if of == extra)
        missing = [module for module in needs if importlib.util.find_spec(module) is None]
        raise ConfigError(
            f"env {env_id!r} needs {', '.join(missing)}, which flare2's {extra} extra installs: "
            f'pip install "flare2[{extra}]"'
        )


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is one of ale-py's games (``ALE/Breakout-v5``, ``BreakoutNoFrameskip-v4``...)."""
    register_env_package(env_id)
    spec = gym.registry.get(registered_id(env_id))
    entry_point = spec.entry_point if spec is not None else ""
    return isinstance(entry_point, str) and entry_point.startswith("ale_py")


def is_minatar(env_id: str) -> bool:
    """Whether ``env_id`` is one of MinAtar's games (``MinAtar/Breakout-v1``...)."""
    return namespace(env_id) == "MinAtar"


def make_gym_env(env_id: str, env_kwargs: Mapping[str, Any] | None = None, *, preprocessing: bool = True) -> gym.Env:
    """``gymnasium.make`` of ``env_id`` with the published preprocessing of its kind of game (Atari's; none for the
    others), ``preprocessing=False`` for the raw env; an error that names the id and the fix."""
    register_env_package(env_id)
    _refuse_missing_extra(env_id)
    try:
        if preprocessing and is_atari(env_id):
            return atari_game(env_id, env_kwargs)
        return gym.make(env_id, **dict(env_kwargs or {}))
    except ModuleNotFoundError as exc:
        missing = exc.__cause__ if isinstance(exc.__cause__, ModuleNotFoundError) else exc
        raise ConfigError(
            f"cannot make Gymnasium environment {env_id!r}: it imports {missing.name!r}, which is not installed: "
            "check the module path of a module:EnvId (a module of the working directory or of an installed package), "
            "or install what the env needs"
        ) from None
    except gym.error.Error as exc:
        raise ConfigError(
            f"cannot make Gymnasium environment {env_id!r} ({exc}): check the id "
            "(gymnasium.pprint_registry() lists them) or install the package that registers it"
        ) from None


class AtariLives(gym.Wrapper):
    """FIRE at the start of a game and after each lost life where the game has FIRE; marks each lost life in the
    step's ``info`` (``LEARNING_EPISODE_ENDS``) while the game goes on. The rewards of the FIRE steps count."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
        self._fire = "FIRE" in meanings and len(meanings) >= 3
        self._lives = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        observation, info = self.env.reset(**kwargs)
        if self._fire:
            observation, _, terminated, truncated, info = self._press_fire(info)
            if terminated or truncated:
                observation, info = self.env.reset(**kwargs)
        self._lives = self._lives_of(info)
        return observation, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward)
        lives = self._lives_of(info)
        if lives < self._lives and not (terminated or truncated):
            if self._fire:
                observation, fire_reward, terminated, truncated, info = self._press_fire(info)
                reward += fire_reward
            info = {**info, LEARNING_EPISODE_ENDS: True}
        self._lives = lives
        return observation, reward, terminated, truncated, info

    def _press_fire(self, info: dict[str, Any]) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """FIRE, then action 2 (as SB3's ``FireResetEnv``): the last observation, the rewards, how the game ended
        on the way if it did, and the last info."""
        total, observation, terminated, truncated = 0.0, None, False, False
        for action in (1, 2):
            observation, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return observation, total, terminated, truncated, info

    def _lives_of(self, info: dict[str, Any]) -> int:
        return int(info["lives"]) if "lives" in info else int(self.env.unwrapped.ale.lives())  # type: ignore[attr-defined]


def atari_game(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> gym.Env:
    """The game ``env_id`` with the published preprocessing (the module docstring)."""
    if importlib.util.find_spec("cv2") is None:
        _, extra = ENV_EXTRAS["ALE"]
        raise ConfigError(
            f'env {env_id!r}: the Atari preprocessing resizes frames with OpenCV: pip install "flare2[{extra}]"'
        )
    env = gym.make(env_id, **{**_ATARI_BASE_KWARGS, **dict(env_kwargs or {})})
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=NOOP_MAX,
        frame_skip=FRAME_SKIP,
        screen_size=SCREEN_SIZE,
        terminal_on_life_loss=False,
        grayscale_obs=True,
        scale_obs=False,
    )
    return AtariLives(env)


PETTINGZOO_EXTRA = "pettingzoo"
"""flare2's extra that installs PettingZoo and the envs the tests play (MPE's ``mpe2``)."""
_EXTRA_MODULES = ("pettingzoo", "mpe2")
_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


_PETTINGZOO_EXAMPLES = " (mpe2.simple_spread_v3, pettingzoo.classic.connect_four_v3)"


def is_pettingzoo_env(env_id: str) -> bool:
    """Whether ``env_id`` names a PettingZoo env by its module (a dotted path of Python names, ``mpe2.simple_spread_v3``)
    rather than a Gymnasium id (``CartPole-v1``, ``ALE/Breakout-v5``, ``module:Id``)."""
    return _MODULE_PATH.fullmatch(env_id) is not None


def is_classic_game(env_id: str) -> bool:
    """Whether ``env_id`` is one of PettingZoo's classic games played in turns (``pettingzoo.classic.*`` of the AEC
    API: connect four, tic-tac-toe, chess, go...; not rock-paper-scissors, whose moves are simultaneous). A game whose
    module does not import is none: making it names what to install."""
    if not env_id.startswith("pettingzoo.classic."):
        return False
    try:
        module = importlib.import_module(env_id)
    except ImportError:
        return False
    return hasattr(module, "env") and not hasattr(module, "parallel_env")


def make_pettingzoo_env(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> Any:
    """A game of PettingZoo env ``env_id``: its module's ``parallel_env(**env_kwargs)`` where it has one (all live
    agents act at once), else its ``env(**env_kwargs)`` (turn-based, the AEC API); a ConfigError naming the package or
    extra to install, or what the module lacks."""
    top = env_id.split(".", 1)[0]
    if importlib.util.find_spec(top) is None:
        fix = (
            f'pip install "flare2[{PETTINGZOO_EXTRA}]"'
            if top in _EXTRA_MODULES
            else f"install the package that provides {top!r} or start flare2 in the folder that holds it"
            f"{_close_top_level(env_id)}"
        )
        raise ConfigError(f"--env {env_id!r} names a PettingZoo env module, and {top!r} is not installed: {fix}")
    try:
        module = importlib.import_module(env_id)
    except ModuleNotFoundError as exc:
        if exc.name is None or env_id == exc.name or env_id.startswith(exc.name + "."):
            raise ConfigError(f"--env {env_id!r}: no such module ({exc}): {_nearest_modules(env_id)}") from None
        raise ConfigError(
            f"--env {env_id!r} imports {exc.name!r}, which is not installed: {_dependency_fix(env_id, exc.name)}"
        ) from None
    make = getattr(module, "parallel_env", None) or getattr(module, "env", None)
    if make is None:
        package_name, _, name = env_id.rpartition(".")
        close = [f"{package_name}.{sibling}" for sibling in _close_names(importlib.import_module(package_name), name)]
        examples = f": did you mean {' or '.join(close)}?" if close else _PETTINGZOO_EXAMPLES
        raise ConfigError(
            f"--env {env_id!r} has neither parallel_env() nor env(): name the module of a PettingZoo env{examples}"
        )
    try:
        return make(**dict(env_kwargs or {}))
    except TypeError as exc:
        raise ConfigError(f"cannot make {env_id!r} with {dict(env_kwargs or {})}: {exc}") from None


def _nearest_modules(env_id: str) -> str:
    """What to check in a module path that does not import, as Gymnasium names the versions an env id has: the
    modules of the deepest package on it that imports whose names are closest to the next part, with the rest of the
    path where that imports (``pettingzoo.butterfly.knights_archers_zombies_v10``: ``..._v11``)."""
    parts = env_id.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        package_name = ".".join(parts[:depth])
        try:
            package = importlib.import_module(package_name)
        except ImportError:
            continue
        if not hasattr(package, "__path__"):
            return f"{package_name} is a module, not a package: did you mean {package_name}?"
        close = [f"{package_name}.{name}" for name in _close_names(package, parts[depth])]
        whole = [".".join([path, *parts[depth + 1 :]]) for path in close]
        suggested = [path for path in whole if _importable(path)] or close
        if suggested:
            return f"did you mean {' or '.join(suggested)}?"
        return f"check the env's module path ({package_name} has no module {parts[depth]!r})"
    return "check the env's module path"


def _close_top_level(env_id: str) -> str:
    """The module paths of ``env_id`` with its first part replaced by the closest installed packages, where they import
    (``mpe.simple_spread_v3``: ``mpe2.simple_spread_v3``), as what else to try."""
    top, _, rest = env_id.partition(".")
    names = {module.name for module in pkgutil.iter_modules() if module.ispkg}
    close = difflib.get_close_matches(top, sorted(names), n=3, cutoff=0.6)
    whole = [f"{name}.{rest}" for name in close if _importable(f"{name}.{rest}")]
    return f", or did you mean {' or '.join(whole)}?" if whole else ""


def _close_names(package: Any, name: str) -> list[str]:
    """The names of ``package``'s modules closest to ``name`` (at most three), ``name`` itself left out."""
    names = [module.name for module in pkgutil.iter_modules(package.__path__) if module.name != name]
    return difflib.get_close_matches(name, names, n=3, cutoff=0.6)


def _importable(module_path: str) -> bool:
    try:
        return importlib.util.find_spec(module_path) is not None
    except (ImportError, ValueError):
        return False


def _dependency_fix(env_id: str, missing: str) -> str:
    """How to install what env module ``env_id`` imports and lacks: the extra of its package named after its family
    where there is one (``pettingzoo.classic.texas_holdem_v4``: ``pettingzoo[classic]``, which brings rlcard)."""
    top, _, rest = env_id.partition(".")
    family = rest.partition(".")[0]
    try:
        extras = importlib.metadata.metadata(top).get_all("Provides-Extra") or []
    except importlib.metadata.PackageNotFoundError:
        extras = []
    if family in extras:
        return f'pip install "{top}[{family}]"'
    return f"install the package that provides {missing!r}"


@dataclass(frozen=True)
class AgentSpaces:
    """The spaces the agents of one CT share: what an algorithm's ``build(env, ...)`` reads of an env."""

    observation_space: gym.Space
    action_space: gym.Space
    state_space: gym.Space | None = None
    """The space of the game's ``state()`` where the env has one (a centralised critic sees it)."""

    def close(self) -> None:
        """Nothing to close: for callers that close what ``flare2.core.env_making.env_spaces`` gave."""


def shared_spaces(env: Any, env_id: str, agents: Sequence[str] | None = None) -> AgentSpaces:
    """The observation and action space that ``agents`` of ``env`` (every possible agent when None) share, as one CT
    takes them; a ConfigError naming the agents whose spaces differ."""
    agents = list(env.possible_agents if agents is None else agents)
    first = agents[0]
    spaces = AgentSpaces(env.observation_space(first), env.action_space(first), getattr(env, "state_space", None))
    for agent in agents[1:]:
        if (env.observation_space(agent), env.action_space(agent)) != (spaces.observation_space, spaces.action_space):
            raise ConfigError(
                f"agents {agents} of {env_id!r} share one CT, and their spaces differ: {first!r} has "
                f"{spaces.observation_space} and {spaces.action_space}, {agent!r} has {env.observation_space(agent)} "
                f"and {env.action_space(agent)}: give each kind of agent a CT of its own (--policy-map team or agent)"
            )
    return spaces


def is_turn_based(env: Any) -> bool:
    """Whether a PettingZoo env plays one agent at a time (the AEC API: ``agent_iter()``, ``last()``)."""
    return callable(getattr(env, "agent_iter", None))


def env_spaces(
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    *,
    preprocessing: bool = True,
    agents: Sequence[str] | None = None,
) -> Any:
    """What an algorithm is built for (``observation_space`` and ``action_space``, and ``close()``): a Gymnasium env
    as the agents play it, or the spaces that ``agents`` of a PettingZoo env (all of them when None) share."""
    if not is_pettingzoo_env(env_id):
        return make_gym_env(env_id, env_kwargs, preprocessing=preprocessing)
    env = make_pettingzoo_env(env_id, env_kwargs)
    try:
        return shared_spaces(env, env_id, agents)
    finally:
        env.close()
