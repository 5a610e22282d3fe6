"""The command-line options every manager script shares, and the RunConfig they make; and the options of an
algorithm's settings (a config dataclass, such as the zoo's), one per field."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from flare2.errors import ConfigError
from flare2.runtime.config import (
    AUTO_BUSY_WAIT_US,
    CHECKPOINT_EVERY_S,
    LEARNERS,
    AgentConfig,
    BatchingConfig,
    CTConfig,
    RunConfig,
)


def parse_checkpoint_every(text: str) -> tuple[float | None, int | None]:
    """``"300s"`` → every 300 seconds; ``"50000"`` or ``"50000steps"`` → every 50000 env steps; ``"off"``: only at
    the end."""
    if text.strip() == "off":
        return None, None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|steps)?\s*", text)
    if not match or float(match.group(1)) <= 0 or (match.group(2) != "s" and "." in match.group(1)):
        raise argparse.ArgumentTypeError(
            f"--checkpoint-every takes seconds such as 300s, env steps such as 50000, or off, got {text!r}"
        )
    if match.group(2) == "s":
        return float(match.group(1)), None
    return None, int(match.group(1))


def number_option(kind: type, *, least: float | None = None, strict: bool = False):
    """An argparse type: a ``kind`` (int or float), >= ``least`` if given (> with ``strict``), else a usage error
    naming it."""
    bound = "" if least is None else f" > {least:g}" if strict else f" >= {least:g}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}{bound}, got {text!r}"
            ) from None
        if least is not None and (not value >= least or (strict and value == least)):  # "not >=" refuses NaN too
            raise argparse.ArgumentTypeError(f"must be{bound}, got {text}")
        return value

    return parse


def _discount(text: str) -> float:
    """An argparse type: a discount, from 0 to 1."""
    value = number_option(float, least=0)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a discount from 0 to 1, got {text}")
    return value


_RUN, _AGENTS, _BATCHING = RunConfig, AgentConfig, BatchingConfig
_POSITIVE = number_option(float, least=0, strict=True)
_SUPERVISION = "supervision and checkpoints"
_NETWORK = "network (agents on other machines join with `flare2 attach`)"

# fmt: off
# A table, one option a row: kept as written rather than one argument a line.
OPTIONS: tuple[tuple[str, str, type, str, dict[str, Any]], ...] = (
    # (group, flag, config class, field, argparse settings): each run option once; its default is the field's.
    ("run", "--num-agents", _AGENTS, "num_agents", dict(type=number_option(int, least=0), help="agent processes on this machine")),
    ("run", "--envs-per-agent", _AGENTS, "envs_per_agent", dict(
        type=number_option(int, least=1), help="environments each agent process plays, asked for in one request per step "
        "(default: the agent class's default_envs, 8 for a VectorAgent, 1 for an Agent)")),
    ("run", "--serial", _RUN, "serial", dict(
        action=argparse.BooleanOptionalAction, help="run everything in this one process (one agent with all the envs): "
        "for debuggers, and the fastest schedule where the agents wait for learn() anyway (presets that do set it; "
        "--no-serial undoes that)")),
    ("run", "--max-steps", _RUN, "max_steps", dict(type=number_option(int, least=1), help="stop after this many env steps in total")),
    ("run", "--max-episodes", _RUN, "max_episodes", dict(type=number_option(int, least=1), help="stop after this many episodes in total")),
    ("run", "--stop-return", _RUN, "stop_return", dict(
        type=float, help="also stop once the mean return of the last 100 episodes reaches this")),
    ("run", "--eval-every", _RUN, "eval_every", dict(
        type=number_option(int, least=0), metavar="N", help="each agent plays a greedy evaluation episode after every N "
        "training episodes (reported as eval_return_mean; not learned from; 0: none)")),
    ("run", "--stop-eval-return", _RUN, "stop_eval_return", dict(
        type=float, help="also stop once the mean return of the last 20 evaluation episodes reaches this (needs --eval-every)")),
    ("run", "--device", _RUN, "device", dict(help="where the models run: cpu, cuda, cuda:N or auto (cuda when there "
                                                  "is one and the networks hold 1M parameters or more)")),
    ("run", "--torch-threads", _RUN, "torch_threads", dict(
        type=number_option(int, least=1), help="threads torch uses for learn() in the compute process and in a learner "
        "process (1: the cores go to the agents)")),
    ("run", "--predict-threads", _RUN, "predict_threads", dict(
        type=number_option(int, least=1), help="threads torch uses for the forward passes that answer the agents "
        "(default: the cores less one per local agent process, at most --torch-threads)")),
    ("run", "--busy-wait-us", _RUN, "busy_wait_us", dict(
        type=number_option(int, least=0), metavar="US", help="microseconds a waiting process keeps checking for its message "
        f"before it sleeps (waking a core is slow); default: {AUTO_BUSY_WAIT_US} while the run's busy processes fit the "
        "cores, else 0")),
    ("run", "--log-dir", _RUN, "log_dir", dict(help="where progress.csv, manager.log and checkpoints go")),
    ("run", "--seed", _RUN, "seed", dict(type=int, help="seeds the models and each agent's env")),
    ("run", "--progress-interval", _RUN, "progress_interval_s", dict(
        type=_POSITIVE, metavar="SECONDS", help="seconds between progress lines")),
    ("run", "--tensorboard", _RUN, "tensorboard", dict(
        action="store_true", help="also write the progress and learn scalars as TensorBoard events in the log dir "
        "(needs: pip install -e \".[tensorboard]\")")),
    ("run", "--wandb", _RUN, "wandb_project", dict(
        metavar="PROJECT", help="also log the progress and learn scalars to this Weights & Biases project, as a W&B run "
        "named after the log dir (turns on --tensorboard; needs: pip install -e \".[wandb]\" and wandb login, or "
        "WANDB_MODE=offline to keep the W&B run in the log dir for a later wandb sync)")),
    ("batching", "--max-batch", _BATCHING, "max_batch", dict(
        type=number_option(int, least=1), help="a prediction batch is flushed once it holds this many requests")),
    ("batching", "--max-wait-ms", _BATCHING, "max_wait_ms", dict(
        type=number_option(float, least=0), help="... or once its oldest request has waited this long, or every live agent "
        "waits (0: serve what is waiting each time the compute loop is free)")),
    ("batching", "--learn-max-batch", _BATCHING, "learn_max_batch", dict(
        type=number_option(int, least=1), help="a learn batch is flushed once it holds this many learn requests")),
    ("batching", "--learn-max-wait-ms", _BATCHING, "learn_max_wait_ms", dict(
        type=number_option(float, least=0), help="... or once its oldest has waited this long for those of the other live agents")),
    ("batching", "--learner", _RUN, "learner", dict(
        choices=LEARNERS, help="where learn() runs: a process of its own beside the predictions, a thread (pays where "
        "learn() runs mostly outside Python: large models, GPU), or inline between predictions; auto: a process where "
        "the algorithm allows one and there are 2 cores or more")),
    ("batching", "--learners", _RUN, "learners", dict(
        type=number_option(int, least=1), help="learner processes training the model data-parallel, each on an equal "
        "share of every learn batch, gradients averaged (torch.distributed: one GPU each with --device cuda, gloo on "
        "CPU cores otherwise)")),
    ("batching", "--remote-learners", _RUN, "remote_learners", dict(
        type=number_option(int, least=0), help="how many of --learners run on other machines, each started there "
        "with `flare2 learn MANAGER_ENDPOINT --keys DIR` (torch.distributed's traffic is not encrypted: a trusted "
        "network only)")),
    ("batching", "--max-message-bytes", _RUN, "max_message_bytes", dict(
        type=number_option(int, least=1024), help="largest message a socket of the run accepts from another machine "
        "(observations and learn requests must fit; larger ones are refused with an error); agents on the compute "
        "process's machine may send up to this or 1 GiB, whichever is more")),
    (_SUPERVISION, "--max-restarts", _RUN, "max_restarts", dict(
        type=number_option(int, least=0), help="agent restarts (crash, kill, heartbeat timeout) allowed before the run fails")),
    (_SUPERVISION, "--restart-backoff", _RUN, "restart_backoff_s", dict(
        type=_POSITIVE, metavar="SECONDS", help="wait before restarting an agent, doubled for each failure in a row (up to 30 s)")),
    (_SUPERVISION, "--reply-timeout", _RUN, "reply_timeout_s", dict(
        type=_POSITIVE, metavar="SECONDS", help="longest an agent waits for one prediction or learn reply (default: as "
        "long as the manager says the compute process is alive)")),
    (_SUPERVISION, "--heartbeat-timeout", _RUN, "heartbeat_timeout_s", dict(
        type=_POSITIVE, metavar="SECONDS", help="seconds of silence after which an agent is taken for dead and restarted; "
        "a group of learners re-formed after a death waits this long for its learners on other machines")),
    (_SUPERVISION, "--startup-timeout", _RUN, "startup_timeout_s", dict(
        type=_POSITIVE, metavar="SECONDS", help="how long the compute process (building the models) and the agents may "
        "take to come up, the first group of learners waits for its learners on other machines, and a learner waits "
        "for another in a collective before the group breaks")),
    (_SUPERVISION, "--stop-timeout", _RUN, "stop_timeout_s", dict(
        type=_POSITIVE, metavar="SECONDS", help="how long children get to exit when asked before they are killed")),
    (_SUPERVISION, "--resume", _RUN, "resume_dir", dict(
        metavar="DIR", help="continue the learning and counters of the run whose log dir is DIR")),
    (_NETWORK, "--bind", _RUN, "bind", dict(
        help="address the manager and the CDPs listen on")),
    (_NETWORK, "--port", _RUN, "port", dict(
        type=int, help="port of the manager's control endpoint (0: any free one)")),
    (_NETWORK, "--advertise", _RUN, "advertise", dict(
        metavar="ADDRESS", help="address agents are told to connect to, when it differs from --bind (NAT, several NICs)")),
    (_NETWORK, "--keys", _RUN, "keys_dir", dict(
        metavar="DIR", help="CurveZMQ keys made by `flare2 keys DIR`: only clients in DIR/allowed get in")),
    (_NETWORK, "--insecure", _RUN, "insecure", dict(
        action="store_true", help="allow a non-loopback --bind without keys (anyone who reaches the port can join)")),
)
# fmt: on
"""Every run option: the command line is derived from this table, and the config from what it parsed."""


COMMAND_LINE_DEFAULTS = {"max_steps": 500_000}
"""Where the command line starts unlike a RunConfig written in code: with a budget, which a RunConfig must be
given."""


def _field_default(owner: type, name: str) -> Any:
    return next(field.default for field in dataclasses.fields(owner) if field.name == name)


def add_run_options(parser: argparse.ArgumentParser, **defaults: Any) -> None:
    """Add the options of a run (budget, agents, device, batching, supervision, checkpoints) to ``parser``.

    ``defaults`` replaces the default of an option by its field name (``num_agents=1, envs_per_agent=8``): a
    manager script's own starting point.
    """
    unknown = set(defaults) - {name for *_, name, _ in OPTIONS}
    if unknown:
        raise TypeError(f"add_run_options got defaults for no run option: {sorted(unknown)}")
    groups: dict[str, Any] = {}
    for group, flag, owner, name, settings in OPTIONS:
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        default = defaults.get(name, COMMAND_LINE_DEFAULTS.get(name, _field_default(owner, name)))
        groups[group].add_argument(flag, dest=name, default=default, **settings)
    # One option for the two fields checkpoint_every_s and checkpoint_every_steps.
    groups[_SUPERVISION].add_argument(
        "--checkpoint-every",
        type=parse_checkpoint_every,
        default=(CHECKPOINT_EVERY_S, None),
        help="also write a checkpoint every N seconds (300s) or N env steps (50000), or off; always at the end; a "
        f"compute process that dies restarts from the last one; default: {CHECKPOINT_EVERY_S:.0f}s",
    )


def _parsed(args: argparse.Namespace, owner: type) -> dict[str, Any]:
    return {name: getattr(args, name) for _, _, kind, name, _ in OPTIONS if kind is owner}


def batching_from_args(args: argparse.Namespace) -> BatchingConfig:
    return BatchingConfig(**_parsed(args, BatchingConfig))


def run_config_from_args(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    *,
    cts: Sequence[CTConfig],
    agent_path: str,
    agent_kwargs: dict | None = None,
) -> RunConfig:
    """The RunConfig of the options added by :func:`add_run_options`; a bad value is a usage error naming it."""
    try:
        return _run_config(args, cts, agent_path, agent_kwargs)
    except ConfigError as exc:
        parser.error(str(exc))


def _run_config(
    args: argparse.Namespace, cts: Sequence[CTConfig], agent_path: str, agent_kwargs: dict | None
) -> RunConfig:
    every_s, every_steps = args.checkpoint_every
    return RunConfig(
        cts=tuple(cts),
        agents=AgentConfig(path=agent_path, kwargs=agent_kwargs or {}, **_parsed(args, AgentConfig)),
        checkpoint_every_s=every_s,
        checkpoint_every_steps=every_steps,
        **_parsed(args, RunConfig),
    )


# ---- an algorithm's settings -----------------------------------------------------------------------------------


class _Derived:
    """The default of an option whose value the script derives from another one (``derived`` below)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __repr__(self) -> str:
        return self.source


def _field_docs(config_class: type) -> dict[str, str]:
    """The docstring under each field of a dataclass and of its dataclass bases: what ``--help`` says of it."""
    docs: dict[str, str] = {}
    for klass in reversed(config_class.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0]
        except (OSError, TypeError):  # no source (a class made at run time): the options go without help
            continue
        if not isinstance(tree, ast.ClassDef):  # the source of a class is its class statement; nothing else has docs
            continue
        body = tree.body
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split()).replace("%", "%%")
    return docs


# How argparse reads a config field of each plain type.
_FIELD_PARSERS = {int: number_option(int), float: number_option(float), str: str}


def _or_none(parse):
    return lambda text: None if text.lower() == "none" else parse(text)


def _argument_settings(hint: Any, name: str, owner: type) -> dict[str, Any]:
    """How argparse reads a field of this type: bool, int, float, str, ``X | None``, ``tuple[X, ...]``."""
    if hint is bool:
        return {"action": argparse.BooleanOptionalAction}
    if hint in _FIELD_PARSERS:
        return {"type": _FIELD_PARSERS[hint]}
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and len(arguments) == 2 and type(None) in arguments:
        kind = next(argument for argument in arguments if argument is not type(None))
        if kind in _FIELD_PARSERS:
            return {"type": _or_none(_FIELD_PARSERS[kind]), "metavar": f"{name.upper()}|none"}
    if origin is tuple and len(arguments) == 2 and arguments[1] is Ellipsis and arguments[0] in _FIELD_PARSERS:
        return {"type": _FIELD_PARSERS[arguments[0]], "nargs": "+"}
    raise TypeError(
        f"{owner.__name__}.{name} is a {hint}, which has no command-line form (bool, int, float, str, "
        "X | None, tuple[X, ...])"
    )


def add_config_options(
    parser: argparse.ArgumentParser,
    config_class: type,
    *,
    derived: dict[str, str] | None = None,
    title: str = "the algorithm's settings",
    **defaults: Any,
) -> None:
    """Add one option per field of the dataclass ``config_class`` (``--lr``, ``--gamma``, ``--no-double-q``...), with
    the field's type, default and docstring; :func:`config_from_args` makes the config from them.

    ``defaults`` replaces a field's default (a script's own starting point); ``derived`` names fields whose default
    the script takes from another option, with the words ``--help`` shows for it (``{"anneal_steps": "--max-steps"}``).
    """
    fields = {field.name: field for field in dataclasses.fields(config_class)}
    derived = derived or {}
    unknown = (set(defaults) | set(derived)) - set(fields)
    if unknown:
        raise TypeError(f"add_config_options got defaults for no field of {config_class.__name__}: {sorted(unknown)}")
    hints = typing.get_type_hints(config_class)
    docs = _field_docs(config_class)
    group = parser.add_argument_group(f"{config_class.__name__} ({title})")
    for name, field in fields.items():
        default = _Derived(derived[name]) if name in derived else defaults.get(name, field.default)
        settings = _argument_settings(hints[name], name, config_class)
        if "action" not in settings:
            settings.setdefault("metavar", name.upper())
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=f"{config_class.__name__}.{name}",
            default=default,
            help=f"{docs.get(name, '')} (default: %(default)s)".lstrip(),
            **settings,
        )


def config_from_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace, config_class: type, **derived_values: Any
) -> Any:
    """The ``config_class`` of the options :func:`add_config_options` added; ``derived_values`` gives the value of
    each field left to its derived default. A value the config refuses is a usage error naming it."""
    _refuse_defaults_that_miss_the_config(parser, args, config_class)
    values = {}
    for field in dataclasses.fields(config_class):
        value = getattr(args, f"{config_class.__name__}.{field.name}")
        if isinstance(value, _Derived):
            value = derived_values[field.name]
        values[field.name] = tuple(value) if isinstance(value, list) else value
    try:
        return config_class(**values)
    except ConfigError as exc:
        parser.error(str(exc))
    except TypeError as exc:  # a preset's value of the wrong kind meets the config's checks
        parser.error(f"{config_class.__name__}: a value of the wrong kind ({exc}): {values}")


def _refuse_defaults_that_miss_the_config(
    parser: argparse.ArgumentParser, args: argparse.Namespace, config_class: type
) -> None:
    """``parser.set_defaults(lr=...)`` sets an attribute that no option reads (the config's options keep their values
    under ``PPOConfig.lr``), so the script would run with the field's own default without a word."""
    options = {action.dest for action in parser._actions}
    missed = [
        field.name
        for field in dataclasses.fields(config_class)
        if field.name in vars(args) and field.name not in options
    ]
    if missed:
        given = ", ".join(f"{name}=..." for name in missed)
        raise TypeError(
            f"parser.set_defaults({given}) reaches no option: {config_class.__name__}'s options keep their own "
            f"defaults; give a script's default as add_config_options(parser, {config_class.__name__}, {given})"
        )


# ---- the agent side's data transforms ----------------------------------------------------------------------------


def add_transform_options(parser: argparse.ArgumentParser) -> None:
    """Options for the data transforms of the stock GymAgent (``flare2.core.transforms``); see ``transforms_from_args``."""
    group = parser.add_argument_group("data transforms (the agent acts on and learns from what they give)")
    group.add_argument(
        "--normalize-observations",
        action="store_true",
        help="normalise each observation by running mean and variance, counted by every agent of the "
        "run together and kept in the checkpoint",
    )
    group.add_argument(
        "--normalize-rewards",
        type=_discount,
        default=None,
        metavar="GAMMA",
        help="divide each reward (after any scaling and clipping) by the running standard deviation of the return "
        "discounted by GAMMA (give the algorithm's), then clip it to +-10; counted by every agent of the run together "
        "and kept in the checkpoint (SB3's VecNormalize(norm_reward=True))",
    )
    group.add_argument(
        "--scale-rewards",
        type=number_option(float),
        default=None,
        metavar="FACTOR",
        help="multiply every reward by FACTOR (before clipping)",
    )
    group.add_argument(
        "--clip-rewards",
        type=number_option(float, least=0, strict=True),
        default=None,
        metavar="LIMIT",
        help="clip every reward to [-LIMIT, LIMIT]",
    )


def transforms_from_args(args: argparse.Namespace) -> list[Any]:
    """The ``transforms`` option of GymAgent that the options of ``add_transform_options`` ask for, in order."""
    return transform_options(vars(args))


def transform_options(values: Mapping[str, Any]) -> list[Any]:
    """``transforms_from_args`` of the values of those options by name (a run's recorded options)."""
    transforms: list[Any] = []
    if values.get("normalize_observations"):
        transforms.append("normalize_observations")
    if values.get("scale_rewards") is not None:
        transforms.append(["scale_rewards", {"factor": values["scale_rewards"]}])
    if values.get("clip_rewards") is not None:
        transforms.append(["clip_rewards", {"low": -values["clip_rewards"], "high": values["clip_rewards"]}])
    if values.get("normalize_rewards") is not None:
        transforms.append(["normalize_rewards", {"gamma": values["normalize_rewards"]}])
    return transforms
