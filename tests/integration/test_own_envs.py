"""Envs of one's own, as a new user writes them next to where they type ``flare2``: a PettingZoo module and a
Gymnasium ``module:Id`` in the working directory train through the console script."""

from __future__ import annotations

import os
import subprocess
import sys

from extras import needs_modules

_TAG_GAME = """
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class Tag(ParallelEnv):
    metadata = {"name": "tag_v0"}
    possible_agents = ["runner_0", "runner_1"]

    def observation_space(self, agent):
        return spaces.Box(0.0, 9.0, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.agents, self.target, self.t = list(self.possible_agents), 5, 0
        self.cells = dict.fromkeys(self.agents, 0)
        return self._observations(), {agent: {} for agent in self.agents}

    def _observations(self):
        return {agent: np.array([self.cells[agent], self.target], np.float32) for agent in self.agents}

    def step(self, actions):
        self.t += 1
        for agent, action in actions.items():
            self.cells[agent] = min(9, max(0, self.cells[agent] + int(action) - 1))
        ended = {agent: self.cells[agent] == self.target for agent in self.agents}
        rewards = {agent: float(ended[agent]) for agent in self.agents}
        observations, truncated = self._observations(), dict.fromkeys(self.agents, self.t >= 20)
        infos = {agent: {} for agent in self.agents}
        self.agents = [agent for agent in self.agents if not (ended[agent] or truncated[agent])]
        return observations, rewards, ended, truncated, infos


def parallel_env():
    return Tag()
"""


@needs_modules("pettingzoo", "pettingzoo")
def test_env_modules_of_the_working_directory_train_through_the_flare2_command(tmp_path):
    # The console script, as a user types it: unlike `python -m`, it does not put the working directory on sys.path.
    command = os.path.join(os.path.dirname(sys.executable), "flare2")
    (tmp_path / "mygames").mkdir()
    (tmp_path / "mygames" / "__init__.py").write_text("")
    (tmp_path / "mygames" / "tag_v0.py").write_text(_TAG_GAME)
    (tmp_path / "mygym.py").write_text(
        'import gymnasium\ngymnasium.register("MyCart-v0", "gymnasium.envs.classic_control:CartPoleEnv")\n'
    )
    runs = {
        # Real processes: the agent process and the spawned compute process import the module too.
        "tag": ["--env", "mygames.tag_v0", "--envs-per-agent", "2", "--max-steps", "300"],
        "cart": ["--env", "mygym:MyCart-v0", "--serial", "--max-steps", "300"],
    }
    for name, options in runs.items():
        argv = [command, "train", *options, "--algo", "ppo", "--epochs", "1", "--device", "cpu", "--log-dir", name]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert (tmp_path / name / "checkpoints" / "RL.pt").exists()
