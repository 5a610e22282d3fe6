"""Tabular SARSA with 8 agents finds a path of at most 17 steps on CliffWalking-v1 (seconds; runs by default).

The threshold is on greedy evaluation episodes: the mean return of the last
20 must reach -17 (the safe path along the top; the shortest is -13).
"""

from __future__ import annotations

import pytest
from runs import first_row_reaching, train

pytestmark = pytest.mark.learning


def test_sarsa_with_eight_agents_finds_a_short_cliffwalking_path_within_40k_steps(tmp_path, no_leftover_processes):
    rows = train(
        "cliffwalking_sarsa.py",
        tmp_path,
        "--max-steps",
        "40000",
        "--eval-every",
        "2",
        "--stop-eval-return",
        "-17",
        "--seed",
        "1",
        timeout_s=600,
    )
    first_row_reaching(rows, "eval_return_mean", -17, 40_000)
