"""A manager script whose Algorithm raises in learn() after a few calls (a bug in user code)."""

from __future__ import annotations

import argparse
import sys

from flare2.core.envs import make_gym_env
from flare2.runtime.config import CTConfig
from flare2.runtime.manager import Manager
from flare2.runtime.options import add_run_options, batching_from_args, run_config_from_args
from flare2.zoo.a2c import A2C
from flare2.zoo.models import MLPActorCritic

FAIL_AFTER_LEARN_CALLS = 20


class BrokenA2C(A2C):
    def learn(self, experience):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls > FAIL_AFTER_LEARN_CALLS:
            raise ValueError("the user's learn() broke on purpose")
        return super().learn(experience)


def build() -> BrokenA2C:
    env = make_gym_env("CartPole-v1")
    return BrokenA2C(MLPActorCritic(env.observation_space, env.action_space))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    add_run_options(parser, num_agents=4, max_steps=1_000_000)
    args = parser.parse_args()
    ct = CTConfig(name="RL", build=build, batching=batching_from_args(args))
    config = run_config_from_args(parser, args, cts=[ct], agent_path="flare2.core.envs:GymAgent")
    sys.exit(Manager(config).run())
