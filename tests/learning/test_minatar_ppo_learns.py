"""PPO with the package's MinAtar preset (MinAtar's CNN, 8 envs x 128 steps) reaches MinAtar Breakout's published
level, a training mean of 10, within 3M env steps (minutes on 2 cores: marked slow).

The level is MinAtar's paper's (Young and Tian 2019, the learning curves in kenjyoung/MinAtar's README): DQN and
AC(0.8) at about 10 after 1M frames of this env. The preset stays near 6 for a while in most seeds before it
climbs; seeds 0, 1 and 2 first reached 10 at 2.11M, 1.18M and 1.01M steps (docs/pixels.md).
"""

from __future__ import annotations

import pytest
from extras import skip_without
from runs import first_row_reaching, flare2_train

pytestmark = [pytest.mark.learning, pytest.mark.slow]

PUBLISHED_LEVEL = 10
BUDGET_STEPS = 3_000_000


def test_ppo_with_its_minatar_preset_reaches_the_published_level_on_breakout(tmp_path, no_leftover_processes):
    skip_without("minatar", "minatar")
    rows = flare2_train(
        "ppo",
        "MinAtar/Breakout-v1",
        tmp_path,
        "--max-steps",
        str(BUDGET_STEPS),
        "--stop-return",
        str(PUBLISHED_LEVEL),
        "--seed",
        "1",
        timeout_s=2400,
    )
    first_row_reaching(rows, "return_mean", PUBLISHED_LEVEL, BUDGET_STEPS)
