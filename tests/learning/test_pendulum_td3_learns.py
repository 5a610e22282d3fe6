"""TD3 with 8 agents reaches a Pendulum-v1 mean return of -200 before 50k env steps (marked slow)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runs import REPO, finite, read_csv

THRESHOLD = -200.0
BUDGET_STEPS = 50_000
TD3 = REPO / "examples" / "pendulum_td3.py"


@pytest.mark.slow
def test_td3_with_eight_agents_solves_pendulum_within_50k_steps(tmp_path, no_leftover_processes):
    result = subprocess.run(
        [sys.executable, str(TD3), "--num-agents", "8", "--max-steps", str(BUDGET_STEPS), "--stop-return", str(THRESHOLD),
         "--log-dir", str(tmp_path), "--seed", "1", "--device", "cpu"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = read_csv(tmp_path / "progress.csv")
    reached = [row for row in rows if finite([row["return_mean"]]) and row["return_mean"] >= THRESHOLD]
    assert reached and reached[0]["env_steps"] < BUDGET_STEPS, f"best {max(finite(r['return_mean'] for r in rows))}"
