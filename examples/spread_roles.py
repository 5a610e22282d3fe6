"""Your own policy map: in MPE's simple_spread, agent_0 learns on a CT of its own and the other two share one.

    python examples/spread_roles.py --num-agents 2 --max-steps 3000000 --log-dir runs/spread_roles

`flare2 train --policy-map` maps a PettingZoo env's agents to CTs by name
(shared, team, agent, or NAME=CT pairs). An agent of your own maps them with
a function: `policy_of(agent)`, RLlib's `policy_mapping_fn`. Here it gives
agent_0 the CT "scout" and the others the CT "RL". Each CT batches the rows
of its agents from every agent process (cts.csv: "RL" gets two rows a game,
"scout" one) and has its own PPO, learner and checkpoint
(checkpoints/scout.pt and checkpoints/RL.pt). The settings are those of
`flare2 train --env mpe2.simple_spread_v3 --algo ppo`. The command above (seed
0, 5 minutes on 2 cores) ends with an agent's return at -17.7 over its last
3,000 episodes, where uniformly random actions get -26.5 (docs/results.md).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from flare2.core.pettingzoo_agent import PettingZooAgent
from flare2.runtime.config import CTConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.options import (
    add_config_options,
    add_run_options,
    batching_from_args,
    config_from_args,
    run_config_from_args,
)
from flare2.zoo.records.ppo import PPOConfig

ENV = "mpe2.simple_spread_v3"
AGENT_PATH = f"{Path(__file__).resolve()}:RolesAgent"


# 1. The agent: the stock PettingZoo agent with a policy map of its own. Agent processes import this file, which
#    imports no torch at its top.
class RolesAgent(PettingZooAgent):
    def policy_of(self, agent: str) -> str:
        return "scout" if agent == "agent_0" else "RL"


# 2. Each CT's PPO, built inside the compute process for the spaces its agents share.
def build_ppo(agents: tuple[str, ...], config: PPOConfig):
    from flare2.core.env_making import env_spaces
    from flare2.zoo.ppo import PPO

    return PPO.for_env(env_spaces(ENV, agents=agents), config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample-interval", type=int, default=128, help="steps of each agent in each learn request")
    # MAPPO's settings for simple_spread, as flare2 train's preset: each learn batch in one minibatch.
    mappo = {"lr": 7e-4, "anneal_steps": None, "gamma": 0.99, "gae_lambda": 0.95, "epochs": 10, "entropy_coef": 0.01}
    add_config_options(parser, PPOConfig, minibatch_size=6144, **mappo)
    add_run_options(parser, max_steps=3_000_000, log_dir="runs/spread_roles")
    parser.set_defaults(envs_per_agent=16)
    args = parser.parse_args(argv)
    config = config_from_args(parser, args, PPOConfig)
    # 3. A CT per group of agents that policy_of makes: the map is written once, in the agent.
    groups = RolesAgent(ENV).policies()
    cts = [
        CTConfig(name=ct, build=partial(build_ppo, tuple(agents), config), batching=batching_from_args(args))
        for ct, agents in groups.items()
    ]
    agent_kwargs = {"env_id": ENV, "sample_interval": args.sample_interval}
    run = run_config_from_args(parser, args, cts=cts, agent_path=AGENT_PATH, agent_kwargs=agent_kwargs)
    return Manager(run).run()


if __name__ == "__main__":
    sys.exit(main())
