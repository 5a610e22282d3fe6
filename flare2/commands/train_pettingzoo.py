"""What ``flare2 train`` does for a PettingZoo env (``flare2.core.pettingzoo_agent``): the stock agent's settings,
what it refuses, and a CT for each group of agents the policy map makes (or self-play's learner and its frozen copy)."""

from __future__ import annotations

import argparse
from typing import Any

from flare2.core.env_making import is_turn_based, make_pettingzoo_env, shared_spaces
from flare2.core.envs import DEFAULT_CT
from flare2.core.pettingzoo_agent import OPPONENT_CT, policy_groups, policy_map, sparring_shares
from flare2.errors import ConfigError
from flare2.runtime.config import CTConfig
from flare2.runtime.options import batching_from_args, transforms_from_args
from flare2.zoo.record import AlgorithmRecord
from flare2.zoo.registry import check_spaces


def pettingzoo_agent(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    algo: str,
    env_id: str,
    settings: Any,
) -> tuple[str, dict[str, Any]]:
    """The stock multi-agent agent's path and keyword arguments (``settings``: the algorithm's agent settings); a
    usage error for what it does not do."""
    helper_kwargs, frames = settings.helper_kwargs(args.num_agents), getattr(settings, "frames", 1)
    refused = [
        option
        for option, given in (
            (f"--frames {frames}", frames > 1),
            ("--max-episode-steps", args.max_episode_steps is not None),
            (f"--env-engine {args.env_engine}", args.env_engine not in ("python", "auto")),
            ("--double-buffer", helper_kwargs.get("double_buffer", False)),
            ("--complete-episodes", helper_kwargs.get("complete_episodes", False)),
            ("--eval-every (without --self-play)", bool(args.eval_every) and not args.self_play),
        )
        if given
    ]
    if refused:
        parser.error(
            f"{', '.join(refused)}: flare2 plays the PettingZoo env {env_id!r} with its own episode length, in Python, "
            "each agent's steps in fragments of --sample-interval, without frame stacks (agents come and go), with "
            "evaluation games in self-play alone (against fixed players): leave them out"
        )
    # Sparring that the env's preset gives goes with the preset's self-play, which --self-play 0 turns off.
    sparring = args.self_play_sparring if args.self_play else ""
    if (
        args.self_play_sparring
        and not args.self_play
        and args.self_play_sparring != parser.get_default("self_play_sparring")
    ):
        parser.error(
            "--self-play-sparring puts fixed players in self-play's opponent seats: give --self-play N as well"
        )
    try:
        sparring_shares(sparring, env_id)
    except ConfigError as exc:
        parser.error(str(exc))
    kwargs = {
        "env_id": env_id,
        "policy_map": args.policy_map or "shared",
        "transforms": transforms_from_args(args),
        "self_play": bool(args.self_play),
        "sparring": sparring,
        # An on-policy algorithm's fragments, or a replay buffer's settings (a column per agent of every game).
        **({"replay": helper_kwargs["replay"]} if "replay" in helper_kwargs else {}),
        **({"sample_interval": helper_kwargs["sample_interval"]} if "sample_interval" in helper_kwargs else {}),
    }
    return "flare2.core.pettingzoo_agent:PettingZooAgent", kwargs


def pettingzoo_cts(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    record: AlgorithmRecord,
    env_id: str,
    config: Any,
    settings: Any,
) -> list[CTConfig]:
    """A CT per group of agents the policy map makes; with ``--self-play``, the learner's CT and its frozen copy."""
    batching = batching_from_args(args)
    cts = [
        CTConfig(name=ct, build=record.builder(env_id, {}, config, settings, agents=tuple(agents)), batching=batching)
        for ct, agents in policies(parser, record, env_id, args.policy_map, self_play=bool(args.self_play)).items()
    ]
    # A pool that the env's preset gives goes with the preset's self-play, which --self-play 0 turns off.
    pool_given = args.self_play_pool != parser.get_default("self_play_pool")
    if args.self_play_pool > 1 and not args.self_play and pool_given:
        parser.error("--self-play-pool K keeps past copies of the learner for its opponent: give --self-play N as well")
    if args.self_play:
        cts.append(
            CTConfig(
                name=OPPONENT_CT,
                build=cts[0].build,
                batching=batching,
                follows=DEFAULT_CT,
                refresh_every=args.self_play,
                snapshots=args.self_play_pool,
            )
        )
    return cts


def policies(
    parser: argparse.ArgumentParser,
    record: AlgorithmRecord,
    env_id: str,
    spec: str | None,
    *,
    self_play: bool,
) -> dict[str, list[str]]:
    """Each learning CT of a PettingZoo env's run and its agents, by ``--policy-map`` (with ``self_play``, every agent
    may take the learner's seat); a usage error for a map that does not cover the agents, a CT whose agents' spaces
    differ or do not fit the algorithm, or self-play in a game that is not turn-based."""
    try:
        env = make_pettingzoo_env(env_id)
    except ConfigError as exc:
        parser.error(str(exc))
    try:
        agents = list(env.possible_agents)
        if self_play and (spec is not None or not is_turn_based(env)):
            raise ConfigError(
                f"--self-play: the learner takes one seat of each game of a turn-based env and its frozen copy the "
                f"others ({env_id!r} is {'turn-based' if is_turn_based(env) else 'not turn-based'}), with no "
                "--policy-map; --self-play 0 turns it off where the env's preset turns it on"
            )
        cts = policy_groups(agents, policy_map(agents, spec or "shared").__getitem__)
        for ct, its_agents in cts.items():
            spaces = shared_spaces(env, env_id, its_agents)
            where = f"{env_id} (CT {ct!r}: {', '.join(its_agents)})"
            check_spaces(record, where, spaces.observation_space, spaces.action_space)
    except ConfigError as exc:
        parser.error(str(exc))
    finally:
        env.close()
    return cts
