"""Train PPO on CartPole-v1: agent processes of several envs each, sharing one batched ComputationTask.

    python examples/cartpole_ppo.py --max-steps 100000 --log-dir runs/ppo

By default one agent process plays 8 envs beside the compute process. It
sends 32 steps of its envs per learn request: one learn() call of 256 steps,
over which PPO takes 20 epochs (the SB3-zoo CartPole settings), while the
agent plays the next 32 steps. The learning rate falls linearly to 0 over
--max-steps. With more --num-agents, the requests of one round make one call.
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
    add_transform_options,
    batching_from_args,
    config_from_args,
    run_config_from_args,
    transforms_from_args,
)
from flare2.zoo.records.ppo import PPOConfig


# 1. The Algorithm, built inside the compute process (a module-level function, for the spawn start method).
#    The zoo is imported here, so the manager process never loads torch.
def build_ppo(env_id: str, config: PPOConfig):
    from flare2.core.env_making import make_gym_env
    from flare2.zoo.ppo import PPO

    return PPO.for_env(make_gym_env(env_id), config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium env id (Box or Discrete spaces)")
    parser.add_argument("--sample-interval", type=int, default=32, help="env steps per agent in each learn request")
    parser.add_argument(
        "--no-double-buffer",
        dest="double_buffer",
        action="store_false",
        help="each agent steps all its envs, then asks for all their actions (by default two halves "
        "of its envs alternate: one is stepped while the other's actions are predicted)",
    )
    parser.add_argument(
        "--complete-episodes",
        action="store_true",
        help="send whole episodes (at least --sample-interval steps per env of them together) instead "
        "of fragments of --sample-interval steps: nothing is bootstrapped from a cut",
    )
    add_config_options(parser, PPOConfig, derived={"anneal_steps": "--max-steps"})
    add_run_options(parser, max_steps=100_000, log_dir="runs/cartpole_ppo")
    add_transform_options(parser)
    # One learn() call per round of all agents (256 steps) matters for PPO: wait for the stragglers.
    parser.set_defaults(learn_max_wait_ms=200.0)
    args = parser.parse_args(argv)
    # 2. One CT "RL"; the PPO model also returns the acting policy's log-probability with each action.
    config = config_from_args(parser, args, PPOConfig, anneal_steps=args.max_steps)
    build = partial(build_ppo, args.env, config)
    ct = CTConfig(name="RL", build=build, batching=batching_from_args(args))
    # 3. The stock Gymnasium agent stores every action output, so learn() gets the log-probabilities.
    agent_kwargs = {
        "env_id": args.env,
        "ct": "RL",
        "sample_interval": args.sample_interval,
        "double_buffer": args.double_buffer,
        "transforms": transforms_from_args(args),
        "complete_episodes": args.complete_episodes,
    }
    run = run_config_from_args(
        parser, args, cts=[ct], agent_path="flare2.core.envs:GymAgent", agent_kwargs=agent_kwargs
    )
    # 4. The manager runs to the budget.
    return Manager(run).run()


if __name__ == "__main__":
    sys.exit(main())
