"""``flare2 train`` runs every zoo algorithm on its preset env to a small budget, as a user types it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runs import read_csv


@pytest.mark.parametrize("algo, env, options", [
    # Real processes for one; the others in serial mode, which runs the same code in one process, faster.
    ("ppo", "CartPole-v1", ["--envs-per-agent", "2", "--max-steps", "600", "--epochs", "1"]),
    ("a2c", "CartPole-v1", ["--serial", "--max-steps", "300"]),
    ("dqn", "CartPole-v1", ["--serial", "--max-steps", "600", "--warmup", "200"]),
    ("sarsa", "CliffWalking-v1", ["--serial", "--max-steps", "300"]),
    ("td3", "Pendulum-v1", ["--serial", "--max-steps", "400", "--warmup", "200", "--batch-size", "32"]),
    ("recurrent-ppo", "flare2.zoo.envs:flare2/CartPoleNoVelocity-v1", ["--serial", "--max-steps", "600", "--epochs", "1"]),
])
def test_each_algorithm_trains_its_preset_env_and_writes_its_settings_and_checkpoint(tmp_path, algo, env, options):
    result = subprocess.run(
        [sys.executable, "-m", "flare2.cli", "train", "--env", env, "--algo", algo, *options, "--device", "cpu",
         "--log-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    budget = int(options[options.index("--max-steps") + 1])
    assert read_csv(tmp_path / "progress.csv")[-1]["env_steps"] >= budget
    assert (tmp_path / "checkpoints" / "RL.pt").is_file()
    written = json.loads((tmp_path / "train.json").read_text())
    assert (written["algo"], written["env"], written["run"]["max_steps"]) == (algo, env, budget)
