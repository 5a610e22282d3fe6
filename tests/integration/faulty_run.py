"""A manager script with bugs on demand: an Algorithm that raises in learn(), or an agent of the caller's choice."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from flare2.core.envs import make_gym_env
from flare2.runtime.config import CTConfig
from flare2.runtime.manager import Manager
from flare2.runtime.options import add_run_options, batching_from_args, run_config_from_args
from flare2.zoo.a2c import A2C
from flare2.zoo.models import MLPActorCritic



class BrokenA2C(A2C):
    def __init__(self, model, fail_after: int) -> None:
        super().__init__(model)
        self.fail_after = fail_after
        self.calls = 0

    def learn(self, experience):
        self.calls += 1
        if self.fail_after and self.calls > self.fail_after:
            raise ValueError("the user's learn() broke on purpose")
        return super().learn(experience)


def build(fail_after: int) -> BrokenA2C:
    env = make_gym_env("CartPole-v1")
    return BrokenA2C(MLPActorCritic(env.observation_space, env.action_space), fail_after)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-learn-after", type=int, default=0, help="learn() raises after this many calls (0: never)")
    parser.add_argument("--agent", default="flare2.core.envs:GymAgent")
    add_run_options(parser, num_agents=4, max_steps=1_000_000)
    args = parser.parse_args()
    ct = CTConfig(name="RL", build=partial(build, args.fail_learn_after), batching=batching_from_args(args))
    config = run_config_from_args(parser, args, cts=[ct], agent_path=args.agent)
    sys.exit(Manager(config).run())
