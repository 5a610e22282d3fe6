"""The short-term-memory example runs end to end with the GRU model (small budget)."""

from __future__ import annotations

import subprocess
import sys

from runs import REPO, read_csv

MEMORY = REPO / "examples" / "cartpole_memory.py"


def test_the_memory_example_runs_recurrent_ppo_and_learns_at_least_once(tmp_path):
    result = subprocess.run(
        [sys.executable, str(MEMORY), "--model", "gru", "--num-agents", "2", "--max-steps", "600", "--epochs", "2",
         "--device", "cpu", "--progress-interval", "0.5", "--log-dir", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "imports torch" not in result.stderr
    final = read_csv(tmp_path / "progress.csv")[-1]
    assert final["env_steps"] >= 600 and final["learn_steps"] >= 1
    assert "policy_loss" in (tmp_path / "learn.csv").read_text()
    assert (tmp_path / "checkpoints" / "RL.pt").is_file()
