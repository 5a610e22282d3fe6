"""DQN with 8 agents reaches a greedy CartPole-v1 return of 475 before 100k env steps (minutes: marked slow).

Greedy evaluation episodes (one after every training episode of each agent) judge it: the
mean over the last 20 of them must reach 475. In two runs of each, seeds 0, 1 and 2 did at
40-42k, 40-70k and 47-55k steps.
"""

from __future__ import annotations

import pytest
from runs import first_row_reaching, train

pytestmark = [pytest.mark.learning, pytest.mark.slow]


def test_dqn_with_eight_agents_solves_cartpole_by_greedy_evaluation_within_100k_steps(tmp_path, no_leftover_processes):
    rows = train(
        "cartpole_dqn.py",
        tmp_path,
        "--max-steps",
        "100000",
        "--eval-every",
        "1",
        "--stop-eval-return",
        "475",
        "--seed",
        "0",
    )
    first_row_reaching(rows, "eval_return_mean", 475, 100_000)
