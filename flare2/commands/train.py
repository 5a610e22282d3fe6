"""``flare2 train --env ENV_ID --algo ALGO``: train any Gymnasium env with a zoo algorithm, no code.

The settings start from the algorithm's own, then the preset for that env
when the package has one (``flare2.zoo.recipes.PRESETS``), then ``--preset
FILE``, then the command line. The resolved settings go to LOG_DIR/train.json,
which is itself a preset: ``flare2 train --preset runs/x/train.json`` repeats
the run. Imports no torch: the algorithm is built in the compute process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from functools import partial
from pathlib import Path
from typing import Any

from flare2.core.envs import make_gym_env
from flare2.errors import ConfigError
from flare2.runtime.config import CTConfig, RunConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.run_files import TRAIN_FILE
from flare2.runtime.options import (
    OPTIONS, add_config_options, add_run_options, add_transform_options, batching_from_args, config_from_args,
    number_option, run_config_from_args, transforms_from_args,
)
from flare2.zoo.recipes import (
    PRESET_GROUPS, RECIPES, agent_kwargs, build, check_env_id, check_preset, check_spaces, preset, settings_fields,
)

_TRANSFORM_OPTIONS = ("normalize_observations", "scale_rewards", "clip_rewards")
# Where this run writes and listens belongs to the command line, not to a preset that another run reuses.
_THIS_RUN_ONLY = {"log_dir", "resume_dir", "bind", "port", "advertise", "keys_dir", "insecure"}
_RUN_OPTIONS = tuple(name for *_, name, _ in OPTIONS if name not in _THIS_RUN_ONLY) + _TRANSFORM_OPTIONS + (
    "max_episode_steps",)


def _choice_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--algo", choices=sorted(RECIPES), help="the zoo algorithm")
    parser.add_argument("--env", help="Gymnasium env id (module:id imports the module that registers it)")
    parser.add_argument("--preset", metavar="FILE",
                        help="JSON settings over the package's own (a run's train.json is one)")
    return parser


def main(argv: list[str]) -> int:
    plan = resolve(argv)
    _write_train_file(plan)
    return Manager(plan.run).run()


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """What ``flare2 train`` resolved from its command line: the run to start and every setting it used."""

    algo: str
    env_id: str
    config: Any
    settings: Any
    options: dict[str, Any]
    """The run options (``_RUN_OPTIONS``) by field name."""
    run: RunConfig


def resolve(argv: list[str]) -> TrainPlan:
    """The plan of ``flare2 train ARGV``; a bad command line exits with a usage error naming what to change."""
    chooser = _choice_parser()
    chosen, _ = chooser.parse_known_args(argv)
    usage = argparse.ArgumentParser(prog="flare2 train", parents=[chooser])
    try:
        file_preset = _read_preset(chosen.preset) if chosen.preset else {}
        algo = chosen.algo or file_preset.get("algo")
        env_id = chosen.env or file_preset.get("env")
        if algo is None or env_id is None:
            if "-h" in argv or "--help" in argv:
                algo, env_id = algo or "ppo", env_id or "CartPole-v1"  # the options of one pair, as an example
            else:
                usage.error("give --env ENV_ID and --algo ALGO (or a --preset that names them); --help lists the rest")
        elif algo not in RECIPES:
            usage.error(f"the preset's algo {algo!r} is none of {sorted(RECIPES)}")
        recipe = RECIPES[algo]
        check_env_id(env_id)
        env = make_gym_env(env_id)
        check_spaces(algo, env_id, env.observation_space, env.action_space)
        env.close()
        if file_preset:
            check_preset(file_preset, chosen.preset, _known_options(algo))
    except ConfigError as exc:
        usage.error(str(exc))

    parser = argparse.ArgumentParser(
        prog="flare2 train", parents=[chooser],
        description=f"Train {env_id} with {algo}. Defaults: the algorithm's, then the package's preset for the env, "
                    "then --preset; every one can be given here. `flare2 train --algo ALGO --help` lists ALGO's.",
    )
    parser.add_argument("--max-episode-steps", type=number_option(int, least=1), default=None, metavar="STEPS",
                        help="truncate episodes after STEPS steps (the env's own time limit otherwise)")
    derived = {name: "--" + source.replace("_", "-") for name, source in recipe.derived.items()}
    add_config_options(parser, recipe.config_class, derived=derived)
    add_config_options(parser, recipe.settings_class, title="how its agents send experience, and its network")
    add_run_options(parser, log_dir=f"runs/{algo}_{env_id.rsplit(':', 1)[-1].replace('/', '_')}")
    add_transform_options(parser)
    starting = preset(algo, env_id)
    for group in PRESET_GROUPS:
        starting[group].update(file_preset.get(group, {}))
    parser.set_defaults(**_dests(recipe, starting))
    args = parser.parse_args(argv)

    settings = config_from_args(parser, args, recipe.settings_class)
    sources = {**vars(args), **dataclasses.asdict(settings)}
    config = config_from_args(parser, args, recipe.config_class,
                              **{name: sources[source] for name, source in recipe.derived.items()})
    env_kwargs = {"max_episode_steps": args.max_episode_steps} if args.max_episode_steps else {}
    ct = CTConfig(name="RL", build=partial(build, algo, env_id, env_kwargs, config, settings),
                  batching=batching_from_args(args))
    kwargs = agent_kwargs(algo, env_id, env_kwargs, settings, args.num_agents, transforms_from_args(args))
    run = run_config_from_args(parser, args, cts=[ct], agent_path="flare2.core.envs:GymAgent", agent_kwargs=kwargs)
    return TrainPlan(algo, env_id, config, settings, {name: getattr(args, name) for name in _RUN_OPTIONS}, run)


def _known_options(algo: str) -> dict[str, set[str]]:
    recipe = RECIPES[algo]
    return {"algorithm": settings_fields(recipe.config_class), "agent": settings_fields(recipe.settings_class),
            "run": set(_RUN_OPTIONS)}


def _dests(recipe: Any, values: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Preset values by the argparse dest of their option."""
    return {
        **{f"{recipe.config_class.__name__}.{name}": value for name, value in values["algorithm"].items()},
        **{f"{recipe.settings_class.__name__}.{name}": value for name, value in values["agent"].items()},
        **values["run"],
    }


def _read_preset(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--preset {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--preset {path} is not a JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--preset {path} must hold a JSON object")
    return data


def _write_train_file(plan: TrainPlan) -> None:
    """LOG_DIR/train.json: every resolved setting, in the form of a preset."""
    log_dir = Path(plan.run.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "algo": plan.algo, "env": plan.env_id,
        "algorithm": dataclasses.asdict(plan.config), "agent": dataclasses.asdict(plan.settings), "run": plan.options,
    }
    (log_dir / TRAIN_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
