"""Train TD3 on Pendulum-v1: replay buffers in the agent processes, one batched actor-critic.

    python examples/pendulum_td3.py --num-agents 8 --max-steps 50000 --log-dir runs/pendulum_td3

Each agent keeps its own replay buffer (an eighth of the capacity) and, after
a warm-up of uniformly random actions, sends 256 sampled transitions every
step; the requests of one round make one learn() call, which takes a
gradient step per 256 of them: one gradient step per env step, as in the
SB3-zoo Pendulum TD3 (Adam 1e-3, gamma 0.98, exploration noise 0.1). Its
10k-step warm-up is cut to 2k here so that the 100-episode return window
can fill with learned episodes well before 50k steps.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from flare2.core.env_making import make_gym_env
from flare2.runtime.config import CTConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.options import (
    add_config_options,
    add_run_options,
    add_transform_options,
    batching_from_args,
    config_from_args,
    run_config_from_args,
    transforms_from_args,
)
from flare2.zoo.records.td3 import TD3Config
from flare2.zoo.td3 import TD3


# 1. The Algorithm, built inside the compute process.
def build_td3(env_id: str, config: TD3Config) -> TD3:
    return TD3.for_env(make_gym_env(env_id), config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum-v1", help="Gymnasium env id (Box observations, bounded Box actions)")
    parser.add_argument(
        "--buffer", type=int, default=200_000, help="replay capacity over all agents (each keeps its share)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=2_000,
        help="steps over all agents with uniformly random actions, stored before learning starts",
    )
    parser.add_argument("--sample-interval", type=int, default=1, help="env steps per agent between learn requests")
    parser.add_argument("--batch-size", type=int, default=256, help="transitions per learn request")
    # Small layers: a gradient step per env step on CPU.
    add_config_options(parser, TD3Config, hidden=(64, 64), derived={"random_steps": "--warmup"})
    add_run_options(parser, num_agents=8, envs_per_agent=1, max_steps=50_000, log_dir="runs/pendulum_td3")
    add_transform_options(parser)
    args = parser.parse_args(argv)
    # 2. One CT "RL" with the actor and the two critics; actions are uniform over the box during the warm-up.
    config = config_from_args(parser, args, TD3Config, random_steps=args.warmup)
    ct = CTConfig(name="RL", build=partial(build_td3, args.env, config), batching=batching_from_args(args))
    # 3. The stock Gymnasium agent with a replay buffer in place of the online helper.
    agents = max(args.num_agents, 1)
    replay = {
        "capacity": max(args.buffer // agents, args.batch_size),
        "warmup": max(args.warmup // agents, 1),
        "sample_interval": args.sample_interval,
        "batch_size": args.batch_size,
    }
    agent_kwargs = {"env_id": args.env, "ct": "RL", "replay": replay, "transforms": transforms_from_args(args)}
    run = run_config_from_args(
        parser, args, cts=[ct], agent_path="flare2.core.envs:GymAgent", agent_kwargs=agent_kwargs
    )
    # 4. The manager runs to the budget (or to --stop-return).
    return Manager(run).run()


if __name__ == "__main__":
    sys.exit(main())
