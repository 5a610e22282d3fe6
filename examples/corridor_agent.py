"""The Agent of examples/custom_agent.py and its environment.

Agent processes import this module, so it imports no torch: only numpy and
flare2's agent side. Such processes start fast and stay small.
"""

from __future__ import annotations

import numpy as np

from flare2 import Agent, OnlineHelper

CELLS = 10


# An environment with the Gymnasium API (reset/step); GymAgent covers registered Gymnasium envs.
class Corridor:
    def reset(self, seed: int | None = None):
        self.position, self.steps = 0, 0
        return self.position, {}

    def step(self, move: int):
        self.position = max(0, self.position + (1 if move == 1 else -1))
        self.steps += 1
        terminated = self.position == CELLS - 1
        reward = 1.0 if terminated else -0.01
        return self.position, reward, terminated, self.steps >= 50 and not terminated, {}


# The Agent: runs in its own process (no torch there); asks the CT and stores each step.
class CorridorAgent(Agent):
    def make_env(self):
        return Corridor()

    def helpers(self):
        return {"walker": OnlineHelper(sample_interval=4)}

    def run_episode(self):
        position, _ = self.env.reset()
        while True:
            obs = np.eye(CELLS, dtype=np.float32)[position]
            actions, _ = self.predict("walker", {"position": obs})
            position, reward, terminated, truncated, _ = self.env.step(int(actions["move"]))
            self.store(
                "walker",
                inputs={"position": obs},
                actions=actions,
                rewards={"reward": np.float32(reward)},
                next_inputs={"position": np.eye(CELLS, dtype=np.float32)[position]},
                terminated=terminated,
                truncated=truncated,
            )
            if terminated or truncated:
                return
