"""A manager script whose model checks every frame stack it is given: each pixel of a frame is the step count of its
env's episode (1 at the reset), so a stack is right when its frames count up by one to the observation, with zeros
before the episode's first step. A stack put together wrongly anywhere on its way (the agent's views, the port, the
shared memory, the CDP's rings) raises in predict(), and the run fails saying so."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from flare2.core.envs import GymAgent
from flare2.runtime.config import CTConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.options import add_run_options, batching_from_args, run_config_from_args
from flare2.zoo.a2c import A2C
from flare2.zoo.models import ActorCritic

FRAMES = 4


class CountingFrames(gym.Env):
    """8x8 frames whose every pixel is the episode's step count; episodes of 3 to 30 steps."""

    observation_space = gym.spaces.Box(0, 255, (8, 8), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.count, self.length = 1, int(self.np_random.integers(3, 31))
        return self._frame(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.count += 1
        return self._frame(), 0.0, self.count >= self.length, False, {}

    def _frame(self) -> np.ndarray:
        return np.full((8, 8), self.count, np.uint8)


class CountingFramesAgent(GymAgent):
    def make_env(self) -> gym.Env:
        return CountingFrames()


class CheckingA2C(A2C):
    def predict(self, inputs: dict[str, torch.Tensor], states: dict[str, torch.Tensor]) -> Any:
        (stacks_name,) = self.model.view_specs()
        stacks, obs = inputs[stacks_name][:, :, 0, 0].long(), inputs["obs"][:, 0, 0].long()
        right = stacks[:, -1] == obs
        for k in range(FRAMES - 1):
            before, after = stacks[:, k], stacks[:, k + 1]
            right &= (before == after - 1) | ((before == 0) & (after <= 1))
        if not bool(right.all()):
            raise ValueError(f"frame stacks that are not their env's frames: {stacks[~right][:4].tolist()}")
        return super().predict(inputs, states)


def build() -> CheckingA2C:
    env = CountingFrames()
    return CheckingA2C(ActorCritic(env.observation_space, env.action_space, frames=FRAMES))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--double-buffer", action="store_true", help="each agent's envs play in two halves")
    add_run_options(parser, num_agents=2, max_steps=20_000)
    args = parser.parse_args()
    ct = CTConfig(name="RL", build=partial(build), batching=batching_from_args(args))
    config = run_config_from_args(
        parser,
        args,
        cts=[ct],
        agent_path=f"{__file__}:CountingFramesAgent",
        agent_kwargs={"double_buffer": args.double_buffer, "engine": "python"},
    )
    sys.exit(Manager(config).run())
