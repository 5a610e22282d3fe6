"""Pixels through ``flare2 train`` and ``flare2 eval`` as a user types them: an Atari game and a MinAtar one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from extras import skip_without
from runs import read_csv

skip_without("atari", "ale_py", "cv2")


def flare2(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flare2.cli", *args], capture_output=True, text=True, timeout=timeout_s
    )


@pytest.mark.parametrize("engine", ["python", "ale"])
def test_an_atari_game_trains_with_its_preset_within_the_message_limit_and_eval_plays_whole_games(tmp_path, engine):
    # The preset's request shape, fewer envs and steps: 2 envs x 64 steps of 84x84 frames stacked by 4.
    result = flare2(
        "train", "--env", "ALE/Breakout-v5", "--algo", "ppo", "--envs-per-agent", "2", "--sample-interval", "64",
        "--epochs", "1", "--max-steps", "512", "--device", "cpu", "--env-engine", engine, "--log-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["env_steps"] >= 512 and rows[-1]["learn_steps"] >= 3
    settings = json.loads((tmp_path / "train.json").read_text())
    assert settings["agent"]["frames"] == 4 and settings["run"]["clip_rewards"] == 1.0
    assert settings["run"]["env_engine"] == engine
    # Returns are whole games' raw scores (Breakout's bricks are worth 1 to 7 points, never clipped away).
    episodes = read_csv(tmp_path / "episodes.csv")
    assert episodes and all(row["length"] > 50 and row["return"] == int(row["return"]) for row in episodes)
    played = flare2("eval", str(tmp_path), "--episodes", "1", "--video", str(tmp_path / "game.gif"))
    assert played.returncode == 0, played.stderr[-4000:]
    assert "1 greedy episode" in played.stdout and (tmp_path / "game.gif").stat().st_size > 0


def test_a_minatar_game_trains_dqn_on_its_cnn(tmp_path):
    skip_without("minatar", "minatar")
    result = flare2(
        "train", "--env", "MinAtar/Breakout-v1", "--algo", "dqn", "--serial", "--max-steps", "400",
        "--warmup", "100", "--device", "cpu", "--log-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    rows = read_csv(tmp_path / "progress.csv")
    assert rows[-1]["learn_steps"] > 0 and rows[-1]["episodes"] > 0
