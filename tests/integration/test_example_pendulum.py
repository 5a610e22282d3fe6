"""The Pendulum TD3 example runs to its end on a tiny budget and reports the TD3 costs."""

from __future__ import annotations

import subprocess
import sys

from runs import REPO, read_csv


def run_example(name: str, *args: str, log_dir) -> subprocess.CompletedProcess:
    """Run examples/<name> with ``args`` and a log dir, from that dir; fails the test with its log if it fails."""
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / name), *args, "--log-dir", str(log_dir)],
        cwd=log_dir, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_the_td3_example_learns_from_replay_buffers_and_logs_critic_and_actor_costs(tmp_path):
    run_example("pendulum_td3.py", "--num-agents", "2", "--max-steps", "800", "--warmup", "400", "--batch-size", "64",
                "--minibatch-size", "64", "--device", "cpu", "--progress-interval", "0.5", log_dir=tmp_path)
    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["env_steps"] >= 800 and final["learn_steps"] >= 1
    costs = (tmp_path / "learn.csv").read_text()
    assert "critic_loss" in costs and "actor_loss" in costs and "q_mean" in costs
