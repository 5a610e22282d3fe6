"""TD3 with 8 agents reaches a Pendulum-v1 mean return of -200 before 50k env steps (minutes: marked slow)."""

from __future__ import annotations

import pytest
from runs import first_row_reaching, train

pytestmark = [pytest.mark.learning, pytest.mark.slow]


def test_td3_with_eight_agents_solves_pendulum_within_50k_steps(tmp_path, no_leftover_processes):
    rows = train("pendulum_td3.py", tmp_path, "--max-steps", "50000", "--stop-return", "-200", "--seed", "1")
    first_row_reaching(rows, "return_mean", -200, 50_000)
