"""Connect four by self-play PPO with the package's preset (legal-move masks, a pool of past copies, half of the
training games against the one-step lookahead as a sparring partner): after the preset's budget, greedy games
won against random play, the lookahead and the careful player (which no training game is played against).

The targets are the ones the project set itself (docs/results.md: connect four by self-play): 90 % of the games
against random play and 60 % against the lookahead; the careful player reads one move further than the lookahead
and is reported beside them. Minutes on 2 cores: marked slow.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from extras import skip_without
from runs import flare2_train

pytestmark = [pytest.mark.learning, pytest.mark.slow]

GAMES = 200


def won(run_dir, player: str) -> float:
    """The policy's greedy win rate over GAMES games against ``player`` (``flare2 eval --against``)."""
    played = subprocess.run(
        [sys.executable, "-m", "flare2.cli", "eval", str(run_dir), "--episodes", str(GAMES), "--against", player],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert played.returncode == 0, played.stderr[-4000:]
    line = re.search(rf"against {player}: won (\d+), drew \d+, lost \d+ of {GAMES}", played.stdout)
    assert line, played.stdout
    return int(line.group(1)) / GAMES


def test_self_play_ppo_with_its_preset_beats_random_play_and_the_lookahead(tmp_path, no_leftover_processes):
    skip_without("pettingzoo", "pettingzoo")
    flare2_train("ppo", "pettingzoo.classic.connect_four_v3", tmp_path, "--seed", "0", timeout_s=2400)
    rates = {player: won(tmp_path, player) for player in ("random", "lookahead", "careful")}
    assert rates["random"] >= 0.9 and rates["lookahead"] >= 0.6, rates
