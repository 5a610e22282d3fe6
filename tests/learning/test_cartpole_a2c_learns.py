"""A2C with 8 envs (one agent process) reaches a CartPole-v1 mean return of 475 before 500k env steps (minutes: marked slow)."""

from __future__ import annotations

import pytest
from runs import first_row_reaching, train

pytestmark = [pytest.mark.learning, pytest.mark.slow]


def test_a2c_with_eight_envs_solves_cartpole_within_500k_steps(tmp_path, no_leftover_processes):
    rows = train("cartpole_a2c.py", tmp_path, "--max-steps", "500000", "--stop-return", "475", "--seed", "1")
    first_row_reaching(rows, "return_mean", 475, 500_000)
