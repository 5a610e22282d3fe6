"""Fixed players of turn-based board games, the baselines a trained policy's win rate is read against
(``flare2 eval --against``). Each takes the observation of the seat it plays (PettingZoo's classic games:
``observation`` and ``action_mask``) and a random generator, and returns its move. Imports no torch.

- ``random``: a legal move, uniformly;
- ``lookahead`` (connect four): the one-step lookahead player, which wins now if a move does, else blocks a
  column where the opponent would win with its next move, else moves at random;
- ``careful`` (connect four): the lookahead, which also never moves at random into a column where the piece it
  drops lets the opponent win on top of it (where another move is left). It reads one move further, and connect
  four's preset spars with the lookahead alone (``--self-play-sparring``): it is the yardstick that preset's
  policies have never played in training.

Each also plays as a sparring partner of self-play's learner (``flare2.core.pettingzoo_agent``).

``Tactics`` counts how a policy's own connect four moves met what the lookahead reads: the wins it could take,
the wins of the other side it had to block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.errors import ConfigError

ROWS, COLUMNS, IN_A_ROW = 6, 7, 4
_DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


def check_fixed_players_can_play(observation_space: gym.Space, env_id: str, option: str) -> None:
    """The fixed players read each turn's legal moves from PettingZoo's ``action_mask`` beside the ``observation``:
    a ConfigError naming ``option`` for a game whose observations do not carry them."""
    if not (isinstance(observation_space, gym.spaces.Dict) and "action_mask" in observation_space.spaces):
        raise ConfigError(
            f"{option}: the fixed players read each turn's legal moves from an 'action_mask' beside the "
            f"'observation' (as PettingZoo's classic games give them), and {env_id!r} gives none: leave {option} out"
        )


def random_move(observation: dict[str, Any], rng: np.random.Generator) -> int:
    """A legal move, uniformly."""
    return int(rng.choice(np.flatnonzero(observation["action_mask"])))


def connect_four_lookahead(observation: dict[str, Any], rng: np.random.Generator) -> int:
    """Win now if a move does; else block a column where the opponent would win next; else a random legal move."""
    tactic = _win_or_block(observation)
    return tactic if tactic is not None else int(rng.choice(np.flatnonzero(observation["action_mask"])))


def connect_four_careful(observation: dict[str, Any], rng: np.random.Generator) -> int:
    """The lookahead's win or block; else a random legal move after which the opponent cannot win by dropping a
    piece on top of it (a random legal move where every move would let it)."""
    tactic = _win_or_block(observation)
    if tactic is not None:
        return tactic
    board = np.asarray(observation["observation"]).astype(bool)
    mine, theirs = board[..., 0], board[..., 1]
    legal = [int(column) for column in np.flatnonzero(observation["action_mask"])]
    safe = []
    for column in legal:
        taken = mine | theirs
        row = int(np.flatnonzero(~taken[:, column]).max())
        taken[row, column] = True
        if not _completes_four(theirs, taken, column):
            safe.append(column)
    return int(rng.choice(safe or legal))


def _win_or_block(observation: dict[str, Any]) -> int | None:
    """The lookahead's move where it reads one: a column that wins now, else one that blocks the opponent's win."""
    wins, blocks = immediate_fours(observation)
    return (wins or blocks)[0] if wins or blocks else None


def immediate_fours(observation: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The legal columns where the mover's piece makes four now, and those where the opponent's would (to block).
    The board is PettingZoo's connect four observation: ``[6, 7, 2]``, the mover's pieces then the opponent's, row
    0 at the top."""
    board = np.asarray(observation["observation"])
    if board.shape != (ROWS, COLUMNS, 2):
        raise ConfigError(f"the lookahead player plays connect four (a [6, 7, 2] board), got a board of {board.shape}")
    mine, theirs = board[..., 0].astype(bool), board[..., 1].astype(bool)
    legal = [int(column) for column in np.flatnonzero(observation["action_mask"])]
    return (
        [column for column in legal if _completes_four(mine, mine | theirs, column)],
        [column for column in legal if _completes_four(theirs, mine | theirs, column)],
    )


@dataclass
class Tactics:
    """How a connect four player met the two things the lookahead never misses, over the moves ``count`` saw: a win
    it had (``wins``), taken or not; and, where it had none, a win the other side had (``threats``), blocked or not."""

    wins: int = 0
    wins_taken: int = 0
    threats: int = 0
    threats_blocked: int = 0

    def count(self, observation: dict[str, Any], move: int) -> None:
        wins, blocks = immediate_fours(observation)
        if wins:
            self.wins += 1
            self.wins_taken += move in wins
        elif blocks:
            self.threats += 1
            self.threats_blocked += move in blocks

    def describe(self) -> str:
        return (
            f"took {self.wins_taken} of the {self.wins} wins it had, blocked {self.threats_blocked} of the "
            f"{self.threats} wins of the other side (where it had none to take)"
        )


def _completes_four(pieces: np.ndarray, taken: np.ndarray, column: int) -> bool:
    """Whether a piece dropped into ``column`` (onto ``taken`` cells) makes four of ``pieces`` in a row."""
    empty = np.flatnonzero(~taken[:, column])
    if not empty.size:
        return False
    row = int(empty.max())
    for dr, dc in _DIRECTIONS:
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < ROWS and 0 <= c < COLUMNS and pieces[r, c]:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= IN_A_ROW:
            return True
    return False


PLAYERS: dict[str, Callable[[dict[str, Any], np.random.Generator], int]] = {
    "random": random_move,
    "lookahead": connect_four_lookahead,
    "careful": connect_four_careful,
}
"""The fixed players by the name ``flare2 eval --against`` takes."""

_GAME_PLAYERS = {"connect_four": ("random", "lookahead", "careful")}
"""The players of the games that have more than random play, by a part of their PettingZoo module's name."""


def plays_connect_four(env_id: str) -> bool:
    """Whether ``env_id`` (a PettingZoo module) is connect four, whose moves ``Tactics`` reads."""
    return env_id.rpartition(".")[2].startswith("connect_four")


def baselines(env_id: str) -> tuple[str, ...]:
    """The fixed players that game ``env_id`` (a PettingZoo module) is played against: random play for any game, and
    the game's scripted player where there is one."""
    game = env_id.rpartition(".")[2]
    return next((players for name, players in _GAME_PLAYERS.items() if game.startswith(name)), ("random",))
