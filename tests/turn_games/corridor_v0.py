"""Corridor: ``runner_0`` and ``runner_1`` take turns, 3 moves each; at every turn one of 7 moves is legal (the
``action_mask`` of the observation marks it, the ``observation`` says whose turn it is and the turn's number), and an
illegal move raises. The last move (``runner_1``'s third) ends the game: ``runner_0`` earns +1, ``runner_1`` -1.

The AEC API as PettingZoo's classic games have it: ``last()`` gives the agent whose turn it is its reward since it
last moved, each agent that is done is stepped once with ``None``, and the game is over when ``agents`` is empty."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

TURNS = 6
MOVES = 7


class IllegalMove(Exception):
    pass


class Corridor:
    metadata = {"name": "corridor_v0"}
    possible_agents = ["runner_0", "runner_1"]

    def __init__(self) -> None:
        self.agents: list[str] = []
        self.moves: list[tuple[str, int]] = []

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Dict(
            {
                "observation": gym.spaces.Box(0.0, 10.0, (2,), np.float32),
                "action_mask": gym.spaces.Box(0, 1, (MOVES,), np.int8),
            }
        )

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(MOVES)

    def legal(self) -> int:
        return (self.t * 3 + self.offset) % MOVES

    def reset(self, seed=None, options=None) -> None:
        self.offset = 0 if seed is None else seed % MOVES
        self.agents, self.t = list(self.possible_agents), 0
        self.agent_selection = self.agents[0]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        mask = np.zeros(MOVES, np.int8)
        if not self.terminations[agent]:
            mask[self.legal()] = 1
        return {"observation": np.array([self.possible_agents.index(agent), self.t], np.float32), "action_mask": mask}

    def last(self):
        agent = self.agent_selection
        return self.observe(agent), self._cumulative[agent], self.terminations[agent], self.truncations[agent], {}

    def agent_iter(self):
        while self.agents:
            yield self.agent_selection

    def step(self, action) -> None:
        agent = self.agent_selection
        self.rewards = dict.fromkeys(self.agents, 0.0)
        if self.terminations[agent] or self.truncations[agent]:
            assert action is None, "an agent that is done is stepped with None"
            self.agents.remove(agent)
            self._cumulative.pop(agent)
            if self.agents:
                self.agent_selection = self.agents[0]
            return
        if int(action) != self.legal():
            raise IllegalMove(f"{agent} moved {action} at turn {self.t}; the legal move was {self.legal()}")
        self.moves.append((agent, int(action)))
        self._cumulative[agent] = 0.0
        self.t += 1
        if self.t == TURNS:
            self.rewards = {"runner_0": 1.0, "runner_1": -1.0}
            self.terminations = dict.fromkeys(self.agents, True)
        for name, reward in self.rewards.items():
            self._cumulative[name] += reward
        self.agent_selection = self.agents[1 - self.agents.index(agent)] if len(self.agents) == 2 else agent

    def close(self) -> None:
        pass


def env() -> Corridor:
    return Corridor()
