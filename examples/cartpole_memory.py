"""Short-term memory: recurrent PPO (GRU) or a frame stack vs memoryless PPO (MLP) on CartPole with the velocities hidden.

    python examples/cartpole_memory.py --model gru --num-agents 8 --max-steps 150000 --log-dir runs/mem_gru
    python examples/cartpole_memory.py --model stack --num-agents 8 --max-steps 150000 --log-dir runs/mem_stack
    python examples/cartpole_memory.py --model mlp --num-agents 8 --max-steps 150000 --log-dir runs/mem_mlp

The agents see only the cart position and the pole angle (flare2.zoo.envs).
The stock GymAgent carries the GRU state returned with each action into the
next step, starts every episode from zeros and stores the state before each
step; RecurrentPPO replays each agent's 32-step sequence from its stored
first state, restarting from zeros at episode ends. ``--model stack`` is the
MLP over the last ``--frames`` observations, a trajectory view the agent
assembles (zeros before an episode's first step). The plain MLP sees one
observation at a time and cannot tell which way the pole is moving.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from flare2.core.algorithm import Algorithm
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
from flare2.zoo.envs import CARTPOLE_NO_VELOCITY_ENTRY
from flare2.zoo.ppo import PPO
from flare2.zoo.records.ppo import PPOConfig
from flare2.zoo.records.recurrent_ppo import RecurrentPPOConfig
from flare2.zoo.recurrent_ppo import RecurrentPPO


# 1. The Algorithm, built inside the compute process (a module-level function, for the spawn start method).
def build(model: str, env_id: str, config: PPOConfig | RecurrentPPOConfig, hidden_size: int, frames: int) -> Algorithm:
    env = make_gym_env(env_id)
    if model == "gru":
        return RecurrentPPO.for_env(env, config, hidden_size=hidden_size)
    return PPO.for_env(env, config, frames=frames if model == "stack" else 1)


def main(argv: list[str] | None = None) -> int:
    # 2. The model chosen decides which algorithm's settings the command line offers, so it is read first.
    model_parser = argparse.ArgumentParser(add_help=False)
    model_parser.add_argument(
        "--model",
        choices=("gru", "stack", "mlp"),
        default="gru",
        help="gru: RecurrentPPO with a GRU actor-critic; stack: PPO's MLP over the last --frames "
        "observations; mlp: the memoryless PPO of cartpole_ppo.py (each has its own settings "
        "below: `--model mlp --help` lists the MLP's)",
    )
    config_class = RecurrentPPOConfig if model_parser.parse_known_args(argv)[0].model == "gru" else PPOConfig
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[model_parser])
    parser.add_argument("--env", default=CARTPOLE_NO_VELOCITY_ENTRY, help="Gymnasium env id (Discrete actions)")
    parser.add_argument("--sample-interval", type=int, default=32, help="env steps per agent in each learn request")
    parser.add_argument("--hidden-size", type=int, default=64, help="GRU state size (gru only)")
    parser.add_argument("--frames", type=int, default=4, help="observations the MLP sees at once (stack only)")
    add_config_options(parser, config_class, derived={"anneal_steps": "--max-steps"})
    add_run_options(parser, num_agents=8, envs_per_agent=1, max_steps=150_000, log_dir="runs/cartpole_memory")
    # One learn() call per round of all agents matters for PPO: wait for the stragglers.
    parser.set_defaults(learn_max_wait_ms=200.0)
    args = parser.parse_args(argv)
    config = config_from_args(parser, args, config_class, anneal_steps=args.max_steps)
    ct = CTConfig(
        name="RL",
        build=partial(build, args.model, args.env, config, args.hidden_size, args.frames),
        batching=batching_from_args(args),
    )
    # 3. The stock Gymnasium agent: states come from the CT's state specs (none for the MLP).
    agent_kwargs = {"env_id": args.env, "ct": "RL", "sample_interval": args.sample_interval}
    run = run_config_from_args(
        parser, args, cts=[ct], agent_path="flare2.core.envs:GymAgent", agent_kwargs=agent_kwargs
    )
    # 4. The manager runs to the budget.
    return Manager(run).run()


if __name__ == "__main__":
    sys.exit(main())
