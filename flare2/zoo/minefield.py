"""``flare2/Minefield-v0``: robots clear mines on a grid; a varying number of each, so the observation is ragged.

In the spirit of entity-gym's MineSweeper. Each episode places 1 to 3 robots
and 1 to 5 mines on an 8 × 8 grid. Every step:

- each robot moves (stay, up, down, left, right): one categorical action per
  robot entity, ``move`` (``Sequence(Discrete(5))``); a robot that steps onto
  a mine clears it;
- the cannon fires at one mine, chosen among the mines present: a
  select-entity action, ``fire`` (the index of a mine in this step's
  observation). It is ready every ``CANNON_PERIOD`` steps and clears the
  mine only if a robot stands next to it (Chebyshev distance 1): spotting
  pays, firing blind does not.

Each cleared mine gives 1 / (the mines placed), so a cleared field returns 1.
The episode ends (terminated) when no mine is left, or is cut (truncated)
after ``MAX_STEPS``. Observation (a Dict, Gymnasium's own types):

- ``robot``: ``Sequence(Box(0, 1, (2,)))``, each robot's (row, column) / 7;
- ``mine``: ``Sequence(Box(0, 1, (2,)))``, each mine's;
- ``cannon``: ``Box(0, 1, (1,))``, steps until the cannon is ready / period.

``flare2/Minefield-v1`` is the same game with the legal moves of each robot
in its observation, ``move_mask`` (``Sequence(MultiBinary(5))``, one mask per
robot, as entity-gym's per-actor masks): a robot on an edge cannot step off
the grid. A move the mask forbids keeps the robot where it is, as in v0, and
is counted in the step's ``info["illegal_moves"]``.

The ``metadata`` names the entity type each action acts on (``entity_actions``), so
that ``flare2 train --env flare2.zoo.minefield:flare2/Minefield-v1 --algo ppo``
builds the entity actor-critic for it (``flare2.zoo.entity``).

Imports no torch; registered on import, so ``gymnasium.make("flare2.zoo.minefield:flare2/Minefield-v0")`` works
from any process.
"""

from __future__ import annotations

from typing import Any, cast

import gymnasium as gym
import numpy as np

MINEFIELD = "flare2/Minefield-v0"
MINEFIELD_ENTRY = f"flare2.zoo.minefield:{MINEFIELD}"
MASKED_MINEFIELD = "flare2/Minefield-v1"

SIZE = 8
MAX_ROBOTS = 3
MAX_MINES = 5
MAX_STEPS = 30
CANNON_PERIOD = 4
# Stay, up, down, left, right, as (row, column) steps.
MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])


class Minefield(gym.Env):
    """See the module docstring."""

    metadata = {"render_modes": [], "entity_actions": {"move": "robot", "fire": "mine"}}

    def __init__(self) -> None:
        position = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                "robot": gym.spaces.Sequence(position),
                "mine": gym.spaces.Sequence(position),
                "cannon": gym.spaces.Box(0.0, 1.0, (1,), np.float32),
            }
        )
        self.action_space = gym.spaces.Dict(
            {
                "move": gym.spaces.Sequence(gym.spaces.Discrete(len(MOVES))),
                "fire": gym.spaces.Discrete(MAX_MINES),
            }
        )
        self.robots = np.zeros((0, 2), np.int64)
        self.mines = np.zeros((0, 2), np.int64)
        self.placed = 1
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        robots = self.np_random.integers(1, MAX_ROBOTS + 1)
        mines = self.np_random.integers(1, MAX_MINES + 1)
        # Distinct cells for everything, so no mine starts under a robot.
        cells = self.np_random.choice(SIZE * SIZE, size=robots + mines, replace=False)
        positions = np.stack([cells // SIZE, cells % SIZE], axis=1)
        self.robots, self.mines = positions[:robots], positions[robots:]
        self.placed, self.steps = int(mines), 0
        return self._observation(), {}

    def step(self, action: dict[str, Any]) -> tuple[dict, float, bool, bool, dict]:
        moves = np.asarray(action["move"], np.int64).reshape(-1)[: len(self.robots)]
        # A robot without a move (a sampled action of another length) stays.
        steps = np.zeros_like(self.robots)
        steps[: len(moves)] = MOVES[np.clip(moves, 0, len(MOVES) - 1)]
        self.robots = np.clip(self.robots + steps, 0, SIZE - 1)
        cleared = self._clear(
            np.array([any((robot == mine).all() for robot in self.robots) for mine in self.mines], bool)
        )
        target = int(action["fire"])
        if self.steps % CANNON_PERIOD == CANNON_PERIOD - 1 and target < len(self.mines):
            spotted = np.abs(self.robots - self.mines[target]).max(axis=1).min() <= 1
            if spotted:
                hit = np.zeros(len(self.mines), bool)
                hit[target] = True
                cleared += self._clear(hit)
        self.steps += 1
        terminated = len(self.mines) == 0
        truncated = not terminated and self.steps >= MAX_STEPS
        return self._observation(), cleared / self.placed, terminated, truncated, {}

    def _clear(self, hit: np.ndarray) -> int:
        self.mines = self.mines[~hit] if hit.size else self.mines
        return int(hit.sum())

    def _observation(self) -> dict[str, Any]:
        scale = np.float32(1 / (SIZE - 1))
        return {
            "robot": tuple(self.robots.astype(np.float32) * scale),
            "mine": tuple(self.mines.astype(np.float32) * scale),
            "cannon": np.array([(CANNON_PERIOD - 1 - self.steps % CANNON_PERIOD) / CANNON_PERIOD], np.float32),
        }


class MaskedMinefield(Minefield):
    """Minefield with each robot's legal moves in its observation (``move_mask``); the step's ``info`` counts the
    moves the masks forbade (``illegal_moves``)."""

    def __init__(self) -> None:
        super().__init__()
        parts = dict(cast(gym.spaces.Dict, self.observation_space).spaces)
        parts["move_mask"] = gym.spaces.Sequence(gym.spaces.MultiBinary(len(MOVES)))
        self.observation_space = gym.spaces.Dict(parts)

    def step(self, action: dict[str, Any]) -> tuple[dict, float, bool, bool, dict]:
        moves = np.asarray(action["move"], np.int64).reshape(-1)[: len(self.robots)]
        legal = self._legal()[np.arange(len(moves)), np.clip(moves, 0, len(MOVES) - 1)]
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated, truncated, {**info, "illegal_moves": int((~legal).sum())}

    def _legal(self) -> np.ndarray:
        """Each robot's legal moves: those that keep it on the grid."""
        after = self.robots[:, None, :] + MOVES[None, :, :]
        return ((after >= 0) & (after < SIZE)).all(axis=-1)

    def _observation(self) -> dict[str, Any]:
        return {**super()._observation(), "move_mask": tuple(self._legal().astype(np.int8))}


for _id, _entry in ((MINEFIELD, "Minefield"), (MASKED_MINEFIELD, "MaskedMinefield")):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=f"flare2.zoo.minefield:{_entry}")
