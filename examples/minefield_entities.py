"""Entities: PPO with a transformer over a varying number of robots and mines (``flare2/Minefield-v0``).

    python examples/minefield_entities.py --num-agents 2 --envs-per-agent 16 --max-steps 300000 --log-dir runs/minefield
    python examples/minefield_entities.py --random-policy --max-steps 50000 --log-dir runs/minefield_random

Each observation holds 1-3 robots and 1-5 mines (``flare2.zoo.minefield``).
The stock GymAgent maps the env's ``Sequence`` spaces to ragged specs: the
requests of every env of every agent are batched without padding, and
``EntityActorCritic`` embeds each entity type, lets each observation's
entities attend to one another (never to another observation's), and acts
with one move per robot and one select-entity action (which mine the cannon
fires at). ``--random-policy`` plays the same envs with uniformly random
actions and learns nothing: the baseline of the README's curve.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from flare2.runtime.config import CTConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.options import (
    add_config_options,
    add_run_options,
    batching_from_args,
    config_from_args,
    run_config_from_args,
)
from flare2.zoo.minefield import MINEFIELD_ENTRY
from flare2.zoo.records.ppo import PPOConfig


# 1. The Algorithm, built inside the compute process; torch is imported there, never in the manager.
def build(config: PPOConfig, width: int, layers: int, random_policy: bool):
    from flare2.core.env_making import make_gym_env
    from flare2.zoo.entity import EntityActorCritic, UniformEntityPolicy
    from flare2.zoo.ppo import PPO

    env = make_gym_env(MINEFIELD_ENTRY)
    model = EntityActorCritic(
        env.observation_space,
        env.action_space,
        actors={"move": "robot"},
        selects={"fire": "mine"},
        width=width,
        layers=layers,
    )
    return UniformEntityPolicy(model) if random_policy else PPO(model, config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample-interval", type=int, default=32, help="env steps per env in each learn request")
    parser.add_argument("--width", type=int, default=64, help="entity embedding and transformer width")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers")
    parser.add_argument("--random-policy", action="store_true", help="uniformly random actions, no learning")
    add_config_options(
        parser,
        PPOConfig,
        derived={"anneal_steps": "--max-steps"},
        lr=3e-4,
        gae_lambda=0.95,
        epochs=4,
        minibatch_size=256,
        entropy_coef=0.01,
    )
    add_run_options(parser, num_agents=2, envs_per_agent=16, max_steps=300_000, log_dir="runs/minefield")
    args = parser.parse_args(argv)
    # 2. One CT "RL": its specs hold two ragged inputs (robot, mine) and a ragged action (a move per robot).
    config = config_from_args(parser, args, PPOConfig, anneal_steps=args.max_steps)
    ct = CTConfig(
        name="RL",
        build=partial(build, config, args.width, args.layers, args.random_policy),
        batching=batching_from_args(args),
    )
    # 3. The stock Gymnasium agent: Dict and Sequence spaces become named, ragged inputs and actions.
    agent_kwargs = {"env_id": MINEFIELD_ENTRY, "ct": "RL", "sample_interval": args.sample_interval}
    run = run_config_from_args(
        parser, args, cts=[ct], agent_path="flare2.core.envs:GymAgent", agent_kwargs=agent_kwargs
    )
    # 4. The manager runs to the budget.
    return Manager(run).run()


if __name__ == "__main__":
    sys.exit(main())
