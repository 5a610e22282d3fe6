"""A real run: manager, compute process and agent processes on loopback, on CartPole."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cartpole_a2c.py"
RUN_TIMEOUT_S = 180


def run_example(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def read_progress(log_dir: Path) -> list[dict[str, float]]:
    with open(log_dir / "progress.csv", newline="") as file:
        return [{key: float(value) for key, value in row.items()} for row in csv.DictReader(file)]


def test_four_agents_share_batched_predictions_and_the_run_ends_cleanly(tmp_path):
    log_dir = tmp_path / "run"
    result = run_example(
        "--num-agents", "4", "--max-steps", "600", "--log-dir", str(log_dir), "--progress-interval", "0.5", "--device", "cpu"
    )
    assert result.returncode == 0, result.stderr[-4000:]

    rows = read_progress(log_dir)
    final = rows[-1]
    # Agents' stats reached the manager: it counted the budget's steps and finished episodes.
    assert final["env_steps"] >= 600
    assert final["episodes"] >= 1 and not math.isnan(final["return_mean"])
    assert final["learn_steps"] >= 1
    # Predictions of several agents were served together.
    batch_means = [row["batch_size_mean"] for row in rows if not math.isnan(row["batch_size_mean"])]
    assert batch_means and max(batch_means) > 1
    assert "budget reached" in (log_dir / "manager.log").read_text()
    assert (log_dir / "checkpoints" / "RL.pt").is_file()


def test_an_unknown_env_id_ends_the_run_with_a_message_naming_it(tmp_path):
    result = run_example("--env", "NoSuchEnv-v9", "--num-agents", "2", "--max-steps", "100", "--log-dir", str(tmp_path))
    assert result.returncode == 2, result.stderr[-4000:]
    assert "'NoSuchEnv-v9'" in result.stderr
    assert "check the id" in result.stderr
