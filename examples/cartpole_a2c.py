"""Train A2C on CartPole-v1: agent processes of several envs each, sharing one batched ComputationTask.

    python examples/cartpole_a2c.py --max-steps 500000 --log-dir runs/a2c

By default one agent process plays 8 CartPoles (as in the SB3-zoo settings)
beside the compute process: two busy processes for a 2-core machine. Every
step the agent asks for the actions of 4 of its envs in one request and steps
the other 4 meanwhile (double buffering); every 5 steps it sends its [8, 5]
steps to A2C's learn() and plays on while it runs.
More processes (--num-agents) are batched together; --serial runs it all in
this process, for a debugger. Progress lines go to the terminal and rows to
LOG_DIR/progress.csv.
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
from flare2.zoo.records.a2c import A2CConfig


# 1. The Algorithm, built inside the compute process. A module-level function
#    so the compute process (started with the spawn method) can import it; the
#    zoo is imported here, so this process (the manager) never loads torch and
#    starts fast.
def build_a2c(env_id: str, config: A2CConfig):
    from flare2.core.env_making import make_gym_env
    from flare2.zoo.a2c import A2C
    from flare2.zoo.models import ActorCritic

    env = make_gym_env(env_id)
    model = ActorCritic(env.observation_space, env.action_space, hidden=(64, 64))
    return A2C(model, config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium env id (Box or Discrete spaces)")
    parser.add_argument(
        "--sample-interval", type=int, default=5, help="env steps per learn request (n of the n-step returns)"
    )
    parser.add_argument(
        "--no-double-buffer",
        dest="double_buffer",
        action="store_false",
        help="each agent steps all its envs, then asks for all their actions (by default two halves "
        "of its envs alternate: one is stepped while the other's actions are predicted)",
    )
    add_config_options(parser, A2CConfig)
    # A2C learns every 5 steps from [8, 5] steps: handing each batch to a learner process and its weights back costs
    # more than it frees on 2 cores (1 agent of 8 envs: 6.2k-7.1k env steps/s inline, 5.6k in a process), so learn()
    # runs in the compute loop unless --learner says otherwise.
    add_run_options(parser, log_dir="runs/cartpole_a2c", learner="inline")
    add_transform_options(parser)
    args = parser.parse_args(argv)
    # 2. One ComputationTask named "RL", batched by the rule of max batch / all agents waiting / max wait.
    config = config_from_args(parser, args, A2CConfig)
    ct = CTConfig(name="RL", build=partial(build_a2c, args.env, config), batching=batching_from_args(args))
    # 3. The stock Gymnasium agent: asks CT "RL" for the actions of its envs, sends experiences every sample_interval steps.
    agent_kwargs = {
        "env_id": args.env,
        "ct": "RL",
        "sample_interval": args.sample_interval,
        "double_buffer": args.double_buffer,
        "transforms": transforms_from_args(args),
    }
    # 4. The manager spawns the compute process and the agents and runs to the budget.
    config = run_config_from_args(
        parser, args, cts=[ct], agent_path="flare2.core.envs:GymAgent", agent_kwargs=agent_kwargs
    )
    return Manager(config).run()


if __name__ == "__main__":
    sys.exit(main())
