"""Train A2C on CartPole-v1 with several agent processes sharing one batched ComputationTask.

    python examples/cartpole_a2c.py --num-agents 8 --max-steps 500000 --log-dir runs/a2c

Each agent process plays its own CartPole; its action requests are batched
with the other agents' into one forward pass in the compute process, and
every 5 steps its experiences go to A2C's learn(). Progress lines go to the
terminal and rows to LOG_DIR/progress.csv.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from flare2.core.envs import make_gym_env
from flare2.runtime.config import AgentConfig, BatchingConfig, CTConfig, RunConfig
from flare2.runtime.manager import Manager
from flare2.zoo.a2c import A2C, A2CConfig
from flare2.zoo.models import MLPActorCritic


# 1. The Algorithm, built inside the compute process. A module-level function
#    so the compute process (started with the spawn method) can import it.
def build_a2c(env_id: str, lr: float) -> A2C:
    env = make_gym_env(env_id)
    model = MLPActorCritic(env.observation_space, env.action_space, hidden=(64, 64))
    return A2C(model, A2CConfig(lr=lr))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1", help="Gymnasium env id (Box or Discrete spaces)")
    parser.add_argument("--num-agents", type=int, default=8, help="agent processes, one env each")
    parser.add_argument("--max-steps", type=int, default=500_000, help="stop after this many env steps in total")
    parser.add_argument("--stop-return", type=float, default=None, help="also stop once the mean return of the last 100 episodes reaches this")
    parser.add_argument("--device", default="auto", help="where the model runs: cpu, cuda, cuda:N or auto (cuda when there is one)")
    parser.add_argument("--log-dir", default="runs/cartpole_a2c", help="where progress.csv, manager.log and checkpoints go")
    parser.add_argument("--max-batch", type=int, default=64, help="a prediction batch is flushed once it holds this many requests")
    parser.add_argument("--max-wait-ms", type=float, default=2.0, help="... or once its oldest request has waited this long")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model and each agent's env")
    parser.add_argument("--lr", type=float, default=7e-4, help="A2C learning rate (RMSprop)")
    parser.add_argument("--sample-interval", type=int, default=5, help="env steps per learn request (n of the n-step returns)")
    parser.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress lines")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # 2. One ComputationTask named "RL", batched by the rule of max batch / all agents waiting / max wait.
    ct = CTConfig(
        name="RL",
        build=partial(build_a2c, args.env, args.lr),
        batching=BatchingConfig(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms),
    )
    # 3. The stock Gymnasium agent: asks CT "RL" for actions, sends experiences every sample_interval steps.
    agents = AgentConfig(
        path="flare2.core.envs:GymAgent",
        kwargs={"env_id": args.env, "ct": "RL", "sample_interval": args.sample_interval},
        num_agents=args.num_agents,
    )
    # 4. The manager spawns the compute process and the agents and runs to the budget.
    config = RunConfig(
        cts=(ct,),
        agents=agents,
        log_dir=args.log_dir,
        max_steps=args.max_steps,
        stop_return=args.stop_return,
        device=args.device,
        seed=args.seed,
        progress_interval_s=args.progress_interval,
    )
    return Manager(config).run()


if __name__ == "__main__":
    sys.exit(main())
