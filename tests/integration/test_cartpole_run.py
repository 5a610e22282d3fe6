"""A real run: manager, compute process and agent processes on loopback, on CartPole."""

from __future__ import annotations

import subprocess
import sys

from runs import CARTPOLE, REPO, finite, read_csv


def run_example(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CARTPOLE), *args], cwd=REPO, capture_output=True, text=True, timeout=180)


def test_four_agents_share_batched_predictions_and_the_run_ends_cleanly(tmp_path):
    log_dir = tmp_path / "run"
    result = run_example(
        "--num-agents",
        "4",
        "--max-steps",
        "600",
        "--log-dir",
        str(log_dir),
        "--progress-interval",
        "0.5",
        "--device",
        "cpu",
    )
    assert result.returncode == 0, result.stderr[-4000:]

    rows = read_csv(log_dir / "progress.csv")
    final = rows[-1]
    # Agents' stats reached the manager: it counted the budget's steps and finished episodes.
    assert final["env_steps"] >= 600
    assert final["episodes"] >= 1 and finite([final["return_mean"]])
    assert final["learn_steps"] >= 1
    # Predictions of several agents were served together.
    assert max(finite(row["batch_size_mean"] for row in rows)) > 1
    assert "budget reached" in (log_dir / "manager.log").read_text()
    assert (log_dir / "checkpoints" / "RL.pt").is_file()


def test_an_unknown_env_id_ends_the_run_with_a_message_naming_it(tmp_path):
    result = run_example("--env", "NoSuchEnv-v9", "--num-agents", "2", "--max-steps", "100", "--log-dir", str(tmp_path))
    assert result.returncode == 2, result.stderr[-4000:]
    assert "'NoSuchEnv-v9'" in result.stderr
    assert "check the id" in result.stderr
