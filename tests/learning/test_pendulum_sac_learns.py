"""SAC with the package's Pendulum-v1 preset (rl-baselines3-zoo's settings, 8 agents) plays a greedy mean return of
-200 before 20k env steps (minutes: marked slow).

Greedy evaluation episodes (one after every training episode of each agent) judge it, as a deterministic
evaluation gives rl-baselines3-zoo's -157 at 20k (benchmark.md): the training return_mean, over the last 100 episodes, cannot
show it, since 100 Pendulum episodes are 20k steps, every episode of the run, the random ones of the start included.
"""

from __future__ import annotations

import pytest
from runs import first_row_reaching, flare2_train

pytestmark = [pytest.mark.learning, pytest.mark.slow]


def test_sac_with_its_pendulum_preset_plays_a_greedy_return_of_minus_200_within_20k_steps(
    tmp_path, no_leftover_processes
):
    rows = flare2_train(
        "sac", "Pendulum-v1", tmp_path, "--eval-every", "1", "--stop-eval-return", "-200", "--seed", "0"
    )
    first_row_reaching(rows, "eval_return_mean", -200, 20_000)
