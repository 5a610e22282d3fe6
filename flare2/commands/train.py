"""``flare2 train --env ENV_ID --algo ALGO``: train any Gymnasium env with a zoo algorithm (or
one of your own, ``flare2.zoo.registry``), no code.

The settings start from the algorithm's own, then the preset for that env
when its record has one (``flare2/zoo/records/``), then ``--preset FILE``,
then the command line. The resolved settings go to LOG_DIR/train.json,
which is itself a preset: ``flare2 train --preset runs/x/train.json`` repeats
the run. Imports no torch: the algorithm is built in the compute process.

From Python, :func:`train` runs the same thing and returns the run::

    run = flare2.train("CartPole-v1", algo="ppo", max_steps=100_000, lr=1e-3, stop_return=475)
    run.log_dir, run.return_mean, run.policy.act(observation)
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import sys
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn

from flare2.commands.train_pettingzoo import pettingzoo_agent, pettingzoo_cts
from flare2.core.env_engines import DEFAULT_ENGINE, ENGINES, engine_threads, resolve_engine
from flare2.core.env_making import check_env_id, is_pettingzoo_env, make_gym_env
from flare2.core.envs import DEFAULT_CT, GymAgent
from flare2.core.pettingzoo_agent import POLICY_MAPS
from flare2.errors import ConfigError, RunFailed
from flare2.runtime import exit_codes
from flare2.runtime.config import CTConfig, RunConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.options import (
    OPTIONS,
    add_config_options,
    add_run_options,
    add_transform_options,
    batching_from_args,
    config_from_args,
    number_option,
    run_config_from_args,
    transforms_from_args,
)
from flare2.runtime.processes import refuse_start_in_a_spawned_child
from flare2.runtime.run_files import TRAIN_FILE, make_log_dir, unused_log_dir
from flare2.zoo.record import PRESET_GROUPS, AlgorithmRecord, field_names
from flare2.zoo.registry import check_spaces, lookup, names

_TRANSFORM_OPTIONS = ("normalize_observations", "normalize_rewards", "scale_rewards", "clip_rewards")
# Where this run writes and listens belongs to the command line, not to a preset that another run reuses.
_THIS_RUN_ONLY = {"log_dir", "resume_dir", "bind", "port", "advertise", "keys_dir", "insecure"}
_RUN_OPTIONS = (
    tuple(name for *_, name, _ in OPTIONS if name not in _THIS_RUN_ONLY)
    + _TRANSFORM_OPTIONS
    + ("max_episode_steps", "env_preprocessing", "env_engine", "policy_map", "self_play", "self_play_pool")
    + ("self_play_sparring",)
)


def _choice_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--algo", help=f"the algorithm: {', '.join(names())}, or one of your own (flare2.zoo.register)")
    parser.add_argument("--env", help="Gymnasium env id (module:id imports the module that registers it)")
    parser.add_argument(
        "--preset", metavar="FILE", help="JSON settings over the package's own (a run's train.json is one)"
    )
    return parser


def main(argv: list[str]) -> int:
    plan = resolve(argv)
    try:
        _write_train_file(plan)
    except ConfigError as exc:
        sys.stderr.write(f"flare2 train: error: {exc}\n")
        return exit_codes.CONFIG_ERROR
    return Manager(plan.run).run()


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """What :func:`train` returns: where the run kept its files, its final figures, and its policy."""

    log_dir: Path
    """The run's log dir: progress.csv, train.json, checkpoints/ (``flare2 eval``, ``flare2 plot`` take it)."""
    exit_code: int
    """0 once the budget was reached; 130, 143 or 129 when Ctrl+C, SIGTERM or SIGHUP stopped it (its checkpoint is
    written)."""
    env_steps: int
    episodes: int
    return_mean: float
    """Mean return of the last 100 training episodes as the run ended."""
    best_return_mean: float
    """The highest ``return_mean`` of any progress row."""

    @cached_property
    def policy(self) -> Any:
        """The trained policy (:class:`flare2.TrainedPolicy`), loaded from the final checkpoint on first use."""
        from flare2.commands.policies import load_policy

        return load_policy(self.log_dir)


def train(env: str, algo: str = "ppo", *, max_steps: int | None = None, **settings: Any) -> TrainedRun:
    """Train ``env`` with ``algo`` in this process's own run, as ``flare2 train --env ENV --algo ALGO`` does.

    ``settings`` are what the command line takes, by field name (``flare2 train --algo ALGO --help`` lists them):
    the algorithm's (``lr=3e-4``), its agents' (``sample_interval=64``) and the run's (``seed=1``,
    ``envs_per_agent=16``, ``stop_return=475``, ``log_dir="runs/x"``). They go over the package's preset for the env,
    like options on the command line. Returns when the run ends; a run that fails raises :class:`flare2.RunFailed`
    naming its log.
    """
    refuse_start_in_a_spawned_child("flare2.train()")
    if max_steps is not None:
        settings["max_steps"] = max_steps
    plan = resolve(["--env", env, "--algo", algo], settings, parser_class=_RaisingParser)
    _write_train_file(plan)
    manager = Manager(plan.run)
    code = manager.run()
    log_dir = Path(plan.run.log_dir)
    if code not in (exit_codes.OK, *exit_codes.STOPPED_BY_SIGNAL):
        raise RunFailed(f"{exit_codes.outcome(code)} (exit code {code}): see {log_dir / 'manager.log'}", code)
    totals = manager.totals
    return TrainedRun(
        log_dir=log_dir,
        exit_code=code,
        env_steps=totals.env_steps,
        episodes=totals.episodes,
        return_mean=totals.return_mean,
        best_return_mean=totals.best_return_mean,
    )


class _RaisingParser(argparse.ArgumentParser):
    """The parser :func:`train` resolves with: a setting it refuses raises ConfigError instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


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


def resolve(
    argv: list[str],
    overrides: Mapping[str, Any] | None = None,
    *,
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
) -> TrainPlan:
    """The plan of ``flare2 train ARGV``; a bad command line exits with a usage error naming what to change.

    ``overrides`` (from :func:`train`) are option values by field name, taken over the presets as defaults of the
    command line; ``parser_class`` decides what a refused option does (exit with the usage, or raise).
    """
    chooser = _choice_parser()
    chosen, _ = chooser.parse_known_args(argv)
    usage = parser_class(prog="flare2 train", parents=[chooser])
    try:
        algo, env_id, record, file_preset = _chosen(argv, chosen, usage)
        given = _grouped(record, overrides or {})
    except ConfigError as exc:
        usage.error(str(exc))

    parser = parser_class(
        prog="flare2 train",
        parents=[chooser],
        description=f"Train {env_id} with {algo}. Defaults: the algorithm's, then the package's preset for the env, "
        "then --preset; every one can be given here. `flare2 train --algo ALGO --help` lists ALGO's.",
    )
    _add_env_options(parser)
    derived = {name: "--" + source.replace("_", "-") for name, source in record.derived.items()}
    add_config_options(parser, record.config_class, derived=derived)
    add_config_options(parser, record.settings_class, title="how its agents send experience, and its network")
    add_run_options(
        parser,
        log_dir=unused_log_dir(f"runs/{algo}_{env_id.rsplit(':', 1)[-1].replace('/', '_')}"),
        envs_per_agent=GymAgent.default_envs,  # the agent flare2 train plays
    )
    add_transform_options(parser)
    starting = record.preset(env_id)
    for group in PRESET_GROUPS:
        starting[group].update(file_preset.get(group, {}))
        starting[group].update(given[group])
    parser.set_defaults(**_dests(record, starting))
    args = parser.parse_args(argv)

    settings = config_from_args(parser, args, record.settings_class)
    sources = {**vars(args), **dataclasses.asdict(settings)}
    unknown = sorted(set(record.derived.values()) - set(sources))
    if unknown:
        parser.error(
            f"the record of {algo} derives settings from {unknown}, which are neither run options nor fields "
            f"of {record.settings_class.__name__}: fix its derived"
        )
    config = config_from_args(
        parser, args, record.config_class, **{name: sources[source] for name, source in record.derived.items()}
    )
    env_kwargs = {"max_episode_steps": args.max_episode_steps} if args.max_episode_steps else {}
    if getattr(settings, "critic", "own") == "state" and not is_pettingzoo_env(env_id):
        parser.error(f"--critic state: a centralised critic sees a multi-agent env's state(), and {env_id!r} is none")
    if is_pettingzoo_env(env_id):
        agent_path, kwargs = pettingzoo_agent(parser, args, algo, env_id, settings)
        cts = pettingzoo_cts(parser, args, record, env_id, config, settings)
    else:
        if args.policy_map is not None or args.self_play or args.self_play_pool > 1 or args.self_play_sparring:
            parser.error(
                f"--policy-map and the --self-play options take the agents of a PettingZoo env, and {env_id!r} is a "
                "Gymnasium env"
            )
        build = record.builder(env_id, env_kwargs, config, settings, preprocessing=args.env_preprocessing)
        cts = [CTConfig(name=DEFAULT_CT, build=build, batching=batching_from_args(args))]
        agent_path, kwargs = (
            "flare2.core.envs:GymAgent",
            {
                "env_id": env_id,
                "env_kwargs": env_kwargs,
                "preprocessing": args.env_preprocessing,
                **_engine_kwargs(parser, args, env_id),
                "ct": DEFAULT_CT,
                "transforms": transforms_from_args(args),
                **settings.helper_kwargs(args.num_agents),
            },
        )
    run = run_config_from_args(parser, args, cts=cts, agent_path=agent_path, agent_kwargs=kwargs)
    if getattr(settings, "double_buffer", False):
        _check_halves(parser, run)
    return TrainPlan(algo, env_id, config, settings, {name: getattr(args, name) for name in _RUN_OPTIONS}, run)


def _add_env_options(parser: argparse.ArgumentParser) -> None:
    """How the env is made and played: its episode limit, its preprocessing, its engine."""
    parser.add_argument(
        "--max-episode-steps",
        type=number_option(int, least=1),
        default=None,
        metavar="STEPS",
        help="truncate episodes after STEPS steps (the env's own time limit otherwise)",
    )
    parser.add_argument(
        "--env-preprocessing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="play games that have a published preprocessing with it (Atari's, as SB3's AtariWrapper and CleanRL: "
        "no-op starts, 4 frames per step max-pooled, FIRE to start, 84x84 grayscale, a lost life ends the episode "
        "for learning; the returns reported are whole games' scores); --no-env-preprocessing plays the raw env",
    )
    parser.add_argument(
        "--policy-map",
        default=None,
        metavar="MAP",
        help="which CT acts for each agent of a PettingZoo env: "
        f"{', '.join(POLICY_MAPS)} (a CT per team: agents named TEAM_N), or pairs NAME=CT,... (NAME: an agent or a "
        "team); each CT has its own learner and checkpoint; default: shared (one CT, parameter sharing)",
    )
    parser.add_argument(
        "--self-play",
        type=number_option(int, least=0),
        default=0,
        metavar="N",
        help="a turn-based PettingZoo game: the learner (CT RL) takes one seat of each game, drawn as it starts, and a "
        "frozen copy of it (CT opponent) the others, its weights refreshed every N updates of RL; 0 (the default): "
        "off, every seat on the policy map's CTs",
    )
    parser.add_argument(
        "--self-play-pool",
        type=number_option(int, least=1),
        default=1,
        metavar="K",
        help="with --self-play: the frozen copy keeps up to K of the learner's past weights (a uniform sample of every "
        "copy taken) and plays one drawn from them at each refresh; 1 (the default): the newest copy alone",
    )
    parser.add_argument(
        "--self-play-sparring",
        default="",
        metavar="PLAYER=SHARE,...",
        help="with --self-play: in SHARE of the training games a fixed player (random; connect four: lookahead, careful) "
        "takes the opponent's seats instead of the frozen copy, and the learner learns from those games too "
        "(lookahead=0.5: half the games against the lookahead); default: none",
    )
    parser.add_argument(
        "--env-engine",
        choices=ENGINES,
        default=DEFAULT_ENGINE,
        help="what steps each agent's envs: python (Gymnasium envs one after another), gymnasium (in Gymnasium's "
        "SyncVectorEnv), ale (ALE's C++ vector env, native threads: Atari games with the preprocessing), auto (ale "
        f"for Atari games where ale-py has it, else python); default: {DEFAULT_ENGINE}",
    )


def _chosen(
    argv: list[str], chosen: argparse.Namespace, usage: argparse.ArgumentParser
) -> tuple[str, str, AlgorithmRecord, dict[str, Any]]:
    """The algorithm, the env, the algorithm's record and the --preset file's contents that ``argv`` names, checked
    against each other (a ConfigError names what does not fit)."""
    file_preset = _read_preset(chosen.preset) if chosen.preset else {}
    algo = chosen.algo or file_preset.get("algo")
    env_id = chosen.env or file_preset.get("env")
    if algo is None or env_id is None:
        if "-h" not in argv and "--help" not in argv:
            usage.error("give --env ENV_ID and --algo ALGO (or a --preset that names them); --help lists the rest")
        algo = algo or "ppo"  # --help alone shows the options of one algorithm, as an example
    try:
        record = lookup(algo)
    except ConfigError as exc:
        source = "argument --algo" if chosen.algo else f"preset {chosen.preset}: algo"
        raise ConfigError(f"{source}: {exc}") from None
    # --help without --env: the options with the algorithm's first preset env, one it takes.
    env_id = env_id or next(iter(record.presets))
    check_env_id(env_id)
    if not is_pettingzoo_env(env_id):  # a PettingZoo env's agents are checked per CT, once they are mapped
        env = make_gym_env(env_id)
        check_spaces(record, env_id, env.observation_space, env.action_space)
        env.close()
    if file_preset:
        check_preset(file_preset, chosen.preset, _known_options(record))
    return algo, env_id, record, file_preset


def _check_halves(parser: argparse.ArgumentParser, run: RunConfig) -> None:
    """The stock agent plays all its envs at once where halves could not alternate; asked for by name (--double-buffer,
    or the preset's), that is a usage error."""
    if run.serial:
        parser.error(
            "--double-buffer steps half of an agent's envs while the compute process answers the other half, and "
            "--serial runs both in this one process: give --no-double-buffer, or --no-serial (the env's preset may "
            "set either)"
        )
    if (run.agents.envs_per_agent or GymAgent.default_envs) < 2:
        parser.error(
            "--double-buffer plays each agent's envs in two halves, and each agent plays one env: give "
            "--envs-per-agent 2 or more, or --no-double-buffer"
        )


def _grouped(record: AlgorithmRecord, settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Settings by field name, sorted into the preset's groups; a name that is no option, or two, is refused."""
    known = _known_options(record)
    known["run"] |= _THIS_RUN_ONLY
    grouped: dict[str, dict[str, Any]] = {group: {} for group in PRESET_GROUPS}
    for name, value in settings.items():
        groups = [group for group in PRESET_GROUPS if name in known[group]]
        if len(groups) != 1:
            every = sorted(set().union(*known.values()))
            close = difflib.get_close_matches(name, every, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"the settings are {', '.join(every)}"
            what = "is no setting" if not groups else f"names a setting of both {' and '.join(groups)}"
            raise ConfigError(f"{record.name}: {name!r} {what} of flare2 train --algo {record.name}: {hint}")
        grouped[groups[0]][name] = value
    return grouped


def _known_options(record: AlgorithmRecord) -> dict[str, set[str]]:
    return {
        "algorithm": field_names(record.config_class),
        "agent": field_names(record.settings_class),
        "run": set(_RUN_OPTIONS),
    }


def _engine_kwargs(parser: argparse.ArgumentParser, args: argparse.Namespace, env_id: str) -> dict[str, Any]:
    """GymAgent's engine and its threads; a usage error for an engine that cannot play the env."""
    try:
        resolve_engine(args.env_engine, env_id, args.env_preprocessing)
    except ConfigError as exc:
        parser.error(str(exc))
    return {"engine": args.env_engine, "engine_threads": engine_threads(args.num_agents)}


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


def _dests(record: AlgorithmRecord, values: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Preset values by the argparse dest of their option."""
    return {
        **{f"{record.config_class.__name__}.{name}": value for name, value in values["algorithm"].items()},
        **{f"{record.settings_class.__name__}.{name}": value for name, value in values["agent"].items()},
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
    log_dir = make_log_dir(plan.run.log_dir)
    record = {
        "algo": plan.algo,
        "env": plan.env_id,
        "algorithm": dataclasses.asdict(plan.config),
        "agent": dataclasses.asdict(plan.settings),
        "run": plan.options,
    }
    (log_dir / TRAIN_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
