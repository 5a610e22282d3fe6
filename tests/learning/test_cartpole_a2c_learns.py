"""CartPole-v1 reaches a mean return of 475 with 8 agents before 500k env steps (minutes: marked slow)."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
THRESHOLD = 475.0
BUDGET_STEPS = 500_000


@pytest.mark.slow
def test_a2c_with_eight_agents_solves_cartpole_within_the_step_budget(tmp_path, no_leftover_processes):
    result = subprocess.run(
        [
            sys.executable, str(REPO / "examples" / "cartpole_a2c.py"),
            "--num-agents", "8", "--max-steps", str(BUDGET_STEPS), "--stop-return", str(THRESHOLD),
            "--log-dir", str(tmp_path), "--seed", "1",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    with open(tmp_path / "progress.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    reached = [row for row in rows if not math.isnan(float(row["return_mean"])) and float(row["return_mean"]) >= THRESHOLD]
    assert reached, f"best return_mean {max(float(r['return_mean']) for r in rows)} after {rows[-1]['env_steps']} steps"
    assert int(reached[0]["env_steps"]) < BUDGET_STEPS
