"""The fixed players a policy's win rate is read against: legal moves only, and the lookahead's win or block."""

from __future__ import annotations

import numpy as np
import pytest

from flare2.core.board_players import Tactics, connect_four_lookahead, plays_connect_four, random_move
from flare2.errors import ConfigError


def board(mine: list[tuple[int, int]], theirs: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    """A connect four observation: the mover's pieces and the opponent's, row 5 at the bottom; full columns masked."""
    planes = np.zeros((6, 7, 2), np.int8)
    for row, column in mine:
        planes[row, column, 0] = 1
    for row, column in theirs:
        planes[row, column, 1] = 1
    return {"observation": planes, "action_mask": (planes.sum(-1)[0] == 0).astype(np.int8)}


def test_the_lookahead_wins_when_it_can_and_blocks_a_win_of_the_opponent_otherwise():
    rng = np.random.default_rng(0)
    # Three of mine across the bottom (columns 1-3), three of theirs up column 6: dropping into column 0 or 4 wins.
    winning = board([(5, 1), (5, 2), (5, 3)], [(5, 6), (4, 6), (3, 6)])
    assert connect_four_lookahead(winning, rng) in (0, 4)
    # Without a win of mine, their three up column 6 are blocked at row 2.
    blocking = board([(5, 1), (5, 3)], [(5, 6), (4, 6), (3, 6)])
    assert connect_four_lookahead(blocking, rng) == 6
    # A diagonal of theirs, completed by a piece landing at (2, 3) on top of column 3's three.
    diagonal = board([(4, 3), (3, 3), (4, 0)], [(5, 0), (4, 1), (3, 2), (5, 3), (5, 1), (5, 2)])
    assert connect_four_lookahead(diagonal, rng) == 3


def test_tactics_count_the_wins_a_player_had_and_took_and_the_threats_it_had_to_block_and_blocked():
    winning = board([(5, 1), (5, 2), (5, 3)], [(5, 6), (4, 6), (3, 6)])  # wins at 0 or 4; their threat at 6
    blocking = board([(5, 1), (5, 3)], [(5, 6), (4, 6), (3, 6)])  # no win: their threat at 6
    quiet = board([(5, 1)], [(5, 6)])
    tactics = Tactics()
    for observation, move in [(winning, 4), (winning, 6), (blocking, 6), (blocking, 0), (blocking, 1), (quiet, 3)]:
        tactics.count(observation, move)
    # Blocking while a win of its own was there is a win missed, not a block.
    assert (tactics.wins, tactics.wins_taken, tactics.threats, tactics.threats_blocked) == (2, 1, 3, 1)
    assert tactics.describe() == (
        "took 1 of the 2 wins it had, blocked 1 of the 3 wins of the other side (where it had none to take)"
    )
    assert plays_connect_four("pettingzoo.classic.connect_four_v3") and not plays_connect_four("turn_games.corridor_v0")


def test_the_fixed_players_move_only_where_the_mask_allows():
    rng = np.random.default_rng(1)
    full = board([(row, 2) for row in range(6)], [])
    assert full["action_mask"][2] == 0
    moves = {random_move(full, rng) for _ in range(200)} | {connect_four_lookahead(full, rng) for _ in range(200)}
    assert 2 not in moves and moves <= set(range(7))


def test_the_lookahead_names_a_board_it_cannot_read():
    with pytest.raises(ConfigError, match="plays connect four"):
        connect_four_lookahead({"observation": np.zeros((3, 3, 2)), "action_mask": np.ones(3)}, np.random.default_rng())


def test_a_game_without_legal_move_masks_is_refused_naming_the_option():
    import gymnasium as gym

    from flare2.core.board_players import check_fixed_players_can_play

    board = gym.spaces.Box(0, 1, (6, 7, 2), np.int8)
    check_fixed_players_can_play(
        gym.spaces.Dict({"observation": board, "action_mask": gym.spaces.Box(0, 1, (7,), np.int8)}), "c4", "--against"
    )
    with pytest.raises(
        ConfigError, match=r"--eval-every: the fixed players read .* 'action_mask' .* leave --eval-every out"
    ):
        check_fixed_players_can_play(board, "tictac_v0", "--eval-every")


def test_the_careful_player_wins_and_blocks_as_the_lookahead_and_never_drops_a_piece_the_opponent_wins_on_top_of():
    from flare2.core.board_players import connect_four_careful

    rng = np.random.default_rng(2)
    winning = board([(5, 1), (5, 2), (5, 3)], [(5, 6), (4, 6), (3, 6)])
    assert connect_four_careful(winning, rng) in (0, 4)
    blocking = board([(5, 1), (5, 3)], [(5, 6), (4, 6), (3, 6)])
    assert connect_four_careful(blocking, rng) == 6
    # Theirs across row 4 (columns 1-3), on bottom pieces: a piece of mine in column 0 or 4 would land at row 5 and
    # let them win at row 4 on top of it.
    under_their_win = board([(5, 1), (5, 3)], [(5, 2), (4, 1), (4, 2), (4, 3)])
    moves = {connect_four_careful(under_their_win, rng) for _ in range(200)}
    assert moves and not moves & {0, 4}
    lookahead_moves = {connect_four_lookahead(under_their_win, rng) for _ in range(200)}
    assert lookahead_moves & {0, 4}  # the lookahead alone plays there at random
