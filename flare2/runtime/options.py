"""The command-line options every manager script shares, and the RunConfig they make."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from flare2.errors import ConfigError
from flare2.runtime.config import LEARNERS, AgentConfig, BatchingConfig, CTConfig, RunConfig


def parse_checkpoint_every(text: str) -> tuple[float | None, int | None]:
    """``"300s"`` → every 300 seconds; ``"50000"`` or ``"50000steps"`` → every 50000 env steps."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|steps)?\s*", text)
    if not match or float(match.group(1)) <= 0 or (match.group(2) != "s" and "." in match.group(1)):
        raise argparse.ArgumentTypeError(
            f"--checkpoint-every takes seconds such as 300s or env steps such as 50000, got {text!r}"
        )
    if match.group(2) == "s":
        return float(match.group(1)), None
    return None, int(match.group(1))


def _number(kind: type, *, least: float, strict: bool = False):
    """An argparse type: a ``kind`` (int or float) >= ``least`` (> with ``strict``), else a usage error naming it."""
    bound = f"> {least:g}" if strict else f">= {least:g}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'} {bound}, got {text!r}") from None
        if not value >= least or (strict and value == least):  # "not >=" refuses NaN too
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse


def add_run_options(parser: argparse.ArgumentParser, *, num_agents: int = 1, envs_per_agent: int = 8,
                    max_steps: int | None = 500_000, log_dir: str = "runs/latest", learner: str = RunConfig.learner) -> None:
    """Add the options of a run (budget, agents, device, batching, supervision, checkpoints) to ``parser``."""
    run = parser.add_argument_group("run")
    run.add_argument("--num-agents", type=_number(int, least=0), default=num_agents, help="agent processes on this machine")
    run.add_argument("--envs-per-agent", type=_number(int, least=1), default=envs_per_agent,
                     help="environments each agent process plays, asked for in one request per step")
    run.add_argument("--serial", action="store_true",
                     help="run everything in this one process (one agent with all the envs): for debuggers")
    run.add_argument("--max-steps", type=_number(int, least=1), default=max_steps, help="stop after this many env steps in total")
    run.add_argument("--max-episodes", type=_number(int, least=1), default=None, help="stop after this many episodes in total")
    run.add_argument("--stop-return", type=float, default=None,
                     help="also stop once the mean return of the last 100 episodes reaches this")
    run.add_argument("--eval-every", type=_number(int, least=0), default=0, metavar="N",
                     help="each agent plays a greedy evaluation episode after every N training episodes "
                          "(reported as eval_return_mean; not learned from; 0: none)")
    run.add_argument("--stop-eval-return", type=float, default=None,
                     help="also stop once the mean return of the last 20 evaluation episodes reaches this (needs --eval-every)")
    run.add_argument("--device", default=RunConfig.device, help="where the models run: cpu, cuda, cuda:N or auto (cuda when there is one)")
    run.add_argument("--log-dir", default=log_dir, help="where progress.csv, manager.log and checkpoints go")
    run.add_argument("--seed", type=int, default=RunConfig.seed, help="seeds the models and each agent's env")
    run.add_argument("--progress-interval", type=_number(float, least=0, strict=True), default=RunConfig.progress_interval_s,
                     help="seconds between progress lines")
    batching = parser.add_argument_group("batching")
    batching.add_argument("--max-batch", type=_number(int, least=1), default=BatchingConfig.max_batch,
                          help="a prediction batch is flushed once it holds this many requests")
    batching.add_argument("--max-wait-ms", type=_number(float, least=0), default=BatchingConfig.max_wait_ms,
                          help="... or once its oldest request has waited this long, or every live agent waits "
                               "(0: serve what is waiting each time the compute loop is free)")
    batching.add_argument("--learn-max-wait-ms", type=_number(float, least=0), default=BatchingConfig.learn_max_wait_ms,
                          help="a learn batch waits at most this long for the learn requests of the other live agents")
    batching.add_argument("--learner", choices=LEARNERS, default=learner,
                          help="where learn() runs: a process of its own beside the predictions, a thread (pays where "
                               "learn() runs mostly outside Python: large models, GPU), or inline between predictions; "
                               "auto: a process where the algorithm allows one and there are 2 cores or more")
    batching.add_argument("--max-message-bytes", type=_number(int, least=1024), default=RunConfig.max_message_bytes,
                          help="largest message any socket of the run accepts (observations and learn requests "
                               "must fit; larger ones are refused with an error)")
    supervision = parser.add_argument_group("supervision and checkpoints")
    supervision.add_argument("--max-restarts", type=_number(int, least=0), default=RunConfig.max_restarts,
                             help="agent restarts (crash, kill, heartbeat timeout) allowed before the run fails")
    supervision.add_argument("--reply-timeout", type=_number(float, least=0, strict=True), default=RunConfig.reply_timeout_s, metavar="SECONDS",
                             help="longest an agent waits for one prediction or learn reply (default: as long as the "
                                  "manager says the compute process is alive)")
    supervision.add_argument("--heartbeat-timeout", type=_number(float, least=0, strict=True), default=RunConfig.heartbeat_timeout_s,
                             help="seconds of silence after which an agent is taken for dead and restarted")
    supervision.add_argument("--checkpoint-every", type=parse_checkpoint_every, default=(None, None),
                             help="also write a checkpoint every N seconds (300s) or N env steps (50000); always at the end")
    supervision.add_argument("--resume", default=None, metavar="DIR",
                             help="continue the learning and counters of the run whose log dir is DIR")
    network = parser.add_argument_group("network (agents on other machines join with `flare2 attach`)")
    network.add_argument("--bind", default="127.0.0.1", help="address the manager and the CDPs listen on")
    network.add_argument("--port", type=int, default=0, help="port of the manager's control endpoint (0: any free one)")
    network.add_argument("--advertise", default=None, metavar="ADDRESS",
                         help="address agents are told to connect to, when it differs from --bind (NAT, several NICs)")
    network.add_argument("--keys", default=None, metavar="DIR",
                         help="CurveZMQ keys made by `flare2 keys DIR`: only clients in DIR/allowed get in")
    network.add_argument("--insecure", action="store_true",
                         help="allow a non-loopback --bind without keys (anyone who reaches the port can join)")


def batching_from_args(args: argparse.Namespace) -> BatchingConfig:
    return BatchingConfig(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, learn_max_wait_ms=args.learn_max_wait_ms)


def run_config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace, *, cts: Sequence[CTConfig],
                         agent_path: str, agent_kwargs: dict | None = None) -> RunConfig:
    """The RunConfig of the options added by :func:`add_run_options`; a bad value is a usage error naming it."""
    try:
        return _run_config(args, cts, agent_path, agent_kwargs)
    except ConfigError as exc:
        parser.error(str(exc))


def _run_config(args: argparse.Namespace, cts: Sequence[CTConfig], agent_path: str, agent_kwargs: dict | None) -> RunConfig:
    every_s, every_steps = args.checkpoint_every
    return RunConfig(
        cts=tuple(cts),
        agents=AgentConfig(
            path=agent_path, kwargs=agent_kwargs or {}, num_agents=args.num_agents, envs_per_agent=args.envs_per_agent
        ),
        log_dir=args.log_dir,
        max_steps=args.max_steps,
        max_episodes=args.max_episodes,
        stop_return=args.stop_return,
        eval_every=args.eval_every,
        stop_eval_return=args.stop_eval_return,
        device=args.device,
        seed=args.seed,
        bind=args.bind,
        port=args.port,
        advertise=args.advertise,
        keys_dir=args.keys,
        insecure=args.insecure,
        progress_interval_s=args.progress_interval,
        max_restarts=args.max_restarts,
        heartbeat_timeout_s=args.heartbeat_timeout,
        reply_timeout_s=args.reply_timeout,
        checkpoint_every_s=every_s,
        checkpoint_every_steps=every_steps,
        resume_dir=args.resume,
        learner=args.learner,
        max_message_bytes=args.max_message_bytes,
        serial=args.serial,
    )
