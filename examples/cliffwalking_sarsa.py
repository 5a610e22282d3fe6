"""Train tabular SARSA on CliffWalking-v1: on-policy TD control with epsilon-greedy agents.

    python examples/cliffwalking_sarsa.py --num-agents 8 --max-steps 60000 --eval-every 2 --log-dir runs/sarsa

The Q-network is linear over a one-hot state: a Q-table of 48 states x 4
actions, each step moving its own entry by lr times its TD error.
Every 8 steps each agent sends its last 8 steps; a target bootstraps from the
action the agent took next. CliffWalking has no time limit of its own, so the
env gets one (--time-limit); stepping off the cliff costs -100 and returns to
the start. Undiscounted by default, as in Sutton & Barto's Example 6.6: the
shortest path to the goal is 13 steps (return -13).
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
    batching_from_args,
    config_from_args,
    run_config_from_args,
)
from flare2.zoo.records.sarsa import SARSAConfig
from flare2.zoo.sarsa import SARSA


# 1. The Algorithm, built inside the compute process.
def build_sarsa(env_id: str, config: SARSAConfig) -> SARSA:
    return SARSA.for_env(make_gym_env(env_id), config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CliffWalking-v1", help="Gymnasium env id (Discrete observations and actions)")
    parser.add_argument("--time-limit", type=int, default=200, help="steps after which an episode is truncated")
    parser.add_argument("--sample-interval", type=int, default=8, help="env steps per learn request")
    add_config_options(parser, SARSAConfig, gamma=1.0)
    # SARSA learns from a few steps at a time: in the compute loop it runs faster than in a learner process (2.5k
    # against 2.2k env steps/s on 2 cores), so learn() runs there unless --learner says otherwise.
    add_run_options(
        parser, num_agents=8, envs_per_agent=1, max_steps=60_000, log_dir="runs/cliffwalking_sarsa", learner="inline"
    )
    args = parser.parse_args(argv)
    config = config_from_args(parser, args, SARSAConfig)
    # 2. One CT "RL" with a linear Q-network over the one-hot state.
    ct = CTConfig(name="RL", build=partial(build_sarsa, args.env, config), batching=batching_from_args(args))
    # 3. The stock Gymnasium agent with the online helper: SARSA learns from the steps as they are played.
    agent_kwargs = {
        "env_id": args.env,
        "env_kwargs": {"max_episode_steps": args.time_limit},
        "ct": "RL",
        "sample_interval": args.sample_interval,
    }
    run = run_config_from_args(
        parser, args, cts=[ct], agent_path="flare2.core.envs:GymAgent", agent_kwargs=agent_kwargs
    )
    # 4. The manager runs to the budget.
    return Manager(run).run()


if __name__ == "__main__":
    sys.exit(main())
