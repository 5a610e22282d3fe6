"""PPO with 8 envs (one agent process) reaches a CartPole-v1 mean return of 475 before 100k env steps, with one learner and with two on CPU cores (about a minute each; marked slow: the default run trains the same preset through flare2.train)."""

from __future__ import annotations

import pytest
from runs import first_row_reaching, flare2_train, train

pytestmark = [pytest.mark.learning, pytest.mark.slow]


def test_ppo_with_eight_envs_solves_cartpole_within_100k_steps(tmp_path, no_leftover_processes):
    rows = train("cartpole_ppo.py", tmp_path, "--max-steps", "100000", "--stop-return", "475", "--seed", "1")
    first_row_reaching(rows, "return_mean", 475, 100_000)


def test_ppo_with_two_learners_on_cpu_cores_solves_cartpole_within_100k_steps(tmp_path, no_leftover_processes):
    rows = flare2_train(
        "ppo",
        "CartPole-v1",
        tmp_path,
        "--no-serial",
        "--learners",
        "2",
        "--max-steps",
        "100000",
        "--stop-return",
        "475",
    )
    first_row_reaching(rows, "return_mean", 475, 100_000)
