"""An algorithm of the user's own, installed as a package with a ``flare2.algorithms`` entry point, is one that
``flare2 train --algo NAME`` trains and ``flare2 eval`` plays, as a zoo algorithm is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from runs import read_csv

RECORD = '''
"""The record of REINFORCE: what flare2 train reads, without torch."""
from dataclasses import dataclass

from flare2.zoo import AlgorithmRecord
from flare2.zoo.record import BOX, DISCRETE, ActorCriticSettings


@dataclass(frozen=True)
class ReinforceConfig:
    lr: float = 3e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""


RECORD = AlgorithmRecord(
    name="reinforce", config_class=ReinforceConfig, settings_class=ActorCriticSettings,
    build="reinforce_plugin.algorithm:build", observations=(BOX, DISCRETE), actions=(DISCRETE,),
    run={"num_agents": 1, "envs_per_agent": 4, "learner": "inline"}, agent={"sample_interval": 16},
    search_space={"lr": ("log", (1e-4, 1e-2))},
)
'''

ALGORITHM = '''
"""REINFORCE over sequences, bootstrapped at their end: the Algorithm, with torch."""
import torch

from flare2 import Algorithm
from flare2.zoo.models import ActorCritic
from flare2.zoo.returns import n_step_returns


class Reinforce(Algorithm):
    def __init__(self, model, config):
        super().__init__(model)
        self.config = config
        self.optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)

    def predict(self, inputs, states):
        return {"action": self.model.sample(self.model.policy(inputs))}, {}

    def predict_greedy(self, inputs, states):
        return {"action": self.model.best_action(self.model.policy(inputs))}, {}

    def learn(self, experience):
        with torch.no_grad():
            returns = n_step_returns(experience.rewards["reward"], self.model.value(experience.next_inputs),
                                     experience.terminated, experience.truncated, self.config.gamma)
        policy = self.model.policy(experience.inputs)
        log_prob, _ = self.model.log_prob_and_entropy(policy, experience.actions["action"])
        loss = -(log_prob * returns).mean()
        self.optimize(loss)
        return {"loss": loss.item()}


def build(env, config, settings):
    return Reinforce(ActorCritic(env.observation_space, env.action_space, hidden=settings.hidden), config)
'''


def install_plugin(root) -> None:
    """The package as pip would leave it in site-packages: the modules, and a dist-info folder with its entry point."""
    package = root / "reinforce_plugin"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "record.py").write_text(textwrap.dedent(RECORD))
    (package / "algorithm.py").write_text(textwrap.dedent(ALGORITHM))
    metadata = root / "reinforce_plugin-0.1.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: reinforce-plugin\nVersion: 0.1\n")
    (metadata / "entry_points.txt").write_text("[flare2.algorithms]\nreinforce = reinforce_plugin.record:RECORD\n")


def test_an_installed_algorithm_of_ones_own_trains_with_flare2_train_and_plays_with_flare2_eval(tmp_path):
    install_plugin(tmp_path / "site")
    search_path = [str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(search_path)}
    run_dir = tmp_path / "run"
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "flare2.cli",
            "train",
            "--algo",
            "reinforce",
            "--env",
            "CartPole-v1",
            "--max-steps",
            "2000",
            "--lr",
            "0.001",
            "--device",
            "cpu",
            "--log-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
        check=False,
    )
    assert train.returncode == 0, train.stderr[-4000:]
    assert read_csv(run_dir / "progress.csv")[-1]["env_steps"] >= 2000
    assert (run_dir / "checkpoints" / "RL.pt").is_file()
    written = json.loads((run_dir / "train.json").read_text())
    assert (written["algo"], written["algorithm"], written["run"]["envs_per_agent"]) == (
        "reinforce",
        {"lr": 0.001, "gamma": 0.99},
        4,
    )
    config = json.loads((run_dir / "config.json").read_text())
    assert config["cts"]["RL"]["algorithm"] == "reinforce_plugin.algorithm.Reinforce"

    play = subprocess.run(
        [sys.executable, "-m", "flare2.cli", "eval", str(run_dir), "--episodes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        check=False,
    )
    assert play.returncode == 0, play.stderr[-4000:]
    assert play.stdout.startswith("reinforce on CartPole-v1, 2 greedy episodes: return ")

    # Without the package, the run's algorithm is named with how one is added.
    elsewhere = subprocess.run(
        [sys.executable, "-m", "flare2.cli", "eval", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert elsewhere.returncode == 2
    assert "is a run of algo 'reinforce': invalid choice: 'reinforce'" in elsewhere.stderr
    assert "'flare2.algorithms' entry point" in elsewhere.stderr
