"""Train DQN on CartPole-v1: replay buffers in the agent processes, one batched Q-network.

    python examples/cartpole_dqn.py --num-agents 8 --max-steps 100000 --eval-every 1 --log-dir runs/dqn

Each agent keeps its own replay buffer (an eighth of 100k steps) and, after a
warm-up, sends 64 sampled sequences of 3 steps every 2 steps; the requests of
one round make one learn() call, which takes a gradient step per 64 of them.
Each sequence's first step learns from its 3-step return (--n-step; 1 gives
the one-step target of the original DQN). A 128-128 ReLU network, Adam with its
learning rate falling linearly to 0 at --max-steps, epsilon from 1 to 0.04
over the first 8000 steps, double-Q targets, and a target network that
follows the Q-network by Polyak averaging (tau 0.005 per gradient step).
Judge it by greedy evaluation episodes (--eval-every): the training return
includes the random actions. With 64-64 layers one seed in three settled on a
policy that balances the pole but lets the cart drift off the track after
about 270 steps; 128-128 passed 475 on all three.
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
from flare2.zoo.dqn import DQN
from flare2.zoo.records.dqn import DQNConfig


# 1. The Algorithm, built inside the compute process.
def build_dqn(env_id: str, config: DQNConfig, hidden: tuple[int, ...]) -> DQN:
    return DQN.for_env(make_gym_env(env_id), config, hidden)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium env id (Box observations, Discrete actions)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 128], help="sizes of the hidden layers")
    parser.add_argument(
        "--buffer", type=int, default=100_000, help="replay capacity over all agents (each keeps its share)"
    )
    parser.add_argument("--warmup", type=int, default=1_000, help="steps stored over all agents before learning starts")
    parser.add_argument("--sample-interval", type=int, default=2, help="env steps per agent between learn requests")
    parser.add_argument("--batch-size", type=int, default=64, help="sampled sequences per learn request")
    parser.add_argument("--n-step", type=int, default=3, help="steps of the return each target is made of")
    add_config_options(parser, DQNConfig, derived={"anneal_steps": "--max-steps"})
    add_run_options(parser, num_agents=8, envs_per_agent=1, max_steps=100_000, log_dir="runs/cartpole_dqn")
    args = parser.parse_args(argv)
    # 2. One CT "RL" with a Q-network; learn() gets the replayed transitions of every agent.
    config = config_from_args(parser, args, DQNConfig, anneal_steps=args.max_steps)
    ct = CTConfig(
        name="RL", build=partial(build_dqn, args.env, config, tuple(args.hidden)), batching=batching_from_args(args)
    )
    # 3. The stock Gymnasium agent with a replay buffer in place of the online helper.
    agents = max(args.num_agents, 1)
    replay = {
        "capacity": max(args.buffer // agents, args.batch_size),
        "warmup": max(args.warmup // agents, args.n_step),
        "sample_interval": args.sample_interval,
        "batch_size": args.batch_size,
        "sequence_length": args.n_step,
    }
    agent_kwargs = {"env_id": args.env, "ct": "RL", "replay": replay}
    run = run_config_from_args(
        parser, args, cts=[ct], agent_path="flare2.core.envs:GymAgent", agent_kwargs=agent_kwargs
    )
    # 4. The manager runs to the budget.
    return Manager(run).run()


if __name__ == "__main__":
    sys.exit(main())
