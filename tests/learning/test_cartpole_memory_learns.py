"""With the velocities hidden, recurrent PPO (GRU) reaches a CartPole mean return that memoryless PPO misses (slow)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runs import REPO, finite, read_csv

THRESHOLD = 200.0
BUDGET_STEPS = 150_000
MEMORY = REPO / "examples" / "cartpole_memory.py"


def run_memory_example(model: str, log_dir, *extra: str) -> list[dict[str, float]]:
    result = subprocess.run(
        [sys.executable, str(MEMORY), "--model", model, "--num-agents", "8", "--max-steps", str(BUDGET_STEPS),
         "--log-dir", str(log_dir), "--seed", "0", "--device", "cpu", *extra],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return read_csv(log_dir / "progress.csv")


@pytest.mark.slow
def test_recurrent_ppo_reaches_200_on_cartpole_without_velocities_within_150k_steps(tmp_path, no_leftover_processes):
    rows = run_memory_example("gru", tmp_path, "--stop-return", str(THRESHOLD))
    reached = [row for row in rows if finite([row["return_mean"]]) and row["return_mean"] >= THRESHOLD]
    assert reached and reached[0]["env_steps"] < BUDGET_STEPS, f"best {max(finite(r['return_mean'] for r in rows))}"


@pytest.mark.slow
def test_memoryless_ppo_does_not_reach_200_on_cartpole_without_velocities_within_150k_steps(
    tmp_path, no_leftover_processes
):
    rows = run_memory_example("mlp", tmp_path)
    best = max(finite(row["return_mean"] for row in rows))
    assert best < THRESHOLD, f"the MLP reached {best}: the env no longer needs memory, or the threshold is too low"
