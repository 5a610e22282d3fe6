"""Whole runs with ``--device cuda``: the learner process, the learner thread and serial mode on the GPU, Atari frames
through the CNN presets, and a checkpoint trained there played back on the CPU. Skipped where torch sees no CUDA
device."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from extras import needs_env
from runs import read_csv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")

needs_atari = needs_env("ALE/Breakout-v5")
FEW_FRAMES = ["--envs-per-agent", "2", "--sample-interval", "64"]
"""The Atari presets' request shape with fewer envs and steps: frames stay uint8 up to the GPU's pinned copies."""


def flare2(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flare2.cli", *argv], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "algo, env, options",
    [
        ("ppo", "CartPole-v1", ["--learner", "process", "--envs-per-agent", "4", "--epochs", "2"]),
        ("ppo", "CartPole-v1", ["--no-serial", "--learners", "1", "--epochs", "2"]),
        ("a2c", "CartPole-v1", ["--no-serial", "--learner", "thread"]),
        ("a2c", "CartPole-v1", ["--no-serial", "--learner", "inline", "--normalize-observations"]),
        ("dqn", "CartPole-v1", ["--serial", "--warmup", "200"]),
        ("td3", "Pendulum-v1", ["--serial", "--warmup", "200", "--batch-size", "32"]),
        ("sac", "Pendulum-v1", ["--learner", "process", "--warmup", "200", "--batch-size", "32"]),
        ("recurrent-ppo", "flare2.zoo.envs:flare2/CartPoleNoVelocity-v1", ["--serial", "--epochs", "1"]),
        pytest.param("ppo", "ALE/Breakout-v5", [*FEW_FRAMES, "--epochs", "1"], marks=needs_atari),
        pytest.param("appo", "ALE/Breakout-v5", FEW_FRAMES, marks=needs_atari),
        pytest.param(
            "dqn", "ALE/Breakout-v5", ["--serial", "--warmup", "200", "--batch-size", "32"], marks=needs_atari
        ),
    ],
)
def test_a_run_on_the_gpu_trains_to_its_budget_and_plays_back_on_the_cpu(tmp_path, algo, env, options):
    trained = flare2(
        "train",
        "--env",
        env,
        "--algo",
        algo,
        "--device",
        "cuda",
        "--max-steps",
        "1500",
        "--log-dir",
        str(tmp_path),
        *options,
    )

    assert trained.returncode == 0, trained.stderr[-4000:]
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["env_steps"] >= 1500
    assert any(row["learn_steps"] > 0 for row in rows)
    played = flare2("eval", str(tmp_path), "--episodes", "2", "--device", "cpu")
    assert played.returncode == 0, played.stderr[-4000:]
    assert "2 greedy episodes: return " in played.stdout
