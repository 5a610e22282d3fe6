"""A manager script with bugs on demand: an Algorithm slow to build, whose learn() raises or sleeps, or an agent of the
caller's choice."""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

from flare2.core.env_making import make_gym_env
from flare2.runtime.config import CTConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.options import add_run_options, batching_from_args, run_config_from_args
from flare2.zoo.a2c import A2C
from flare2.zoo.models import ActorCritic


class BrokenA2C(A2C):
    def __init__(self, model, fail_after: int, sleep_once_s: float) -> None:
        super().__init__(model)
        self.fail_after = fail_after
        self.sleep_once_s = sleep_once_s
        self.calls = 0

    def learn(self, experience):
        self.calls += 1
        if self.fail_after and self.calls > self.fail_after:
            super().learn(experience)  # it breaks after an update of the weights and the optimizer
            raise ValueError("the user's learn() broke on purpose")
        if self.sleep_once_s and self.calls == 3:
            print(f"learn() sleeps {self.sleep_once_s:.0f}s", flush=True)
            time.sleep(self.sleep_once_s)
            print("learn() woke up", flush=True)
        return super().learn(experience)


def build(fail_after: int, sleep_once_s: float, build_after: str | None) -> BrokenA2C:
    # A model that takes a while to build (or to load): as long as the test wants, and at most two minutes.
    deadline = time.monotonic() + 120
    while build_after and not Path(build_after).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    env = make_gym_env("CartPole-v1")
    return BrokenA2C(ActorCritic(env.observation_space, env.action_space), fail_after, sleep_once_s)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--fail-learn-after", type=int, default=0, help="learn() raises after this many calls (0: never)"
    )
    parser.add_argument("--sleep-learn-once", type=float, default=0.0, help="the third learn() sleeps this long")
    parser.add_argument("--build-after", help="building the Algorithm waits until this file exists")
    parser.add_argument("--agent", default="flare2.core.envs:GymAgent")
    add_run_options(parser, num_agents=4, max_steps=1_000_000)
    args = parser.parse_args()
    ct = CTConfig(
        name="RL",
        build=partial(build, args.fail_learn_after, args.sleep_learn_once, args.build_after),
        batching=batching_from_args(args),
    )
    config = run_config_from_args(parser, args, cts=[ct], agent_path=args.agent)
    sys.exit(Manager(config).run())
