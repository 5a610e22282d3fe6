"""With the velocities hidden, recurrent PPO (GRU) reaches a CartPole mean return that memoryless PPO misses (slow)."""

from __future__ import annotations

import pytest
from runs import finite, first_row_reaching, train

pytestmark = [pytest.mark.learning, pytest.mark.slow]

THRESHOLD = 200.0
BUDGET_STEPS = 150_000


def run_memory_example(model: str, log_dir, *extra: str) -> list[dict[str, float]]:
    return train(
        "cartpole_memory.py", log_dir, "--model", model, "--max-steps", str(BUDGET_STEPS), "--seed", "0", *extra
    )


def test_recurrent_ppo_reaches_200_on_cartpole_without_velocities_within_150k_steps(tmp_path, no_leftover_processes):
    rows = run_memory_example("gru", tmp_path, "--stop-return", str(THRESHOLD))
    first_row_reaching(rows, "return_mean", THRESHOLD, BUDGET_STEPS)


def test_memoryless_ppo_does_not_reach_200_on_cartpole_without_velocities_within_150k_steps(
    tmp_path, no_leftover_processes
):
    rows = run_memory_example("mlp", tmp_path)
    best = max(finite(row["return_mean"] for row in rows))
    assert best < THRESHOLD, f"the MLP reached {best}: the env no longer needs memory, or the threshold is too low"
